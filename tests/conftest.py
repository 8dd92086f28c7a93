"""Fixtures that run the real product: one stack of real processes (redis, the simulated
model server, the recorder, a conductor, venue workers) shared by the session."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.conf import settings

from frlm_web.stack import Stack, VenueSpec, free_port, web_proc
from tests.helpers import wait_until  # noqa: F401  (tests import it from here too)

if TYPE_CHECKING:
    from tests.swarm import Swarm

TEST_VENUES = [
    VenueSpec("local", concurrency=8, sim={"latency_ms": 20}, worker_name="local-t1"),
    VenueSpec("edge", concurrency=8, sim={"latency_ms": 40}, worker_name="edge-t1"),
]


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker) -> Iterator[Stack]:
    """The real process stack on this session's private ports and test database."""
    state = Path(settings.DATA_DIR) / "stack"
    env = {
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DB_PATH": settings.DATABASES["default"]["NAME"],
    }
    running = Stack(
        state_dir=state,
        venues=TEST_VENUES,
        env=env,
        start_redis=True,
        redis_persist=False,
        conductor_concurrency=4,
    )
    try:
        running.start()
    except Exception:
        running.stop()
        raise
    with django_db_blocker.unblock():
        from workers.models import Worker

        running.worker_rows = [  # type: ignore[attr-defined]
            {**row, "venue_name": name}
            for row, name in zip(
                Worker.objects.values(),
                Worker.objects.values_list("venue__name", flat=True),
                strict=True,
            )
        ]
    yield running
    running.stop()


@pytest.fixture(scope="session")
def web(stack: Stack) -> Iterator[str]:
    """daphne on a free port, started like the stack's own web process, with its env (the
    pages' tests and the workers' gateway tests share it)."""
    port = free_port()
    proc = web_proc(port)
    stack.launch(proc)
    stack.wait_ready(proc, 60)
    yield f"http://127.0.0.1:{port}"
    stack.kill("web", signal.SIGTERM)


@pytest.fixture
def sign_in_counts_cleared(stack: Stack) -> Iterator[None]:
    """No address or username starts with failed sign-ins counted, and none leaves with them
    (the stack's web server counts them in the same Redis, per 127.0.0.1)."""
    from frlm_web.redis_client import get_redis

    def clear() -> None:
        client = get_redis()
        for key in client.scan_iter("frlm:login:*"):
            client.delete(key)

    clear()
    yield
    clear()


@pytest.fixture
def venues(stack: Stack, transactional_db) -> list[str]:
    """The stack's venues as rows (a transactional test empties the tables after itself)."""
    from workers.models import Venue, Worker, venue_defaults

    # As registration makes them: `local` is trusted (its workers may validate others).
    for venue in stack.venues:
        Venue.objects.get_or_create(name=venue.name, defaults=venue_defaults(venue.name))
    # The stack's workers outlive each test's emptied tables: put their registrations back,
    # or the conductor could not check their signatures.
    rows = []
    for row in getattr(stack, "worker_rows", []):
        row = {**row, "token_id": None}
        name = row.pop("venue_name")
        venue, _ = Venue.objects.get_or_create(name=name, defaults=venue_defaults(name))
        row.pop("venue_id")
        rows.append(Worker(**row, venue=venue))
    Worker.objects.bulk_create(rows, ignore_conflicts=True)
    return [v.name for v in stack.venues]


@pytest.fixture
def context_root() -> Iterator[Path]:
    """A fresh folder in the context store, which is the default FRLM_CONTEXT_ROOTS: where a
    test puts a file it names as a server path (the stack's conductor reads only under the
    roots, and tmp_path is under none)."""
    from runs.engine.context import context_dir

    folder = Path(tempfile.mkdtemp(prefix="test-", dir=context_dir()))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a `manage.py` subprocess that shares this session's stack."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DB_PATH": settings.DATABASES["default"]["NAME"],
    }


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI's timeout, `kill`) stops the run as Ctrl-C does, so the fixtures'
    teardowns stop the stacks the tests started: killed outright, the run left its
    servers, swarms and Redis instances running, each in a session of its own."""

    def stop(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM kills outright
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, stop)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the stack needs the test database to exist (its processes open it) and its
    writes committed (they cannot see a test's open transaction)."""
    for item in items:
        if "stack" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "django_db"
        ):
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test on the stack says how the stack's processes stood: which had exited,
    and the end of each worker's log and of any exited process's. (CI keeps no logs: a
    stack worker once vanished mid-session and nothing said why.)"""
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.when == "call" and report.failed and isinstance(stack, Stack):
        try:
            report.sections.append(("stack processes", stack_state(stack)))
        except Exception as exc:  # a report about the failure must not fail itself
            report.sections.append(("stack processes", f"(could not read: {exc!r})"))
    return report


def stack_state(stack: Stack) -> str:
    from tests.helpers import stack_worker_ids

    lines = [f"stack workers in presence: {sorted(stack_worker_ids())}"]
    for name, proc in stack.procs.items():
        code = proc.popen.poll() if proc.popen is not None else None
        lines.append(f"{name}: {'running' if code is None else f'exited with {code}'}")
        if code is not None or name.startswith("worker-"):
            tail = stack.log_tail(name, lines=15)
            lines.extend(f"    {line[:300]}" for line in tail.splitlines())
    return "\n".join(lines)


@pytest.fixture
def swarm_factory(venues, tmp_path, subprocess_env):
    """Start simulated swarms (tests.swarm.Swarm) for one test; they stop after it."""
    started: list[Swarm] = []

    def start(venue: str, workers: int, **profile) -> Swarm:
        from tests.swarm import Swarm

        swarm = Swarm(tmp_path, subprocess_env, venue, workers, **profile)
        started.append(swarm)
        swarm.wait_up()
        return swarm

    yield start
    for swarm in started:
        swarm.stop()
