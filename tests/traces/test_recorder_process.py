"""The recorder as a process: killed mid-run and restarted, it loses and duplicates
nothing; any other process reads a live run while it writes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from frlm_web.redis_client import get_redis
from tests.helpers import finish, launch, scripted, trace, wait_until
from traces import store

pytestmark = [pytest.mark.stack]


def test_it_loses_and_duplicates_nothing_when_killed_mid_run(stack, venues):
    program = scripted(
        "for i in range(6):\n    llm_query_batched(['q %d %d' % (i, j) for j in range(10)])",
        "FINAL('done')",
    )
    run = launch(question=program, worker_sim={"latency_ms": 150})
    wait_until(lambda: store.event_count(run.id) > 20, timeout=30, what="events to be stored")
    stack.kill("recorder", signal.SIGKILL)
    time.sleep(1.0)  # the run goes on emitting while nobody stores
    stack.restart("recorder")
    run = finish(run, timeout=90)
    assert run.status == "succeeded", run.error
    events = trace(run)
    emitted = int(get_redis().get(f"frlm:seq:{run.id}"))
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, emitted + 1))  # every event, in order, once
    assert len({e["event_id"] for e in events}) == len(events)


def test_it_lets_another_process_read_a_live_run(stack, venues, subprocess_env):
    run = launch(question=scripted("llm_query('hello')", "import time\ntime.sleep(4)", "FINAL(1)"))
    wait_until(
        lambda: any(e["name"] == "SubQuery.Execute" for e in store.read_events(run.id)),
        timeout=30,
        what="the first sub-query to be stored",
    )
    run.refresh_from_db()
    assert run.status == "running"
    done = subprocess.run(
        [sys.executable, "manage.py", "frlm_trace", run.id, "--events"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line) for line in done.stdout.splitlines()]
    assert any(e["name"] == "SubQuery.Execute" for e in seen)
    assert not any(e["name"] == "Run.Done" for e in seen)  # read while it runs
    assert finish(run).status == "succeeded"
