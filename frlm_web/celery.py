"""The Celery application: the distributed engine behind conductors and venue workers."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "frlm_web.settings")


class CelerySettings(Mapping[str, Any]):
    """Django's CELERY_* settings under Celery's own names (CELERY_BROKER_URL ->
    broker_url), read from Django's settings once, when Celery first asks.

    Celery looks settings up for every message it sends or receives. Handed Django's
    settings object itself (config_from_object("django.conf:settings", namespace=...)),
    each lookup of a setting left at Celery's default fails on it twice, raising and
    catching an AttributeError each time. A plain mapping answers the same at dictionary
    speed: sending a sub-query took 225 us of CPU that way, 185 us this way."""

    PREFIX = "CELERY_"

    def __init__(self) -> None:
        self._data: dict[str, Any] | None = None

    def _settings(self) -> dict[str, Any]:
        if self._data is None:
            from django.conf import settings

            data = {
                name.removeprefix(self.PREFIX).lower(): getattr(settings, name)
                for name in dir(settings)
                if name.startswith(self.PREFIX)
            }
            data.setdefault("timezone", settings.TIME_ZONE)
            self._data = data
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._settings()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings())

    def __len__(self) -> int:
        return len(self._settings())


app = Celery("frlm_web")
app.config_from_object(CelerySettings())
app.autodiscover_tasks()

_presence = None


@worker_ready.connect
def _announce(**_: object) -> None:
    global _presence
    from frlm_web import presence
    from frlm_web.redis_client import get_redis

    _presence = presence.from_environment(get_redis())
    if _presence is not None:
        # Announced before the other worker_ready handlers run: a restarted conductor's
        # orphan check (runs.tasks) tells a dead predecessor from itself by this entry's
        # pid, and the thread's first beat could otherwise come after that check.
        _presence.beat()
        _presence.start()


def _settle_collector(**_: object) -> None:
    from frlm_web import collector

    collector.settle()


@worker_shutdown.connect
def _withdraw(**_: object) -> None:
    if _presence is not None:
        _presence.stop()


def _no_backend_to_mark(record: logging.LogRecord) -> bool:
    """Drop Celery's warning that a revoked task could not be marked in the result backend:
    FRLM has none (its jobs' results travel in the run's stream), so a worker said it once
    per revoked job, some 400 lines for one run's cancel (a review)."""
    return not (
        record.msg == "Failed to mark task %s as revoked in backend: %s"
        and isinstance(record.args, tuple)
        and len(record.args) == 2
        and "No result backend" in str(record.args[1])
    )


def run_worker(
    *,
    queue: str,
    concurrency: int,
    name: str,
    group: str | None,
    info: dict,
    at_most_once: bool = False,
    prefetch: int = 1,
) -> None:
    """Run a Celery worker in this process on `queue` (comma-separated for several) that
    announces itself in a presence group (None: the caller announces it, as the worker
    runtime does with its heartbeats). Threads: the work waits on I/O (models, Redis),
    not on this CPU. `at_most_once` drops
    kombu's ack emulation (two Redis pipelines per message) where the sender redelivers
    lost work itself, as the conductor does for sub-queries."""
    import json

    if at_most_once:
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "ack_emulation": False,
        }
    logging.getLogger("celery.worker.control").addFilter(_no_backend_to_mark)
    # Once Celery has started (its pool, its consumer), what the process loaded is frozen
    # out of the collector's walks (frlm_web/collector.py).
    worker_ready.connect(_settle_collector, weak=False)
    if group is not None:
        os.environ["FRLM_PRESENCE_GROUP"] = group
        os.environ["FRLM_PRESENCE_NAME"] = name
        os.environ["FRLM_PRESENCE_INFO"] = json.dumps({**info, "concurrency": concurrency})
    app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            *monitoring_options(),
            "--prefetch-multiplier",
            str(prefetch),
            "-l",
            "WARNING",
        ]
    )


def monitoring_options() -> list[str]:
    """Celery's own events and heartbeats, for Flower, with FRLM_CELERY_EVENTS=1; off by
    default: FRLM's presence (frlm_web/presence.py) tells who is alive, and its trace tells
    what each task did."""
    from django.conf import settings

    if settings.FRLM_CELERY_EVENTS:
        return ["--task-events"]
    return ["--without-heartbeat"]
