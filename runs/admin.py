from __future__ import annotations

from django.contrib import admin

from runs.models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "question", "subqueries", "cost", "wall_ms", "created")
    list_filter = ("status", "context_source")
    search_fields = ("id", "question", "answer")
    readonly_fields = [f.name for f in Run._meta.fields]
