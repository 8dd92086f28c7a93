"""Runs whose conductor died, found by its presence: a run claimed by a conductor that
dies before it takes the lease, or one whose lease entry was lost with a Redis that kept no
AOF. A conductor that starts, and a CLI waiting on a run, fail them with the reason; the
lease (runs/lease.py) is what fails them within seconds."""

from __future__ import annotations

import logging
import time

from frlm_web import presence
from frlm_web.redis_client import get_redis
from runs.lease import LEASES_KEY, run_abandon
from runs.models import Run

log = logging.getLogger(__name__)

CONDUCTOR_GROUP = "conductor"
# A conductor counts as gone only when its presence expired this long ago: a live one whose
# heartbeat thread is starved for a few seconds on a busy machine must not lose its runs.
GONE_AFTER_S = 15.0


def conductor_gone(tag: str) -> bool:
    """Whether the conductor process a run names ("name:pid") is gone: its entry expired
    long ago, or another process (a restart) announces under its name."""
    name, _, pid = tag.rpartition(":")
    found = presence.entry(get_redis(), CONDUCTOR_GROUP, name)
    if found is None:
        return True
    expires, info = found
    return expires < time.time() - GONE_AFTER_S or str(info.get("pid")) != pid


def orphan_message(conductor: str) -> str:
    return (
        f"its conductor {conductor or '(unknown)'} stopped while running it; the trace up to "
        "that point is kept; run it again, or `frlm_replay` it from a turn"
    )


def runs_fail_orphaned() -> int:
    """Fail every running run whose conductor process is gone. Conductors call this as they
    start, so a crashed one's runs are failed when it (or another) comes back."""
    failed = 0
    client = get_redis()
    for run in Run.objects.filter(status=Run.Status.RUNNING):
        if not conductor_gone(run.conductor):
            continue
        client.zrem(LEASES_KEY, run.id)
        # Conditional inside: a run that finished in the meantime keeps its real outcome.
        failed += run_abandon(client, run.id, orphan_message(run.conductor), by="orphan check")
    if failed:
        log.warning("failed %d run(s) whose conductor had stopped", failed)
    return failed
