"""A private FRLM instance for a benchmark: its own Redis, model server, database and
workers, on free ports, torn down at the end."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "frlm_web.settings_isolated"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from frlm_web.stack import Stack, VenueSpec  # noqa: E402

_leaving: list[int] = []  # the signal that asked the bench to stop, once one did


def stop_on_signals() -> None:
    """SIGTERM and SIGINT unwind the bench's `with` and `try` blocks, which stop what they
    started (its private stack, namespaces, extra workers): a bench killed by a timeout or
    Ctrl-C leaves nothing running. Library code that catches BaseException can swallow the
    SystemExit (seen once mid-run: the bench polled on with its stack up), so the bench's
    waiting loops also ask `stop_requested` and leave again."""

    def leave(signum: int, _frame: object) -> None:
        _leaving.append(signum)
        # A second signal (an impatient Ctrl-C, a timeout's follow-up TERM) must not cut
        # the teardown that the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)


def stop_requested() -> None:
    """Leave (SystemExit) if a signal asked the bench to stop and it is still going."""
    if _leaving:
        raise SystemExit(128 + _leaving[0])


def stack_cpu_s(stack: Stack) -> dict[str, float]:
    """CPU seconds used so far by each of the stack's processes and their children (Linux
    /proc): what the run costs whatever else the machine is doing."""
    groups = {proc.popen.pid: name for name, proc in stack.procs.items() if proc.popen is not None}
    ticks = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(groups.values(), 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        name = groups.get(int(fields[2]))  # its process group: each stack process leads one
        if name is not None:
            totals[name] += (int(fields[11]) + int(fields[12])) / ticks
    return totals


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


@contextmanager
def private_stack(
    venues: list[VenueSpec],
    *,
    trusted: set[str] | None = None,
    env: dict[str, str] | None = None,
    supervise: bool = False,
    persist: bool = False,
) -> Iterator[Stack]:
    """`trusted`: the venues to trust, when not the product's default (only `local`);
    `env`: settings for the stack's processes (FRLM_CELERY_EVENTS=1...);
    `supervise`: start again a process that dies (frlm_web/supervisor.py), as `make up`
    does; off by default, so a bench that kills a process on purpose sees it stay dead;
    `persist`: Redis keeps its append-only file, so a Redis killed mid-run comes back with
    its streams, queues and counters."""
    call_command("migrate", verbosity=0)
    from workers.models import Venue, venue_defaults

    for venue in venues:
        defaults = venue_defaults(venue.name)
        if trusted is not None:
            defaults["trusted"] = venue.name in trusted
        Venue.objects.get_or_create(name=venue.name, defaults=defaults)
    stack = Stack(
        state_dir=Path(settings.DATA_DIR) / "stack",
        venues=venues,
        env={
            "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
            "FRLM_DB_PATH": str(settings.DATABASES["default"]["NAME"]),
            **(env or {}),
        },
        start_redis=True,
        redis_persist=persist,
    )
    try:
        # Generous: a swarm of many worker processes starts slowly on a busy machine.
        stack.start(timeout=float(os.environ.get("FRLM_BENCH_START_S", "300")), supervise=supervise)
        yield stack
    finally:
        stack.stop()


def run_to_end(
    question: str, *, venues: list[str], policy: dict | None = None, timeout: float = 900
) -> object:
    from runs.models import Run
    from runs.services import ContextSpec, run_create, run_launch
    from workers.backends import model_spec

    run = run_create(
        question=question,
        context=ContextSpec(text="benchmark"),
        policy=policy,
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=venues,
    )
    run_launch(run)  # outside a transaction: enqueued at once
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stop_requested()
        run = Run.objects.get(id=run.id)
        if run.done:
            return run
        time.sleep(0.05)
    raise TimeoutError(f"run {run.id} did not finish in {timeout} s")
