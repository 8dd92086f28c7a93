"""Runs whose conductor died: they would stay `running` forever. A conductor that starts,
and a CLI waiting on a run, fail them with the reason."""

from __future__ import annotations

import logging
import time

from django.utils import timezone

from frlm_web import presence
from frlm_web.redis_client import get_redis
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
    for run in Run.objects.filter(status=Run.Status.RUNNING):
        if not conductor_gone(run.conductor):
            continue
        # Conditional: a run that finished in the meantime keeps its real outcome.
        failed += Run.objects.filter(id=run.id, status=Run.Status.RUNNING).update(
            status=Run.Status.FAILED, error=orphan_message(run.conductor), finished=timezone.now()
        )
    if failed:
        log.warning("failed %d run(s) whose conductor had stopped", failed)
    return failed
