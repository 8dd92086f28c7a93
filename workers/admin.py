from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from workers.models import EnrolmentToken, Venue, Worker


@admin.register(Venue)
class VenueAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "trusted", "description", "created")
    search_fields = ("name",)


class TokenForm(forms.ModelForm):
    ttl_hours = forms.FloatField(
        required=False, min_value=0.01, max_value=24 * 366, help_text="empty: never expires"
    )

    class Meta:
        model = EnrolmentToken
        fields = ("venue", "label")


@admin.register(EnrolmentToken)
class EnrolmentTokenAdmin(admin.ModelAdmin):
    """Tokens are made here, never edited: the plaintext is shown once, after saving."""

    list_display = ("__str__", "venue", "label", "created", "expires", "revoked")
    list_filter = ("venue", "revoked")
    actions = ["revoke"]

    def get_form(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = TokenForm
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return ("venue", "digest", "label", "created", "created_by", "expires")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        from workers import services  # Redis's client: loaded when an admin acts, not at setup

        ttl_hours = form.cleaned_data.get("ttl_hours")
        token, plaintext = services.token_create(
            form.cleaned_data["venue"],
            ttl=timedelta(hours=ttl_hours) if ttl_hours else None,
            label=form.cleaned_data.get("label") or "",
            user=request.user,
        )
        obj.pk, obj.digest = token.pk, token.digest
        obj._state.adding = False
        messages.warning(
            request,
            f"Enrolment token for venue {token.venue.name}, shown only now: {plaintext}",
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        queryset.update(revoked=True)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "venue", "status", "concurrency", "last_heartbeat")
    list_filter = ("venue", "status")
    search_fields = ("name", "id")
    actions = ["deregister"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers register themselves, with a token

    @admin.action(description="Deregister the selected workers")
    def deregister(self, request: HttpRequest, queryset: Any) -> None:
        from workers import services

        for worker in queryset.select_related("venue"):
            services.worker_deregister(worker)
