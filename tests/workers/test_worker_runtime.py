"""The worker runtime against the real server and Redis: `frlm_worker --server` registers
over HTTP, heartbeats into presence, consumes its own queue and its venue's, signs its
results, and on SIGTERM finishes what it runs, deregisters and leaves presence."""

from __future__ import annotations

import signal
import stat
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from frlm_web import presence
from frlm_web.redis_client import get_redis
from frlm_web.stack import Proc, Stack, free_port, web_proc
from tests.helpers import wait_until
from workers.backends import model_spec
from workers.jobs import Job, decode_result, results_stream
from workers.models import Venue, Worker
from workers.services import token_create
from workers.signing import result_verify
from workers.sim.server import worker_reply
from workers.venues import LiveWorker, live_workers, presence_group

QUESTION = "What is the secret code? Fragment: the secret code is 4417."


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[str]:
    """The web server (daphne) next to the session's stack, as a remote worker reaches it."""
    port = free_port()
    proc = web_proc(port)
    proc.name = "web-runtime"
    stack.launch(proc)
    stack.wait_ready(proc, 60)
    yield f"http://127.0.0.1:{port}"
    stack.kill(proc.name, signal.SIGTERM)


def worker_proc(stack: Stack, venue: str, name: str, *extra: str) -> Proc:
    manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
    argv = [*manage, "frlm_worker", "--venue", venue, "--name", name, *extra]
    return Proc(f"worker-{name}", argv, lambda: live(venue, name) is not None)


def live(venue: str, name: str) -> LiveWorker | None:
    return next((w for w in live_workers(get_redis(), venue) if w.get("label") == name), None)


def job(run_id: str, sq_id: str, prompt: str, latency_ms: float = 20) -> Job:
    spec = model_spec("sim", role="worker")
    model = {**spec.to_dict(), "sim": {"latency_ms": latency_ms, "spread": 0}}
    return {
        "run_id": run_id,
        "sq_id": sq_id,
        "submit_span": "s" + uuid.uuid4().hex[:15],
        "prompt": prompt,
        "model": model,
        "deadline": time.time() + 60,
        "depth": 1,
        "timeout_s": 30,
        "attempt": 1,
    }


def send(queue: str, work: Job) -> None:
    from workers.tasks import subquery_execute

    subquery_execute.apply_async(args=[work], queue=queue)


@contextmanager
def two_slot_worker(
    stack: Stack, venue: str, name: str, *extra: str
) -> Iterator[tuple[Proc, str, str]]:
    """A worker of two slots, its id, and a run id for the jobs the test gives it."""
    proc = worker_proc(stack, venue, name, "--concurrency", "2", *extra)
    stack.launch(proc)
    try:
        stack.wait_ready(proc, 60)
        yield proc, live(venue, name)["worker_id"], "rt" + uuid.uuid4().hex[:10]
    finally:
        stack.kill(proc.name)


def push_bundle(worker_id: str, jobs: list[Job]) -> None:
    """The jobs onto the worker's own queue in one message, as the conductor bundles them."""
    from workers import wire

    argsrepr = f"[{jobs[0]['run_id']} sub-queries {' '.join(j['sq_id'] for j in jobs)}]"
    wire.push(
        get_redis(),
        [(f"worker.{worker_id}", jobs, argsrepr)],
        expires_s=60,
        reply_to="test",
        sender=wire.origin(),
        per_trip=8,
    )


def results(run_id: str) -> list[dict[str, Any]]:
    return [decode_result(fields) for _, fields in get_redis().xrange(results_stream(run_id))]


def finals(run_id: str, count: int) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        out = [r for r in results(run_id) if r["status"] != "started"]
        return out if len(out) >= count else None

    return wait_until(done, timeout=60, what=f"{count} results of {run_id}")


