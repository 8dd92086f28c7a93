"""Gateway workers for end-to-end tests: `frlm_worker --server ... --token ...` started the way
an operator on another machine would, with nothing of this machine's: no Redis URL that
works, no database, its own empty data directory (tests/workers/test_netns.py goes further:
another network and mount namespace)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO

from django.conf import settings

from frlm_web.redis_client import get_redis
from tests.helpers import launch, wait_until
from workers import keys, services, signing
from workers.gateway.protocol import hello_claim
from workers.models import Venue, Worker
from workers.venues import LiveWorker, live_workers

Spawn = Callable[[list[str], IO[bytes]], subprocess.Popen]

# Addresses that lead nowhere: a gateway worker must not need them.
NOWHERE_ENV = {
    "FRLM_REDIS_URL": "redis://127.0.0.1:1/0",
    "FRLM_SIM_URL": "http://127.0.0.1:1/v1",
}


def enrolment_token(venue: str) -> str:
    """A fresh enrolment token of `venue` (made untrusted, of kind edge, if new)."""
    row, _ = Venue.objects.get_or_create(
        name=venue, defaults={"kind": Venue.Kind.EDGE, "trusted": False}
    )
    return services.token_create(row, ttl=timedelta(hours=1), label="test")[1]


def worker_command(server: str, token: str, venue: str, name: str, *flags: str) -> list[str]:
    return [
        sys.executable,
        str(Path(settings.BASE_DIR) / "manage.py"),
        "frlm_worker",
        "--server",
        server,
        "--token",
        token,
        "--venue",
        venue,
        "--name",
        name,
        *flags,
    ]


def far_env(home: Path) -> dict[str, str]:
    """The environment of a process on "another host": this repository's code, its own
    empty data directory, and no way to the broker or the database."""
    home.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    return {
        **{k: os.environ[k] for k in keep if k in os.environ},
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DATA_DIR": str(home),
        "FRLM_DB_PATH": str(home / "no-database-here.sqlite3"),
        "FRLM_SECRET_KEY": "another-host-" + os.urandom(8).hex(),
        **NOWHERE_ENV,
    }


class GatewayWorker:
    """One gateway worker process, stopped with `stop()` (SIGTERM) or `kill()` (SIGKILL)."""

    def __init__(
        self,
        server: str,
        venue: str,
        name: str,
        home: Path,
        *flags: str,
        token: str | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        """`spawn(argv, stdout)` starts the process somewhere else (another namespace,
        tests/workers/test_netns.py); by default here, with `far_env`."""
        self.venue, self.name = venue, name
        self.log = home / f"{name}.log"
        home.mkdir(parents=True, exist_ok=True)
        command = worker_command(server, token or enrolment_token(venue), venue, name, *flags)
        with open(self.log, "wb") as out:
            if spawn is not None:
                self.proc = spawn(command, out)
            else:
                self.proc = subprocess.Popen(
                    command,
                    env=far_env(home / name),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def entry(self) -> LiveWorker | None:
        for entry in live_workers(get_redis(), self.venue):
            if entry.get("label") == self.name:
                return entry
        return None

    def wait_up(self, timeout: float = 60.0) -> LiveWorker:
        def up() -> LiveWorker | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            return self.entry()

        return wait_until(up, timeout=timeout, what=f"gateway worker {self.name} in presence")

    @property
    def worker_id(self) -> str:
        return Worker.objects.get(name=self.name, venue__name=self.venue).id

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def named(events: list[dict], name: str, phase: str | None = None) -> list[dict]:
    """The events of one name (and phase)."""
    return [e for e in events if e["name"] == name and (phase is None or e["phase"] == phase)]


def claims(run_id: str) -> list[tuple[str, str]]:
    """(status, sq_id) of what the run's results stream says, in order."""
    from frlm_web.redis_client import get_redis
    from workers.jobs import results_stream

    return [
        (f[b"status"].decode(), f[b"sq_id"].decode())
        for _, f in get_redis().xrange(results_stream(run_id), "-", "+")
    ]


# -- speaking the protocol by hand, as a hostile or scripted worker ---------------------


def registered_worker(
    name: str, venue: str = "hostile", concurrency: int = 2, models: list[str] | None = None
) -> tuple[str, object]:
    """A worker registered in `venue` (untrusted), and its key."""
    key = keys.generate()
    Venue.objects.get_or_create(name=venue, defaults={"kind": "edge", "trusted": False})
    worker = services.worker_register(
        enrolment_token(venue),
        {
            "name": name,
            "venue": venue,
            "models": models or [],
            "concurrency": concurrency,
            "public_key": keys.public_b64(key),
        },
    )
    return worker.id, key


