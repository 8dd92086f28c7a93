"""Reads of runs for the rest of the project: who may see which runs (`visible_runs`: its
owner, or staff; runs made by the CLI have no owner: staff only), and the few figures
other apps' pages need of them.

Apps that must not import runs (traces, workers) get these from the URLconf and the
WebSocket routing, which pass them to their views and consumers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from runs.models import Experiment, Run


def visible_runs(user: Any) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    if user.is_staff:
        return Run.objects.all()
    return Run.objects.filter(owner=user)


def run_visible(user: Any, run_id: str) -> bool:
    """The trace API's and the live socket's access rule (passed to them by the URLconf)."""
    return visible_runs(user).filter(id=run_id).exists()


def run_context_path(run_id: str) -> str | None:
    """The file or folder a run's context was read from (the worker gateway serves
    fragments of it and of the context store only)."""
    return Run.objects.filter(id=run_id).values_list("context_path", flat=True).first()


def recent_run_ids(
    user: Any, *, since: datetime, limit: int, running_limit: int
) -> tuple[list[str], list[str]]:
    """Of the runs `user` may see created since `since`: the latest `limit` ids, newest
    first, and up to `running_limit` ids of those still running (the worker pages' health
    figures come from these runs' traces). Not imported runs: what their workers did was
    done elsewhere or before, and a run exported and imported again counted its workers'
    calls twice (a review)."""
    runs = visible_runs(user).filter(created__gte=since).exclude(context_source=Run.Source.IMPORTED)
    recent = list(runs.order_by("-created").values_list("id", flat=True)[:limit])
    running = list(
        runs.filter(status=Run.Status.RUNNING).values_list("id", flat=True)[:running_limit]
    )
    return recent, running


def run_started_bounds(run_ids: list[str]) -> tuple[datetime, datetime] | None:
    """When the earliest of these runs started and the latest ended (now, for one still
    going); None when none of them has started."""
    runs = Run.objects.filter(id__in=run_ids).exclude(started=None)
    starts = [r.started for r in runs]
    ends = [r.finished or timezone.now() for r in runs]
    if not starts:
        return None
    return min(starts), max(ends)


def visible_experiments(user: Any) -> QuerySet[Experiment]:
    """Experiments as runs: its creator's, and staff see all."""
    if not user.is_authenticated:
        return Experiment.objects.none()
    if user.is_staff:
        return Experiment.objects.all()
    return Experiment.objects.filter(created_by=user)
