"""Faults on a stack of its own (not the session's): Redis killed with -9 mid-run and
started again from its AOF, and the stack's own processes killed with -9. Every run
completes, every event is stored exactly once, and nobody restarts anything by hand."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from frlm_web.stack import Proc, Stack, VenueSpec, free_port
from frlm_web.supervisor import read_state
from tests.helpers import scripted, wait_until

PROGRAM = scripted(
    "for i in range(8):\n    llm_query_batched(['q %d %d' % (i, j) for j in range(10)])",
    "FINAL('done')",
)


class OwnStack:
    """A supervised stack with its own Redis (AOF on), data directory, database (a copy of
    the test database) and model server, and the `manage.py` commands that run against it."""

    def __init__(self, root: Path) -> None:
        db = root / "db.sqlite3"
        self.env = {
            "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
            "FRLM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "FRLM_DATA_DIR": str(root),
            "FRLM_DB_PATH": str(db),
            "FRLM_SIM_PORT": str(free_port()),
            "FRLM_SECRET_KEY": settings.SECRET_KEY,
        }
        self.db = db
        self.manage("migrate", "--no-input", "-v", "0")
        self.stack = Stack(
            state_dir=root / "stack",
            venues=[VenueSpec("local", concurrency=8, sim={"latency_ms": 150}, worker_name="f-1")],
            env=self.env,
            start_redis=True,
            redis_persist=True,
            conductor_concurrency=2,
            web_port=free_port(),
        )

    @property
    def redis(self) -> redis.Redis:
        return self.stack.client

    def manage(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            env={**os.environ, **self.env},
            cwd=settings.BASE_DIR,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def launch(self, *policy: str) -> str:
        args = [arg for setting in policy for arg in ("--policy", setting)]
        return self.manage(
            "frlm_run",
            "--task",
            "sniah",
            "--tokens",
            "5000",
            "--question",
            PROGRAM,
            *args,
            "--no-wait",
        ).strip()

    def status(self, run_id: str) -> str:
        """The run's status once it ended ("failed: why" for a failure), else ""."""
        with sqlite3.connect(self.db) as db:
            row = db.execute("SELECT status, error FROM runs_run WHERE id = ?", [run_id]).fetchone()
        if not row or row[0] in ("queued", "running"):
            return ""
        return row[0] if row[0] == "succeeded" else f"{row[0]}: {row[1]}"

    def finish(self, run_id: str, timeout: float = 120) -> str:
        return wait_until(lambda: self.status(run_id), timeout=timeout, what=f"run {run_id}")

    def emitted(self, run_id: str) -> int:
        return int(self.redis.get(f"frlm:seq:{run_id}") or 0)

    def stored(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stored events, once its last one (the end of Run.Init) is stored."""

        def read() -> list[dict[str, Any]] | None:
            out = self.manage("frlm_trace", run_id, "--events")
            events = [json.loads(line) for line in out.splitlines()]
            done = any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events)
            return events if done else None

        return wait_until(read, timeout=60, every=1, what=f"the trace of {run_id}")

    def assert_stored_once(self, run_id: str) -> None:
        events = self.stored(run_id)
        seqs = sorted(e["seq"] for e in events)
        assert seqs == list(range(1, self.emitted(run_id) + 1))  # no gap, no duplicate
        assert len({e["event_id"] for e in events}) == len(events)

    def web_answers(self) -> int:
        """The web server's answer to a registration with a made-up enrolment token (it
        reads its address's failure count in Redis before it looks at the token)."""
        url = f"http://127.0.0.1:{self.stack.web_port}/api/workers/register"
        body = json.dumps({"token": "made-up", "name": "x", "venue": "local"}).encode()
        request = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def pid(self, name: str) -> int:
        popen = self.stack.procs[name].popen
        assert popen is not None
        return popen.pid

    def life(self, name: str) -> dict[str, Any]:
        return read_state(self.stack.state_dir)["procs"][name]

    def log(self, name: str) -> str:
        return (self.stack.state_dir / "logs" / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def own(tmp_path_factory) -> Iterator[OwnStack]:
    own = OwnStack(tmp_path_factory.mktemp("own-stack"))
    try:
        own.stack.start(supervise=True)
        yield own
    finally:
        own.stack.stop()


def test_it_rides_out_redis_killed_mid_run(own):
    recorder, forwarder, web = own.pid("recorder"), own.pid("forwarder"), own.pid("web")
    assert own.web_answers() in (400, 401, 403)
    run_id = own.launch()
    wait_until(lambda: own.emitted(run_id) > 40, timeout=60, what="the run to be under way")
    own.stack.kill("redis", signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: own.life("redis")["restarts"] == 1, timeout=30, what="redis to restart")
    wait_until(own.stack._redis_up, timeout=30, what="redis to answer")
    back = time.monotonic()
    resumed = {}
    for name in ("recorder", "forwarder"):
        wait_until(lambda n=name: "Redis is back" in own.log(n), timeout=30, every=0.05)
        resumed[name] = time.monotonic() - back

    assert own.finish(run_id) == "succeeded"
    own.assert_stored_once(run_id)
    # The recorder and forwarder rode it out themselves: same processes, said so once.
    assert (own.pid("recorder"), own.pid("forwarder")) == (recorder, forwarder)
    assert own.life("recorder")["restarts"] == own.life("forwarder")["restarts"] == 0
    for name in ("recorder", "forwarder"):
        text = own.log(name)
        assert text.count("lost Redis") == 1, text[-2000:]
        assert text.count("Redis is back") == 1, text[-2000:]
    for name in ("conductor", "worker-f-1", "web"):  # once at most: some had nothing to do
        text = own.log(name)
        assert text.count("lost Redis") == text.count("Redis is back") <= 1, text[-2000:]
    assert "redis (pid" in own.log("stack")
    print(
        f"redis answered {back - killed:.2f} s after its kill; then resumed: "
        + ", ".join(f"{name} {s:.2f} s" for name, s in resumed.items())
    )

    assert own.pid("web") == web and own.life("web")["restarts"] == 0
    assert own.web_answers() in (400, 401, 403)  # the same process, serving

    following = own.launch()  # the next run is stored too
    assert own.finish(following) == "succeeded"
    own.assert_stored_once(following)


@pytest.mark.parametrize("name", ["recorder", "forwarder", "worker-f-1"])
def test_it_restarts_a_process_killed_mid_run(own, name):
    before = own.life(name)["restarts"]
    # The venue has one worker: a sub-query lost with it is retried on it once it is back.
    run_id = own.launch("max_retries=5")
    wait_until(lambda: own.emitted(run_id) > 40, timeout=60, what="the run to be under way")
    dead = own.pid(name)
    own.stack.kill(name, signal.SIGKILL)
    wait_until(lambda: own.pid(name) != dead, timeout=30, what=f"{name} to be started again")
    own.stack.wait_ready(own.stack.procs[name], 60)

    assert own.finish(run_id) == "succeeded"
    own.assert_stored_once(run_id)
    life = own.life(name)
    assert life["restarts"] == before + 1
    assert life["last_reason"] == "killed by SIGKILL"
    assert life["pid"] == own.pid(name)
    assert f"{name} (pid {dead}) killed by SIGKILL" in own.log("stack")


def restarts(own: OwnStack) -> dict[str, int]:
    return {
        name: life["restarts"] for name, life in read_state(own.stack.state_dir)["procs"].items()
    }


def test_it_stops_without_resurrecting_anything(own):
    """Last in the module: the stack is stopped here (its fixture's stop does nothing more)."""
    pids = [p.popen.pid for p in own.stack.procs.values() if p.popen]
    before = restarts(own)
    own.stack.stop()
    time.sleep(1.5)  # longer than the supervisor's first delay
    assert all(p.popen.poll() is not None for p in own.stack.procs.values() if p.popen)
    assert [p.popen.pid for p in own.stack.procs.values() if p.popen] == pids
    assert restarts(own) == before


def test_it_backs_off_a_process_that_keeps_dying(tmp_path):
    stack = Stack(state_dir=tmp_path, venues=[])
    stack.launch(Proc("flaky", ["sh", "-c", "exit 3"], lambda: True))
    stack.supervise()
    try:
        time.sleep(4.5)  # delays 0.5, 1, 2 s: three starts again, not dozens
    finally:
        stack.stop()
    life = read_state(tmp_path)["procs"]["flaky"]
    assert 2 <= life["restarts"] <= 4, life
    assert life["last_reason"] == "exited with code 3"
    delays = [
        float(line.rsplit(" in ", 1)[1].split()[0])
        for line in (tmp_path / "logs" / "stack.log").read_text().splitlines()
        if "starting it again in" in line
    ]
    assert delays[:3] == [0.5, 1.0, 2.0]
