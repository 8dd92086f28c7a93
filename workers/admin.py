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
    actions = ["revoke", "revoke_and_deregister"]

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

    # A token is the right to join: revoked, nobody joins with it again (nor registers
    # again after a restart). The workers it let in keep working until they are
    # deregistered, which the second action does with it, for a token that leaked: they
    # are told at their next heartbeat and get no more work. The first action says how
    # many stay, so an operator does not take a revoke for a cut-off (a review).
    @admin.action(
        description="Revoke the selected tokens (the workers they let in stay)",
        permissions=["change"],
    )
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        revoked, tokens = _revoked(queryset)
        staying = _enrolled(tokens)
        online = staying.filter(status=Worker.Status.ACTIVE).count()
        lost = staying.count() - online
        message = f"{revoked} token(s) revoked: nobody can join or register again with them."
        if online or lost:
            # Said apart: lost ones were counted as working (a review).
            message += (
                f" {online} worker(s) that joined with them still work"
                + (f" and {lost} lost one(s) may come back" if lost else "")
                + "; to cut them off too, use 'Revoke the selected tokens and deregister the "
                "workers they let in'."
            )
        messages.success(request, message)

    @admin.action(
        description="Revoke the selected tokens and deregister the workers they let in",
        permissions=["change"],
    )
    def revoke_and_deregister(self, request: HttpRequest, queryset: Any) -> None:
        from workers import services

        revoked, tokens = _revoked(queryset)
        workers = list(_enrolled(tokens).select_related("venue"))
        for worker in workers:
            services.worker_deregister(worker)
        messages.success(
            request,
            f"{revoked} token(s) revoked and {len(workers)} worker(s) that joined with them "
            "deregistered: each is told at its next heartbeat and gets no more work.",
        )


def _revoked(queryset: Any) -> tuple[int, list[int]]:
    """Revoke the tokens: how many, and their keys, taken first: the queryset carries the
    list's filters ("Revoked: No"), and run again after the update it found none of them
    (a review)."""
    tokens = list(queryset.values_list("pk", flat=True))
    return queryset.update(revoked=True), tokens


def _enrolled(tokens: list[int]) -> Any:
    """The workers these tokens (their keys) let in that are not deregistered."""
    return Worker.objects.filter(token_id__in=tokens).exclude(status=Worker.Status.DEREGISTERED)


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
