from __future__ import annotations

from django.contrib import admin

from workers.models import Venue


@admin.register(Venue)
class VenueAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "description", "created")
    search_fields = ("name",)
