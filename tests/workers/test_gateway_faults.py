"""The worker gateway when its links and processes fail, against the real stack (daphne,
Redis, the conductor, `frlm_worker --server ... --token ...` processes): a dropped worker's
jobs go elsewhere at once; a silent one is dropped in full and comes back when it wakes; a
path that falls silent with its TCP up is left for a new connection; a web server killed
with -9 leaves no span open."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager

import pytest
from django.conf import settings

from tests.gateway import GatewayWorker, named
from tests.helpers import finish, launch, scripted, trace, wait_until

pytestmark = pytest.mark.timeout(240)


def test_a_dropped_worker_loses_its_jobs_to_another_at_once(far) -> None:
    slow = far("far-slow", "--sim-latency-ms", "3000")
    other = far("far-other", "--sim-latency-ms", "10")
    run = launch(task="sniah", tokens=200_000, seed=6, venues=["far"])
    # Kill the slow worker while it holds jobs.
    wait_until(lambda: (slow.entry() or {}).get("inflight", 0) > 0, what="far-slow to hold work")
    killed_at = time.time()
    slow.kill()
    run = finish(run, timeout=120)

    assert run.status == "succeeded", run.error
    assert run.correct is True
    events = trace(run)
    (lost,) = named(events, "Worker.Lost")
    assert lost["worker_id"] == slow.worker_id
    retried = [e for e in named(events, "SubQuery.Retry") if "was lost" in e["attrs"]["reason"]]
    assert retried, "no job of the dropped worker was sent again"
    # From the drop to the first re-dispatch: well under the presence TTL (the figure is
    # bench/federation.py's).
    first = min(e["ts"] for e in retried) / 1e9 - killed_at
    assert first < settings.FRLM_VENUE_HEARTBEAT_TTL_S - 0.5, f"re-dispatched {first:.2f} s after"
    executes = named(events, "SubQuery.Execute", "end")
    assert other.worker_id in {e["worker_id"] for e in executes}
    # No span is left open by the worker that is gone: the server ends what it held.
    assert {e["span_id"] for e in named(events, "SubQuery.Execute", "start")} == {
        e["span_id"] for e in executes
    }
    dropped = [e for e in executes if e["worker_id"] == slow.worker_id]
    assert dropped and all(e["status"] == "abandoned" for e in dropped)
    assert all(e["attrs"]["error"].startswith("worker lost: ") for e in dropped)


def test_a_silent_worker_is_dropped_and_its_jobs_go_elsewhere(far) -> None:
    """Stopped, not killed: its socket stays open, but it answers no ping."""
    silent = far("far-silent", "--sim-latency-ms", "2000")
    other = far("far-busy", "--sim-latency-ms", "10")
    run = launch(task="sniah", tokens=200_000, seed=7, venues=["far"])
    wait_until(lambda: (silent.entry() or {}).get("inflight", 0) > 0, what="it to hold work")
    os.killpg(silent.proc.pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        run = finish(run, timeout=120)
        # Silent long enough for the server to drop it, whenever the run ended.
        time.sleep(max(0.0, stopped_at + settings.FRLM_GATEWAY_SILENCE_S + 3 - time.time()))
    finally:
        os.killpg(silent.proc.pid, signal.SIGCONT)
        woken_at = time.time()
    assert run.status == "succeeded" and run.correct is True, run.error
    events = trace(run)
    (lost,) = named(events, "Worker.Lost")
    assert lost["worker_id"] == silent.worker_id
    after = lost["ts"] / 1e9 - stopped_at
    assert settings.FRLM_GATEWAY_SILENCE_S - 1.5 < after < settings.FRLM_GATEWAY_SILENCE_S + 2
    assert other.worker_id in {e["worker_id"] for e in named(events, "SubQuery.Execute", "end")}
    # The spans the server opened for its jobs are ended as abandoned when it is dropped,
    # not by the replies it sends once woken: the server cut its own loss short, and kept
    # the jobs as held.
    held = {
        e["span_id"]
        for e in named(events, "SubQuery.Execute", "start")
        if e["worker_id"] == silent.worker_id
    }
    assert held
    wait_until(
        lambda: held <= {e["span_id"] for e in named(trace(run), "SubQuery.Execute", "end")},
        what="its Execute spans ended",
    )
    ends = [e for e in named(trace(run), "SubQuery.Execute", "end") if e["span_id"] in held]
    assert {e["status"] for e in ends} == {"abandoned"}, ends
    assert all(e["ts"] / 1e9 < woken_at for e in ends), ends
    # Woken, it is a worker again: the server closed the silent socket, so it connects
    # anew and takes work. It stayed announced on the old socket with no pump taking its
    # jobs, which piled up on its queue, until it was stopped by hand (a review).
    other.kill()
    wait_until(lambda: other.entry() is None, timeout=30, what="the other worker gone")
    wait_until(lambda: silent.entry() is not None, timeout=30, what="it back in presence")
    again = finish(launch(task="sniah", tokens=20_000, seed=3, venues=["far"]), timeout=120)
    assert again.status == "succeeded" and again.correct is True, (
        again.error,
        silent.output()[-2000:],
    )
    ran = {e["worker_id"] for e in named(trace(again), "SubQuery.Execute", "end")}
    assert ran == {silent.worker_id}


def test_a_worker_whose_link_falls_silent_connects_again_and_takes_work(
    web, venues, tmp_path
) -> None:
    """A path that stops carrying bytes with its TCP still up (a NAT that lost its mapping):
    the server drops the worker after FRLM_GATEWAY_SILENCE_S, and the worker, hearing no
    ping, must connect again. It waited on the dead socket until the path came back, 70 s in
    a review; and once it did connect again, it waited 5 s, its back-off never reset."""
    from frlm_web.netlab import DelayProxy

    port = int(web.rsplit(":", 1)[1])
    proxy = DelayProxy(listen_host="127.0.0.1", target_port=port).start()
    worker = GatewayWorker(
        f"http://127.0.0.1:{proxy.port}", "far", "far-frozen", tmp_path, "--concurrency", "2"
    )
    try:
        worker.wait_up()
        for _ in range(2):  # the second time, after a session that went well
            assert proxy.freeze() >= 1
            frozen_at = time.time()
            wait_until(lambda: worker.entry() is None, timeout=30, what="the server to drop it")
            wait_until(lambda: worker.entry() is not None, timeout=30, what="it back")
            took = time.time() - frozen_at
            assert took < settings.FRLM_GATEWAY_SILENCE_S + 8, took
        run = finish(launch(task="sniah", tokens=20_000, seed=4, venues=["far"]), timeout=120)
        assert run.status == "succeeded" and run.correct is True, (
            run.error,
            worker.output()[-2000:],
        )
    finally:
        worker.kill()
        proxy.stop()


@contextmanager
def _batch_on_an_own_stack(tmp_path, name: str, latency_ms: int, final: str, policy: dict):
    """An own stack with its web server, one gateway worker of venue `far` (4 slots, each
    reply taking `latency_ms`), and a run of 8 sub-queries on it, launched and running a
    job: (the stack, the run)."""
    from runs.services import ContextSpec, run_create
    from tests.ownstack import own_stack
    from workers.backends import model_spec
    from workers.venues import live_workers

    with own_stack(tmp_path, [], web=True) as own:
        server = f"http://127.0.0.1:{own.web_port}"
        worker = GatewayWorker(
            server, "far", name, tmp_path, "--concurrency", "4", "--sim-latency-ms",
            str(latency_ms),
        )  # fmt: skip
        try:
            wait_until(
                lambda: any(w["label"] == name for w in live_workers(own.client, "far")),
                timeout=60,
                what="the worker in the own stack's presence",
            )
            run = run_create(
                question=scripted("rs = llm_query_batched(['q %d' % i for i in range(8)])",
                                  final),
                context=ContextSpec(text="x"), policy=policy,
                root_model=model_spec("sim", role="root"),
                worker_model=model_spec("sim", role="worker"), venues=["far"],
            )  # fmt: skip
            own.launch_run(run.id)
            wait_until(
                lambda: any(e["name"] == "SubQuery.Execute" for e in own.events(run.id)),
                timeout=60,
                what="the worker to run a job",
            )
            yield own, run
        finally:
            worker.kill()


def _open_executes(events: list[dict]) -> list[dict]:
    from tests.ownstack import open_spans

    return [e for e in open_spans(events) if e["name"] == "SubQuery.Execute"]


def test_killing_the_web_server_ends_the_spans_of_the_jobs_it_held(venues, tmp_path) -> None:
    """The gateway opens and ends its workers' Execute spans itself; killed with -9 it ended
    none, and they stayed open for good (a review): the conductor, told of each span as
    the job started, ends them as abandoned when it finds the worker gone."""
    with _batch_on_an_own_stack(tmp_path, "far-orphaned", 3000, "FINAL('x')", {"hedge": "off"}) as (
        own,
        run,
    ):
        own.kill("web", signal.SIGKILL)
        wait_until(
            lambda: not _open_executes(own.events(run.id)),
            timeout=60,
            what="the held jobs' Execute spans ended",
        )
        ends = [
            e for e in own.events(run.id) if e["name"] == "SubQuery.Execute" and e["phase"] == "end"
        ]
        assert ends and {e["status"] for e in ends} == {"abandoned"}, ends


def test_a_web_server_restarted_at_once_has_the_jobs_its_workers_held_tried_again_now(
    venues, tmp_path
) -> None:
    """Killed with -9 and back before its workers' presence lapses, the web server knows
    none of the jobs the old one gave them: their results are refused there as not held, and
    the conductor, seeing the worker present all along, waited each job's sub-query timeout
    (60 s by default). The worker now returns, on its next session, every job of the dropped
    one, and the conductor tries each again at once."""
    from runs.models import Run

    final = "FINAL(str(sum(not r.startswith('[frlm:') for r in rs)))"
    policy = {"hedge": "off", "subquery_timeout_s": 60}
    with _batch_on_an_own_stack(tmp_path, "far-returning", 1500, final, policy) as (own, run):
        own.kill("web", signal.SIGKILL)
        killed_at = time.monotonic()
        own.restart("web")

        def ended() -> bool:
            run.refresh_from_db()
            return run.status in (Run.Status.SUCCEEDED, Run.Status.FAILED)

        wait_until(ended, timeout=120, what="the run to end")
        took = time.monotonic() - killed_at
        assert run.status == Run.Status.SUCCEEDED, run.error
        assert run.answer == "8", run.answer
        assert took < 30, f"the run ended {took:.1f} s after the kill: its jobs waited"
        retried = [
            e for e in own.events(run.id)
            if e["name"] == "SubQuery.Retry" and "returned" in e["attrs"].get("reason", "")
        ]  # fmt: skip
        assert retried, "no job was tried again for its worker's return"
        assert not _open_executes(own.events(run.id))


def test_a_deregistered_worker_is_closed_at_its_next_beat(web, venues) -> None:
    """Deregistered (an operator's `/workers` action, or its own leave) while connected, a
    gateway worker was served until the server next wrote its beat to the database
    (FRLM_HEARTBEAT_WRITE_S, 5 s): its beats put it back in presence meanwhile. It is now
    told at its next beat and closed (4410)."""
    import json

    import websockets
    from websockets.sync.client import connect

    from frlm_web.redis_client import get_redis
    from tests.gateway import registered_worker, say_hello
    from workers.gateway.agent import ws_url
    from workers.models import Worker
    from workers.services import worker_deregister
    from workers.venues import live_workers

    wid, key = registered_worker("leaving", venue="deregnow")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key, 4)["type"] == "welcome"
        worker_deregister(Worker.objects.get(id=wid))
        gone_at = time.monotonic()
        told = None
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                ws.send(json.dumps({"type": "beat", "figures": {"inflight": 0}}))
                try:
                    message = json.loads(ws.recv(timeout=0.2))
                except TimeoutError:
                    continue
                if message["type"] == "ping":
                    ws.send(json.dumps({"type": "pong", "t": message["t"]}))
                elif message["type"] == "error" and told is None:
                    told = (time.monotonic() - gone_at, message)
    assert told is not None and "deregistered" in told[1]["error"], told
    assert told[0] < 2.0, f"told {told[0]:.1f} s after its deregistration"
    assert closed.value.rcvd.code == 4410
    assert wid not in {w["name"] for w in live_workers(get_redis(), "deregnow")}


def test_an_untrusted_worker_that_beats_only_over_http_gets_no_work(far, web) -> None:
    """A worker of an untrusted venue takes jobs only over the gateway: the broker refuses
    it. One that registers and beats over the HTTP API alone, as any holder of an enrolment
    token can, was announced as a broker worker, and the scheduler queued jobs for it that
    waited out their sub-query timeout while its beats kept it alive."""
    import threading

    from frlm_web.redis_client import get_redis
    from tests.gateway import enrolment_token
    from workers import keys
    from workers.client import HttpControl
    from workers.venues import announced, live_workers

    far("far-working", "--sim-latency-ms", "10")
    key = keys.generate()
    control = HttpControl(web, enrolment_token("far"), key)
    idle = control.register(
        {
            "name": "far-http-only",
            "venue": "far",
            "models": [],
            "concurrency": 64,
            "public_key": keys.public_b64(key),
        }
    )["worker_id"]
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            control.heartbeat(idle, {"inflight": 0, "latency_ms": 1.0})
            stop.wait(0.5)

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        wait_until(
            lambda: idle in {w["worker_id"] for w in announced(get_redis(), "far")},
            what="the HTTP-only worker in presence",
        )
        # Shown as beating, and as taking no work.
        assert idle not in {w["worker_id"] for w in live_workers(get_redis(), "far")}
        policy = {"subquery_timeout_s": 20, "hedge": "off"}
        run = launch(task="sniah", tokens=60_000, seed=11, venues=["far"], policy=policy)
        started = time.monotonic()
        run = finish(run, timeout=150)
        took = time.monotonic() - started
    finally:
        stop.set()
        beating.join(timeout=5)
        control.deregister(idle)
    assert run.status == "succeeded", run.error
    assert took < 15, f"the run took {took:.0f} s: jobs waited on a worker that cannot take them"
    sent = [e for e in named(trace(run), "SubQuery.Submit", "start")]
    assert sent and all(e["attrs"].get("worker_id") != idle for e in sent)
