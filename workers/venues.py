"""Which venues have live workers, and how loaded they are."""

from __future__ import annotations

import os
from typing import TypedDict

import redis

from frlm_web import presence
from workers.models import venue_queue


class Link(TypedDict, total=False):
    """How a worker reaches the server: `broker` (it consumes Celery queues itself),
    `gateway` (one WebSocket to the web server, workers/gateway) or `http` (it beats over
    the worker API and nothing else: an untrusted venue's worker, refused the broker, takes
    no job that way), from which address, and the round trip the gateway last measured."""

    connection: str
    address: str
    rtt_ms: float
    # Less than its registered slots while the gateway holds it to less (its credit,
    # workers/gateway/credit.py): what routing may send it.
    concurrency: int


class LiveWorker(Link, total=False):
    """What a worker announces in its venue's presence group (frlm_web.presence) with each
    heartbeat; the scheduler chooses among these. The presence member name is worker_id."""

    worker_id: str  # workers.models.Worker.id
    name: str  # the presence member name: equal to worker_id for registered workers
    label: str  # the worker's own name, unique within its venue (Worker.name)
    venue: str
    queue: str  # worker.<worker_id>: the Celery queue this worker alone consumes
    concurrency: int
    models: list[str]  # model names served; [] serves any
    context_tokens: int
    price_in: str  # dollars per 1,000 tokens, a money string (frlm_web.money)
    price_out: str
    trusted: bool  # its venue is trusted (may validate others' work)
    inflight: int  # from the last heartbeat
    load: float  # inflight / concurrency, from the last heartbeat
    memory_mb: float
    latency_ms: float | None  # the worker's own recent median (None before its first)
    draining: bool  # shutting down: finishing what it holds; send it nothing new
    pid: int


HTTP_ONLY = "http"  # a Link's connection that takes no work


def presence_group(venue: str) -> str:
    return f"venue:{venue}"


def announced(client: redis.Redis, venue: str) -> list[LiveWorker]:
    """Every worker of the venue beating now, those that can take no work included."""
    return presence.alive(client, presence_group(venue))  # type: ignore[return-value]


def live_workers(client: redis.Redis, venue: str) -> list[LiveWorker]:
    """The venue's workers beating now that can take work: what routing, the launcher and
    capacity count. A worker that only beats over HTTP is not one (Link)."""
    return [w for w in announced(client, venue) if w.get("connection") != HTTP_ONLY]


def capacity(client: redis.Redis, venue: str) -> int:
    """Concurrent sub-query slots of the venue's live workers."""
    return sum(int(w.get("concurrency", 1)) for w in live_workers(client, venue))


def queued(client: redis.Redis, venue: str) -> int:
    """Jobs waiting in the venue's Celery queue (kombu keeps a Redis list per queue)."""
    return int(client.llen(venue_queue(venue)))


def this_worker() -> tuple[str, str] | None:
    """(venue, worker id) of this process, as told by frlm_worker."""
    venue = os.environ.get("FRLM_VENUE")
    if not venue:
        return None
    return venue, os.environ.get("FRLM_WORKER_ID") or os.environ.get(
        "FRLM_PRESENCE_NAME", f"{venue}-{os.getpid()}"
    )
