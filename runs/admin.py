from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from runs.models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "question", "subqueries", "cost", "wall_ms", "created")
    list_filter = ("status", "context_source")
    search_fields = ("id", "question", "answer")
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A run is launched (the launcher, frlm_run, the API), never typed in: every field
        # here is read-only, and "Add run" saved an empty row, a 500 (a review).
        return False
