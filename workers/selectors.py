"""Reads of registered workers for pages that show them by name (the run page's waterfall,
span panel and views, the venues history): one name per worker everywhere, the id kept for
hover and links."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from workers.models import Worker

NAMES_LIMIT = 2_000  # ids in one look-up: a run's whole swarm, not the whole table


class WorkerName(TypedDict):
    name: str  # the name it registered (edge-edge-1), unique per venue while registered
    venue: str
    departed: bool  # lost or deregistered: it no longer takes work


def worker_names(ids: Iterable[str], *, active: bool = False) -> dict[str, WorkerName]:
    """{id: {name, venue, departed}} for the given worker ids that are registered; with
    `active`, every worker that takes work now as well (a live run's next sub-queries go
    to them before the page has seen their ids)."""
    wanted = sorted({i for i in ids if i})[:NAMES_LIMIT]
    query = Worker.objects.filter(id__in=wanted)
    if active:
        query = query | Worker.objects.filter(status=Worker.Status.ACTIVE)
    rows = query.select_related("venue").values_list("id", "name", "venue__name", "status")
    return {
        wid: {"name": name, "venue": venue, "departed": status != Worker.Status.ACTIVE}
        for wid, name, venue, status in rows[:NAMES_LIMIT]
    }