def test_it_registers_over_http_beats_consumes_signs_and_leaves_on_sigterm(
    stack, server, transactional_db
):
    # A trusted pod: only those consume the broker from another machine.
    venue = Venue.objects.create(name="rtremote", kind="datacenter", trusted=True)
    _, token = token_create(venue, label="runtime test")
    proc = worker_proc(
        stack,
        "rtremote",
        "rt-remote-1",
        "--server",
        server,
        "--token",
        token,
        "--connect",
        "broker",
        "--concurrency",
        "2",
        "--model",
        "frlm-sim-worker",
    )
    stack.launch(proc)
    try:
        stack.wait_ready(proc, 60)
        entry = live("rtremote", "rt-remote-1")
        worker = Worker.objects.get(id=entry["worker_id"])
        assert worker.name == "rt-remote-1" and worker.status == "active"
        assert worker.token is not None and worker.token.label == "runtime test"
        assert entry["name"] == worker.id and entry["queue"] == f"worker.{worker.id}"
        assert entry["pid"] == proc.popen.pid and entry["memory_mb"] > 10
        assert entry["models"] == ["frlm-sim-worker"] and entry["concurrency"] == 2
        key_file = Path(settings.DATA_DIR) / "workers" / "rtremote" / "rt-remote-1.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

        # Heartbeats keep its presence fresh and reach the database.
        group = presence_group("rtremote")
        first = presence.entry(get_redis(), group, worker.id)[0]
        wait_until(
            lambda: presence.entry(get_redis(), group, worker.id)[0] > first + 1,
            timeout=20,
            what="a later heartbeat",
        )
        wait_until(
            lambda: Worker.objects.get(id=worker.id).last_heartbeat is not None,
            timeout=20,
            what="a heartbeat in the database",
        )

        # It answers on its own queue and on its venue's, and signs what it returns.
        run_id = "rt" + uuid.uuid4().hex[:10]
        send(f"worker.{worker.id}", job(run_id, "1.1", "What is 2+2? Fragment: 2+2=4"))
        send("venue.rtremote", job(run_id, "2.1", "Say hello. Fragment: hello"))
        done = finals(run_id, 2)
        assert {r["sq_id"] for r in done} == {"1.1", "2.1"}
        for result in done:
            assert result["status"] == "ok" and result["worker_id"] == worker.id
            assert result_verify(result, worker.public_key)
            assert not result_verify({**result, "text": result["text"] + "!"}, worker.public_key)
            assert not result_verify({**result, "sq_id": "9.1"}, worker.public_key)
            assert not result_verify({**result, "worker_id": "wother"}, worker.public_key)
        wait_until(
            lambda: live("rtremote", "rt-remote-1").get("latency_ms") is not None,
            timeout=20,
            what="the latency of its recent sub-queries in its heartbeat",
        )

        stack.kill(proc.name, signal.SIGTERM)
        assert proc.popen.returncode == 0, stack.log_tail(proc.name)
        worker.refresh_from_db()
        assert worker.status == "deregistered"
        assert presence.entry(get_redis(), group, worker.id) is None
    finally:
        stack.kill(proc.name)


# The consumers of a broker worker's queues: Celery's and FRLM's own (workers/consumer.py),
# whose slots are tasks of an event loop (workers/aslots.py) or threads (frlm-threads).
CONSUMERS = pytest.mark.parametrize("consumer", ["celery", "frlm", "frlm-threads"])


@CONSUMERS
def test_it_finishes_running_work_on_sigterm_then_deregisters(stack, transactional_db, consumer):
    """In-process registration (no --server), as `make up` starts workers; this one lies."""
    name = f"rt-drain-{consumer}"  # a killed worker's presence lingers until it expires
    proc = worker_proc(
        stack,
        "rtdrain",
        name,
        "--concurrency",
        "2",
        "--sim-lie-rate",
        "1",
        "--consumer",
        consumer,
    )
    stack.launch(proc)
    try:
        stack.wait_ready(proc, 60)
        worker_id = live("rtdrain", name)["worker_id"]
        run_id = "rt" + uuid.uuid4().hex[:10]
        for i in (1, 2):
            send(f"worker.{worker_id}", job(run_id, f"{i}.1", QUESTION, latency_ms=2500))
        wait_until(
            lambda: len([r for r in results(run_id) if r["status"] == "started"]) == 2,
            timeout=30,
            what="both jobs to start",
        )
        proc.popen.send_signal(signal.SIGTERM)
        wait_until(
            lambda: (live("rtdrain", name) or {}).get("draining"),
            timeout=10,
            what="the worker to announce it is draining",
        )
        assert proc.popen.wait(timeout=60) == 0, stack.log_tail(proc.name)
        worker = Worker.objects.get(id=worker_id)
        done = finals(run_id, 2)
        assert [r["status"] for r in done] == ["ok", "ok"]
        honest = worker_reply([{"role": "user", "content": QUESTION}], None)
        assert [r["text"] for r in done if r["text"] != honest] == [r["text"] for r in done]
        assert all(result_verify(r, worker.public_key) for r in done)
        assert worker.status == "deregistered"
        assert live("rtdrain", name) is None
    finally:
        stack.kill(proc.name)


