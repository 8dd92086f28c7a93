"""Which venues have live workers, and how loaded they are."""

from __future__ import annotations

import os
from typing import Any

import redis

from frlm_web import presence
from workers.models import venue_queue


def presence_group(venue: str) -> str:
    return f"venue:{venue}"


def live_workers(client: redis.Redis, venue: str) -> list[dict[str, Any]]:
    return presence.alive(client, presence_group(venue))


def capacity(client: redis.Redis, venue: str) -> int:
    """Concurrent sub-query slots of the venue's live workers."""
    return sum(int(w.get("concurrency", 1)) for w in live_workers(client, venue))


def queued(client: redis.Redis, venue: str) -> int:
    """Jobs waiting in the venue's Celery queue (kombu keeps a Redis list per queue)."""
    return int(client.llen(venue_queue(venue)))


def this_worker() -> tuple[str, str] | None:
    """(venue, worker name) of this process, as told by frlm_worker."""
    venue = os.environ.get("FRLM_VENUE")
    if not venue:
        return None
    return venue, os.environ.get("FRLM_PRESENCE_NAME", f"{venue}-{os.getpid()}")