def say_hello(ws, worker_id: str, key, version: int | None = None) -> dict:
    """Sign the challenge; `version` as a worker of that protocol version says it (an older
    worker says none)."""
    challenge = json.loads(ws.recv(timeout=10))
    assert challenge["type"] == "challenge"
    sig = keys.sign(key, hello_claim(worker_id, challenge["nonce"]))
    hello = {"type": "hello", "worker_id": worker_id, "nonce": challenge["nonce"], "sig": sig}
    if version is not None:
        hello["version"] = version
    ws.send(json.dumps(hello))
    return json.loads(ws.recv(timeout=10))


def next_messages(ws, kinds: set[str], *, wait_s: float = 20) -> list[dict]:
    """Messages of `kinds` the server sends within `wait_s` (until one comes, then until it
    is quiet for half a second), its pings answered."""
    got: list[dict] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            message = json.loads(ws.recv(timeout=0.5))
        except TimeoutError:
            if got:
                return got
            continue
        if message["type"] == "ping":
            ws.send(json.dumps({"type": "pong", "t": message["t"]}))
        elif message["type"] in kinds:
            got.append(message)
    return got


def jobs_in(messages: list[dict]) -> list[dict]:
    return [j for m in messages for j in (m["jobs"] if m["type"] == "jobs" else [m["job"]])]


def signed_answer(job: dict, worker_id: str, key, claim: dict | None = None, **changes) -> dict:
    """A worker's signed answer to `job` and the end of its Execute span, as the agent
    sends them; `claim` is signed with it (text, token counts, cost), `changes` alter the
    result after it is signed."""
    result = {
        "run_id": job["run_id"],
        "sq_id": job["sq_id"],
        "venue": "ignored: the server stamps it",
        "worker_id": worker_id,
        "status": "ok",
        "text": "not here",
        "tokens_in": 3,
        "tokens_out": 2,
        "ms": 1.0,
        "cost": "0",
        **(claim or {}),
    }
    result["sig"] = signing.result_sign(key, result)
    end = {
        "event_id": os.urandom(8).hex(),
        "span_id": job["execute_span"],
        "parent_id": job["submit_span"],
        "name": "SubQuery.Execute",
        "phase": "end",
        "ts": time.time_ns(),
        "status": "ok",
        "depth": job["depth"],
        "ms": 1.0,
        "attrs": {"sq_id": job["sq_id"]},
    }
    return {"sq_id": job["sq_id"], "result": {**result, **changes}, "events": [end]}


def serve_run(ws, run, worker_id: str, key, forge: set[str]) -> dict[str, dict]:
    """Answer every job of `run` until it is done, each batch in one `results` message;
    the first answer for an sq_id in `forge` is signed with another key. Returns the jobs
    answered, by sq_id."""
    stranger = keys.generate()
    answered: dict[str, dict] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.done:
            return answered
        # A beat each second, as the agent sends: a worker that beats no more is dropped
        # once its presence would have lapsed (FRLM_VENUE_HEARTBEAT_TTL_S).
        ws.send(json.dumps({"type": "beat", "figures": {"inflight": 0, "memory_mb": 1.0}}))
        jobs = jobs_in(next_messages(ws, {"job", "jobs"}, wait_s=1))
        items = []
        for job in jobs:
            forged = job["sq_id"] in forge and job["sq_id"] not in answered
            items.append(signed_answer(job, worker_id, stranger if forged else key))
            answered[job["sq_id"]] = job
        if items:
            ws.send(json.dumps({"type": "results", "results": items}))
    raise AssertionError(f"run {run.id} did not finish")


def first_batch(ws, wid: str, key, venue: str, *, seed: int, timeout_s: float):
    """Launch a fragment run on `venue` (no hedging), say hello as a version-2 worker, and
    take the first jobs it sends: (the run, those jobs). The run is launched before the
    hello: a worker says nothing while the run is made (its context written, a few seconds
    on a loaded machine), and a worker silent past FRLM_GATEWAY_SILENCE_S is dropped."""
    policy = {"subquery_timeout_s": timeout_s, "hedge": "off"}
    run = launch(task="sniah", tokens=60_000, seed=seed, venues=[venue], policy=policy)
    assert say_hello(ws, wid, key, 2)["type"] == "welcome"
    return run, jobs_in(next_messages(ws, {"job", "jobs"}))