def frlm_worker(env: dict[str, str], *args: str) -> Any:
    """`manage.py frlm_worker ARGS` run to its end (for the ways it refuses to start)."""
    import subprocess

    return subprocess.run(
        [sys.executable, "manage.py", "frlm_worker", *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_refuses_to_start_with_a_bad_token(stack, server, subprocess_env):
    Venue.objects.get_or_create(name="rtremote")
    out = frlm_worker(
        subprocess_env, "--venue", "rtremote", "--server", server, "--token", "frlmt_nope"
    )
    assert out.returncode != 0
    assert "could not register: this enrolment token is not known" in out.stderr
    assert "frlm_token" in out.stderr
    # Not a URL: said before anything starts, once (a review saw the simulated model start
    # first, and "protocol.." from the joined message).
    bad = frlm_worker(subprocess_env, "--venue", "rtremote", "--server", "notaurl", "--token", "x")
    assert bad.returncode == 2 and "--server: takes an http:// or https:// URL" in bad.stderr
    assert "simulated model" not in bad.stdout + bad.stderr and ".." not in bad.stderr


def test_a_refused_registration_names_the_options_to_change(stack, server, subprocess_env):
    """The server's refusal was printed as the HTTP API says it ("correct the fields listed
    in `fields`"): a command's user changes its options (a review)."""
    venue, _ = Venue.objects.get_or_create(name="rtremote")
    _, token = token_create(venue, label="runtime test")
    out = frlm_worker(subprocess_env, "--venue", "edge", "--server", server, "--token", token)
    assert out.returncode != 0
    assert (
        "could not register: --venue: this enrolment token is for venue 'rtremote', not "
        "'edge'. What to do: correct --venue and start it again"
    ) in out.stderr, out.stderr
    assert "`fields`" not in out.stderr


def test_a_worker_of_an_untrusted_venue_may_not_consume_the_broker(
    stack, server, subprocess_env, transactional_db
):
    venue = Venue.objects.create(name="rtuntrusted", kind="edge", trusted=False)
    _, token = token_create(venue, label="runtime test")
    out = frlm_worker(
        subprocess_env,
        *("--venue", "rtuntrusted", "--server", server, "--token", token),
        *("--connect", "broker", "--name", "rt-u-1"),
    )
    assert out.returncode != 0
    assert "venue rtuntrusted is not trusted: its workers take jobs through the gateway" in (
        out.stderr
    )
    # It left no registration behind that could hold a name or a place in presence.
    assert Worker.objects.get(name="rt-u-1").status == Worker.Status.DEREGISTERED
    assert live("rtuntrusted", "rt-u-1") is None


def test_it_registers_the_stacks_workers_under_their_ids(stack):
    for venue in stack.venues:
        entry = live(venue.name, venue.member)
        assert entry is not None and entry["worker_id"].startswith("w")
        assert entry["name"] == entry["worker_id"] and entry["venue"] == venue.name


@CONSUMERS
def test_a_bundle_runs_in_the_workers_slots_and_skips_only_its_cancelled_job(
    stack, transactional_db, consumer
):
    """Several jobs in one message (workers/wire.py): each runs as if it had come alone, never
    more at once than the worker's slots, and one cancelled before it starts is skipped
    while the others run (a bundle's task id is not revoked: it is theirs too)."""
    from workers.jobs import cancelled_key

    with two_slot_worker(stack, "rtbundle", f"rt-bundle-{consumer}", "--consumer", consumer) as (
        _proc,
        worker_id,
        run_id,
    ):
        get_redis().sadd(cancelled_key(run_id), "3.1")
        jobs = [job(run_id, f"{i}.1", QUESTION, latency_ms=300) for i in range(1, 6)]
        push_bundle(worker_id, jobs)
        done = finals(run_id, 5)
        assert {r["sq_id"]: r["status"] for r in done} == {
            "1.1": "ok",
            "2.1": "ok",
            "3.1": "cancelled",
            "4.1": "ok",
            "5.1": "ok",
        }
        public_key = Worker.objects.get(id=worker_id).public_key
        assert all(result_verify(r, public_key) for r in done)
        running = most = 0
        for result in results(run_id):
            running += 1 if result["status"] == "started" else -1
            most = max(most, running)
        assert most == 2, "a bundle's jobs ran beyond the worker's two slots, or one at a time"


@CONSUMERS
def test_on_sigterm_it_finishes_a_bundles_running_jobs_and_leaves_the_rest(
    stack, transactional_db, consumer
):
    """A bundle's jobs without a slot yet are like jobs Celery prefetched and never started:
    a draining worker leaves them (the conductor sends them elsewhere once it has
    deregistered) instead of running the whole bundle before it exits."""
    with two_slot_worker(stack, "rtbdrain", f"rt-bdrain-{consumer}", "--consumer", consumer) as (
        proc,
        worker_id,
        run_id,
    ):
        jobs = [job(run_id, f"{i}.1", QUESTION, latency_ms=2500) for i in range(1, 5)]
        push_bundle(worker_id, jobs)
        wait_until(
            lambda: len([r for r in results(run_id) if r["status"] == "started"]) == 2,
            timeout=30,
            what="the bundle's first two jobs to start",
        )
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=60) == 0, stack.log_tail(proc.name)
        said = [(r["sq_id"], r["status"]) for r in results(run_id)]
        assert sorted(said) == [
            ("1.1", "ok"),
            ("1.1", "started"),
            ("2.1", "ok"),
            ("2.1", "started"),
        ]
        assert Worker.objects.get(id=worker_id).status == "deregistered"


def test_frlms_own_consumer_holds_no_job_beyond_its_free_slots(stack, transactional_db):
    """`--consumer frlm` takes jobs off its queue only for free slots (Celery's prefetch
    would hold more), several at once when several are free, and a message that is not a
    sub-query task is dropped without stopping it."""
    with two_slot_worker(stack, "rtown", "rt-own-1", "--consumer", "frlm") as (
        proc,
        worker_id,
        run_id,
    ):
        queue = f"worker.{worker_id}"
        get_redis().lpush(queue, b"not a Celery message")
        for i in range(1, 6):
            send(queue, job(run_id, f"{i}.1", QUESTION, latency_ms=1500))
        wait_until(
            lambda: len([r for r in results(run_id) if r["status"] == "started"]) == 2,
            timeout=30,
            what="two jobs to start",
        )
        time.sleep(0.5)
        assert get_redis().llen(queue) == 3, "it took jobs it has no free slot for"
        done = finals(run_id, 5)
        assert sorted(r["status"] for r in done) == ["ok"] * 5
        running = most = 0
        for result in results(run_id):
            running += 1 if result["status"] == "started" else -1
            most = max(most, running)
        assert most == 2
        assert "a message on" in stack.log_tail(proc.name) and "dropped" in stack.log_tail(
            proc.name
        )


def test_a_refusal_with_advice_of_its_own_keeps_it() -> None:
    """A name taken: the server says whose and what to do; that was dropped for the fields'
    options (a review), and a signature refused named `challenge_sig`, no option at all."""
    from workers.client import ControlError
    from workers.management.commands.frlm_worker import _refused

    taken = ControlError(
        409,
        "venue 'edge' already has a worker named 'w' (w123) with another key",
        "choose another name, or stop that worker",
        {"name": ["taken in this venue by a worker with another key"]},
    )
    said = _refused(taken)
    assert "(w123)" in said and "--name: taken" in said
    assert said.endswith("What to do: choose another name, or stop that worker")
    unsigned = ControlError(
        403, "bad signature", "correct the fields listed in `fields`", {"challenge_sig": ["no"]}
    )
    assert _refused(unsigned).endswith("What to do: correct --key-file and start it again")
