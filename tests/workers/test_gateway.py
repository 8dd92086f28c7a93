"""The worker gateway against the real stack: daphne, Redis, the conductor and `frlm_worker
--server ... --token ...` processes that hold nothing of this machine (tests/gateway.py).
A run over gateway workers is answered from fragments the server reads; a worker proves
its key before it gets anything; it can answer and report only for the jobs it holds; a
dropped worker's jobs go elsewhere at once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from decimal import Decimal

import pytest
import websockets
from django.conf import settings
from websockets.sync.client import connect

from frlm_web.redis_client import get_redis
from tests.gateway import GatewayWorker, enrolment_token
from tests.helpers import endpoint, finish, launch, scripted, trace, wait_until
from traces import store
from traces.emitter import EVENTS_STREAM
from workers import keys, signing
from workers.backends import ModelError, ModelSpec
from workers.execution import served
from workers.gateway import relay
from workers.gateway.agent import ws_url
from workers.gateway.protocol import batches, buffer_for, hello_claim
from workers.jobs import cancelled_key, results_stream
from workers.models import Venue, worker_queue
from workers.reputation import load as load_reputations
from workers.reputation import strikes_key
from workers.services import worker_register
from workers.tasks import subquery_execute

pytestmark = pytest.mark.timeout(240)


def named(events: list[dict], name: str, phase: str | None = None) -> list[dict]:
    return [e for e in events if e["name"] == name and (phase is None or e["phase"] == phase)]


@pytest.fixture
def far(web, venues, tmp_path):
    """Start gateway workers of venue `far` for one test; they stop after it."""
    started: list[GatewayWorker] = []

    def start(name: str, *flags: str) -> GatewayWorker:
        worker = GatewayWorker(web, "far", name, tmp_path, "--concurrency", "4", *flags)
        started.append(worker)
        worker.wait_up()
        return worker

    yield start
    for worker in started:
        worker.kill()


def test_a_worker_with_nothing_of_this_machine_answers_a_fragment_run(far) -> None:
    one = far("far-1", "--sim-latency-ms", "10")
    entry = one.entry()
    assert entry is not None and entry["connection"] == "gateway"
    assert entry["address"] == "127.0.0.1"

    run = finish(launch(task="sniah", tokens=200_000, seed=5, venues=["far"]), timeout=120)

    assert run.status == "succeeded", (run.error, one.output()[-2000:])
    assert run.correct is True, (run.answer, run.expected_answer)
    events = trace(run)
    executes = named(events, "SubQuery.Execute", "end")
    assert len(executes) >= run.subqueries > 0
    assert {(e["venue"], e["worker_id"]) for e in executes} == {("far", one.worker_id)}
    # The server read each fragment (by byte range, checked by sha256) for the worker, and
    # the worker's trace says so under its Execute span.
    loads = [e for e in named(events, "Env.LoadFragment") if e["venue"] == "far"]
    assert len(loads) == len(named(events, "SubQuery.Execute", "start"))  # hedges included
    assert sum(e["bytes"] for e in loads) >= run.context_chars
    spans = {e["span_id"] for e in named(events, "SubQuery.Execute", "start")}
    assert all(e["parent_id"] in spans for e in loads)
    # RTT is measured once the first ping came back.
    wait_until(lambda: (one.entry() or {}).get("rtt_ms") is not None, what="an RTT figure")


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


def _batch_program(n: int) -> str:
    prompts = [f"Where is station {i}?" for i in range(n)]
    return (
        "Run this program.\n```repl\n"
        f"rs = llm_query_batched({prompts!r})\n"
        "FINAL(str(sum(not r.startswith('[frlm:') for r in rs)))\n```"
    )


def test_a_job_waiting_in_a_workers_buffer_counts_as_waiting_not_running(far) -> None:
    """A worker of 4 slots holds 2 more jobs queued (protocol version 3). Their wait is not
    their run: the worker's measured latency stays near its model's 300 ms (counted from
    each job's start said, a third of its jobs would have counted a wait of up to 300 ms
    more), and the batch is not slowed by it."""
    steady = far("far-steady", "--sim-latency-ms", "300")
    run = finish(launch(question=_batch_program(24), venues=["far"], policy={"hedge": "off"}))

    assert run.status == "succeeded", run.error
    assert run.answer == "24"
    (rep,) = load_reputations(get_redis(), [steady.worker_id]).values()
    assert rep.latency_ms is not None and rep.latency_ms < 300 * 1.25, rep.as_dict()
    executes = named(trace(run), "SubQuery.Execute")
    assert {e["worker_id"] for e in executes} == {steady.worker_id}
    # Every span has its start, and those of the jobs that waited in the buffer opened
    # when they started, not when they were handed over: each ran about 300 ms.
    queued = {sq for status, sq in _claims(run.id) if status == "queued"}
    assert len(queued) >= 8, queued
    starts = {e["span_id"]: e for e in executes if e["phase"] == "start"}
    ran = {
        starts[e["span_id"]]["attrs"]["sq_id"]: (e["ts"] - starts[e["span_id"]]["ts"]) / 1e6
        for e in executes
        if e["phase"] == "end"
    }
    assert len(ran) == len(starts) == 24
    assert max(ran[sq] for sq in queued) < 300 * 1.5, ran


def test_jobs_waiting_in_a_slow_workers_buffer_are_hedged_not_waited_for(far) -> None:
    """On a worker 300 times slower than the other, the jobs in its buffer are seen waiting:
    they are hedged to the fast worker with its stragglers, and the batch does not wait
    the two rounds of 6 s they would take there. Once their twins have answered, the server
    takes them back from its buffer: the slow worker does not run them after its first
    round (it would hold them until 12 s)."""
    fast = far("far-fast", "--sim-latency-ms", "20")
    slow = far("far-laggard", "--sim-latency-ms", "6000")
    started = time.monotonic()
    run = finish(launch(question=_batch_program(80), venues=["far"]), timeout=120)

    assert run.status == "succeeded", run.error
    assert run.answer == "80"
    events = trace(run)
    hedges = [e for e in named(events, "SubQuery.Hedge") if e["attrs"].get("queued")]
    assert any(e["attrs"]["hedged_worker"] == slow.worker_id for e in hedges), hedges
    assert fast.worker_id in {e["worker_id"] for e in named(events, "SubQuery.Execute", "end")}
    first = min(e["ts"] for e in named(events, "SubQuery.Submit", "start"))
    last = max(e["ts"] for e in named(events, "SubQuery.Return"))
    assert (last - first) / 1e9 < 7.0, (last - first) / 1e9
    # Its first round ends at about 6 s; the buffer it held was taken back, so it is idle
    # a heartbeat or two later (it ran them until 12 s before the server took them back).
    assert (slow.entry() or {}).get("inflight", 0) > 0  # still in its first round
    wait_until(
        lambda: (slow.entry() or {}).get("inflight") == 0,
        timeout=max(1.0, started + 9.5 - time.monotonic()),
        what="the slow worker to be idle after its first round",
    )


def test_a_queued_job_the_conductor_cancels_is_taken_back_from_the_buffer(web, venues) -> None:
    """A worker of 2 slots holds 1 job queued. Once the conductor cancels it (its hedge's
    twin answered), the server takes it back (`cancel`, within a heartbeat), fills its
    place, and holds it no more: when the worker is lost, it is not among the jobs handed
    back."""
    wid, key = _registered("taken-back", concurrency=2)
    run_id = "rtakeback" + os.urandom(4).hex()
    for i in range(1, 6):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert _hello(ws, wid, key, 3)["buffer"] == 1
        jobs = {j["sq_id"]: j for j in _jobs(_next(ws, {"jobs"}))}
        (queued,) = [sq for sq, j in jobs.items() if j.get("queued")]
        get_redis().sadd(cancelled_key(run_id), queued)
        got = _next(ws, {"cancel", "jobs"}, wait_s=5)
        refill = _jobs([m for m in got if m["type"] == "jobs"])
        held = set(jobs) - {queued} | {j["sq_id"] for j in refill}
    cancels = [m for m in got if m["type"] == "cancel"]
    assert [m["jobs"] for m in cancels] == [[{"run_id": run_id, "sq_id": queued}]]
    assert len(refill) == 1 and refill[0]["queued"] is True  # its place, filled
    wait_until(
        lambda: {sq for st, sq in _claims(run_id) if st == "lost"} == held,
        timeout=10,
        what="the lost hints, without the job taken back",
    )


# --- what a hostile worker can send ---------------------------------------------------------
def _registered(
    name: str, venue: str = "hostile", concurrency: int = 2, models: list[str] | None = None
) -> tuple[str, object]:
    """A worker registered in `venue` (untrusted), and its key."""
    key = keys.generate()
    Venue.objects.get_or_create(name=venue, defaults={"kind": "edge", "trusted": False})
    worker = worker_register(
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


def _hello(ws, worker_id: str, key, version: int | None = None) -> dict:
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


def test_a_worker_must_sign_the_challenge_and_a_failure_is_no_strike(web, venues) -> None:
    victim, _ = _registered("victim")
    _, stranger = _registered("stranger")
    with connect(ws_url(web), open_timeout=10) as ws:
        answer = _hello(ws, victim, stranger)  # signed with another worker's key
    assert answer["type"] == "error"
    assert "does not match this worker's registered key" in answer["error"]
    assert get_redis().get(strikes_key(victim)) is None

    with connect(ws_url(web), open_timeout=10) as ws:
        challenge = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "beat", "figures": {}}))  # skipping the hello
        answer = json.loads(ws.recv(timeout=10))
    assert challenge["type"] == "challenge" and answer["type"] == "error"


def test_json_nested_too_deeply_is_refused_as_a_protocol_error(web, venues) -> None:
    """2 KB of brackets before the hello closed the socket with 1011, an internal error
    (RecursionError in the decoder, found by a review); it is a 4400 with the reason."""
    with connect(ws_url(web), open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "challenge"
        ws.send("[" * 1100 + "]" * 1100)
        answer = json.loads(ws.recv(timeout=10))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert answer["type"] == "error" and "nested too deeply" in answer["error"]
    assert closed.value.rcvd.code == 4400


def test_a_worker_sees_no_prompt_but_those_of_its_own_queues(web, venues) -> None:
    """Connected and authenticated while another venue's run fans out: nothing but pings."""
    wid, key = _registered("eavesdropper")
    seen: list[str] = []
    with connect(ws_url(web), open_timeout=10) as ws:
        assert _hello(ws, wid, key)["type"] == "welcome"
        run = launch(task="sniah", tokens=60_000, seed=3)  # on local and edge
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.done:
                break
            try:
                seen.append(json.loads(ws.recv(timeout=0.5))["type"])
            except TimeoutError:
                continue
    assert run.status == "succeeded" and run.subqueries > 0
    assert set(seen) <= {"ping"}, seen


def test_failed_hellos_are_throttled_per_address(web, venues, api_failures_cleared) -> None:
    """Unauthenticated failures count against the address, as on the worker API: past the
    limit the gateway refuses before it checks anything, and the worker has no strike."""
    victim, _ = _registered("throttled")
    _, stranger = _registered("guesser")
    for _ in range(settings.FRLM_API_FAIL_LIMIT):
        with connect(ws_url(web), open_timeout=10) as ws:
            assert _hello(ws, victim, stranger)["type"] == "error"
    with connect(ws_url(web), open_timeout=10) as ws:
        refused = json.loads(ws.recv(timeout=10))
    assert refused["type"] == "error" and "too many requests" in refused["error"]
    assert "Retry-After" in refused["fix"]
    assert get_redis().get(strikes_key(victim)) is None


def test_a_worker_answers_and_reports_only_for_jobs_it_holds(web, venues) -> None:
    """A registered, authenticated worker claims another's job, forges events of the run,
    and reports a Run.Done: none of it reaches the run's streams."""
    run = finish(launch(task="sniah", tokens=20_000, seed=2))
    wid, key = _registered("claimer")
    client = get_redis()
    results_before = client.xlen(results_stream(run.id))
    events_before = client.xlen(EVENTS_STREAM)
    with connect(ws_url(web), open_timeout=10) as ws:
        assert _hello(ws, wid, key)["type"] == "welcome"
        for status in ("started", "ok", "cancelled"):
            ws.send(
                json.dumps(
                    {
                        "type": "done",
                        "sq_id": "1.1",
                        "result": {
                            "run_id": run.id,
                            "sq_id": "1.1",
                            "status": status,
                            "worker_id": "wsomeoneelse",
                            "text": "forged",
                        },
                    }
                )
            )
        ws.send(json.dumps({"type": "began", "sq_id": "1.1", "events": [{"name": "Run.Done"}]}))
        time.sleep(0.5)
    assert client.xlen(results_stream(run.id)) == results_before
    forged = [
        fields
        for _, fields in client.xrange(EVENTS_STREAM, "-", "+")[events_before:]
        if run.id.encode() in fields[b"e"] and b"Run.Done" in fields[b"e"]
    ]
    assert forged == []


# --- batches (protocol version 2) -------------------------------------------------------
def _job(run_id: str, sq_id: str) -> dict:
    return {
        "run_id": run_id,
        "sq_id": sq_id,
        "submit_span": "s" * 16,
        "prompt": f"question {sq_id}",
        "model": ModelSpec("sim", "frlm-sim-worker", "").to_dict(),
        "deadline": time.time() + 120,
        "depth": 1,
        "timeout_s": 60,
        "attempt": 1,
    }


def _queue_job(queue: str, run_id: str, sq_id: str) -> None:
    """A sub-query job pushed onto `queue` as the conductor pushes one."""
    subquery_execute.apply_async(args=[_job(run_id, sq_id)], queue=queue, declare=[])


def _next(ws, kinds: set[str], *, wait_s: float = 20) -> list[dict]:
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


def _jobs(messages: list[dict]) -> list[dict]:
    return [j for m in messages for j in (m["jobs"] if m["type"] == "jobs" else [m["job"]])]


def _answer(job: dict, worker_id: str, key, **changes) -> dict:
    """A worker's signed answer to `job` and the end of its Execute span, as the agent
    sends them; `changes` alter the result after it is signed."""
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


def _execute_events(run_id: str, enough: Callable[[list[dict]], bool], what: str) -> list[dict]:
    """The run's Execute span events, once the recorder has stored `enough` of them."""

    def stored() -> list[dict] | None:
        events = [e for e in store.read_events(run_id) if e["name"] == "SubQuery.Execute"]
        return events if enough(events) else None

    return wait_until(stored, timeout=20, what=what)


def _execute_ends(run_id: str, sq_ids: set[str]) -> dict[str, dict]:
    """The Execute spans' ends of these sub-queries, once the recorder has stored them."""

    def ends(events: list[dict]) -> dict[str, dict]:
        return {e["attrs"]["sq_id"]: e for e in events if e["phase"] == "end"}

    events = _execute_events(
        run_id, lambda got: sq_ids <= set(ends(got)), f"the Execute ends of {sorted(sq_ids)}"
    )
    return ends(events)


def test_a_worker_of_version_2_gets_jobs_together_and_an_older_one_one_a_message(
    web, venues
) -> None:
    for version, kind in ((2, "jobs"), (None, "job")):
        wid, key = _registered(f"batch-{kind}", concurrency=4)
        run_id = "rbatch" + os.urandom(4).hex()
        for i in range(1, 5):
            _queue_job(worker_queue(wid), run_id, f"{i}.1")
        with connect(ws_url(web), open_timeout=10) as ws:
            assert _hello(ws, wid, key, version)["type"] == "welcome"
            messages = _next(ws, {"job", "jobs"})
        assert {m["type"] for m in messages} == {kind}
        assert sorted(j["sq_id"] for j in _jobs(messages)) == ["1.1", "2.1", "3.1", "4.1"]
        if kind == "jobs":
            assert len(messages) < 4  # popped and sent together, not one by one


def test_a_bundle_that_reaches_a_gateway_workers_queue_is_sent_as_its_jobs(web, venues) -> None:
    """The conductor bundles only a broker worker's jobs, by what presence said last; a
    bundle that reaches a gateway worker all the same (a heartbeat of the other kind in
    between) was dropped as "not a sub-query task", its jobs left to time out."""
    from workers import wire

    wid, key = _registered("bundled", concurrency=4)
    run_id = "rbundle" + os.urandom(4).hex()
    jobs = [_job(run_id, f"{i}.1") for i in (1, 2, 3)]
    wire.push(
        get_redis(),
        [(worker_queue(wid), jobs, f"[{run_id} sub-queries 1.1 2.1 3.1]")],
        expires_s=60,
        reply_to="test",
        sender=wire.origin(),
        per_trip=8,
    )
    with connect(ws_url(web), open_timeout=10) as ws:
        assert _hello(ws, wid, key, 3)["type"] == "welcome"
        messages = _next(ws, {"job", "jobs"})
    assert sorted(j["sq_id"] for j in _jobs(messages)) == ["1.1", "2.1", "3.1"]


def _claims(run_id: str) -> list[tuple[str, str]]:
    """(status, sq_id) of what the run's results stream says, in order."""
    return [
        (f[b"status"].decode(), f[b"sq_id"].decode())
        for _, f in get_redis().xrange(results_stream(run_id), "-", "+")
    ]


def test_a_worker_of_version_3_holds_a_buffer_and_its_queued_jobs_start_when_it_says(
    web, venues
) -> None:
    """A worker of 4 slots gets 2 jobs more than its slots, marked queued: the conductor is
    told it holds them (`queued`), not that they started, and no Execute span opens for
    them until the worker says it started one. A start said of a job that is not queued or
    not its own changes nothing; a queued job answered without its start said gets its
    span opened then; a lost worker's queued jobs are handed back with no span ended."""
    wid, key = _registered("buffered", concurrency=4)
    run_id = "rbuffer" + os.urandom(4).hex()
    for i in range(1, 9):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        welcome = _hello(ws, wid, key, 3)
        assert welcome["buffer"] == 2
        jobs = {j["sq_id"]: j for j in _jobs(_next(ws, {"jobs"}))}
        assert len(jobs) == 6
        queued = sorted(sq for sq, j in jobs.items() if j.get("queued"))
        running = sorted(set(jobs) - set(queued))
        assert len(queued) == 2
        wait_until(lambda: len(_claims(run_id)) >= 6, timeout=10, what="the claims")
        assert sorted(_claims(run_id)) == sorted(
            [("started", sq) for sq in running] + [("queued", sq) for sq in queued]
        )
        # Starts said of a running job and of a job never given: nothing.
        ws.send(
            json.dumps(
                {
                    "type": "results",
                    "results": [
                        {"sq_id": running[0], "run_id": run_id, "started": True},
                        {"sq_id": "9.1", "run_id": run_id, "started": True},
                    ],
                }
            )
        )
        # A slot frees: its result goes with the start of the first queued job.
        first, second = queued
        ws.send(
            json.dumps(
                {
                    "type": "results",
                    "results": [
                        _answer(jobs[running[0]], wid, key),
                        {"sq_id": first, "run_id": run_id, "started": True},
                    ],
                }
            )
        )
        (refill,) = _jobs(_next(ws, {"jobs"}))
        assert refill["queued"] is True  # 4 running again, 1 queued: the buffer has room
        # The second queued job answered without its start said.
        ws.send(json.dumps({"type": "results", "results": [_answer(jobs[second], wid, key)]}))
        (last,) = _jobs(_next(ws, {"jobs"}))
        assert last["queued"] is True
        wait_until(
            lambda: ("ok", second) in _claims(run_id), timeout=10, what="the second's answer"
        )
    after = _claims(run_id)[6:]
    assert ("started", running[0]) not in after and ("started", "9.1") not in after
    assert ("started", first) in after and ("ok", running[0]) in after
    assert ("started", second) not in after  # answered: its start is moot
    # Lost: every job it held is handed back, the queued ones too.
    held = {*running[1:], first, refill["sq_id"], last["sq_id"]}
    wait_until(
        lambda: {sq for st, sq in _claims(run_id) if st == "lost"} == held,
        timeout=10,
        what="the lost hints",
    )
    # Starts: the 4 running, the first queued, the second; ends: 2 answers, 4 abandoned.
    time.sleep(1)  # nothing more is due: anything else would be stored by then
    events = _execute_events(run_id, lambda got: len(got) >= 12, "12 Execute events")
    assert len(events) == 12
    starts = {e["attrs"]["sq_id"] for e in events if e["phase"] == "start"}
    assert starts == {*running, first, second}  # never the last two, which never started
    abandoned = {e["attrs"]["sq_id"] for e in events if e["status"] == "abandoned"}
    assert abandoned == {*running[1:], first}


def test_a_result_that_breaks_the_protocol_is_refused_alone_and_the_rest_relayed(
    web, venues
) -> None:
    """One `results` message: two sound results, one with a status no result has, one
    reporting an event of another kind, one for a job never given. The sound ones reach
    the run's stream; each other one is named in `refused` with its error, the jobs it
    held are ended (their slots free, their Execute spans closed as errors), and the
    connection stays open."""
    wid, key = _registered("refusee", concurrency=4)
    run_id = "rrefuse" + os.urandom(4).hex()
    for i in range(1, 5):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert _hello(ws, wid, key, 2)["type"] == "welcome"
        jobs = {j["sq_id"]: j for j in _jobs(_next(ws, {"jobs"}))}
        assert sorted(jobs) == ["1.1", "2.1", "3.1", "4.1"]
        forged_event = _answer(jobs["3.1"], wid, key)
        forged_event["events"].append({"name": "Run.Done", "parent_id": "x"})
        never_given = _answer({**jobs["1.1"], "sq_id": "9.1"}, wid, key)
        items = [
            _answer(jobs["1.1"], wid, key),
            _answer(jobs["2.1"], wid, key, status="finished"),
            forged_event,
            never_given,
            _answer(jobs["4.1"], wid, key),
        ]
        ws.send(json.dumps({"type": "results", "results": items}))
        (refused,) = _next(ws, {"refused", "error"})
        # The refused jobs' slots are free again: four more jobs fill all four.
        for i in range(5, 9):
            _queue_job(worker_queue(wid), run_id, f"{i}.1")
        more = _jobs(_next(ws, {"job", "jobs"}))

    assert refused["type"] == "refused", refused
    why = {r["sq_id"]: r["error"] for r in refused["results"]}
    assert set(why) == {"2.1", "3.1", "9.1"}
    assert "status must be ok, error or cancelled" in why["2.1"]
    assert "a worker reports only" in why["3.1"]
    assert "holds no job '9.1'" in why["9.1"]
    assert "workers/gateway/protocol.py" in refused["fix"]
    assert sorted(j["sq_id"] for j in more) == ["5.1", "6.1", "7.1", "8.1"]
    entries = get_redis().xrange(results_stream(run_id), "-", "+")
    answered = {
        f[b"sq_id"].decode(): f[b"worker_id"].decode()
        for _, f in entries
        if f[b"status"] not in (b"started", b"lost", b"refused")  # lost: the last four
    }
    assert answered == {"1.1": wid, "4.1": wid}
    # The conductor is told of each held job whose result was refused (9.1 was never held).
    told = {f[b"sq_id"].decode(): f for _, f in entries if f[b"status"] == b"refused"}
    assert set(told) == {"2.1", "3.1"}
    assert all(f[b"worker_id"].decode() == wid for f in told.values())
    assert b"status must be ok, error or cancelled" in told["2.1"][b"error"]
    ends = _execute_ends(run_id, {f"{i}.1" for i in range(1, 9)})
    assert {sq: ends[sq]["status"] for sq in ("1.1", "2.1", "3.1", "4.1")} == {
        "1.1": "ok",
        "2.1": "error",
        "3.1": "error",
        "4.1": "ok",
    }
    assert ends["2.1"]["attrs"]["error"].startswith("refused: ")
    assert all(e["worker_id"] == wid and e["venue"] == "hostile" for e in ends.values())
    # The last four were held when the connection closed: ended as abandoned.
    assert {ends[sq]["status"] for sq in ("5.1", "6.1", "7.1", "8.1")} == {"abandoned"}


def _serve(ws, run, worker_id: str, key, forge: set[str]) -> dict[str, dict]:
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
        jobs = _jobs(_next(ws, {"job", "jobs"}, wait_s=1))
        items = []
        for job in jobs:
            forged = job["sq_id"] in forge and job["sq_id"] not in answered
            items.append(_answer(job, worker_id, stranger if forged else key))
            answered[job["sq_id"]] = job
        if items:
            ws.send(json.dumps({"type": "results", "results": items}))
    raise AssertionError(f"run {run.id} did not finish")


def _first_batch(ws, wid: str, key, venue: str, *, seed: int, timeout_s: float):
    """Say hello as a version-2 worker, launch a fragment run on `venue` (no hedging), and
    take the first jobs it sends: (the run, those jobs)."""
    assert _hello(ws, wid, key, 2)["type"] == "welcome"
    policy = {"subquery_timeout_s": timeout_s, "hedge": "off"}
    run = launch(task="sniah", tokens=60_000, seed=seed, venues=[venue], policy=policy)
    return run, _jobs(_next(ws, {"job", "jobs"}))


def test_a_forged_signature_in_a_batch_loses_only_that_result(web, venues) -> None:
    """Signatures are checked one result at a time by the conductor, batch or not: the
    forged one is rejected (and its worker struck), the others in the same message count."""
    wid, key = _registered("forger", venue="batchsig", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = _first_batch(ws, wid, key, "batchsig", seed=4, timeout_s=4)
        assert len(first) >= 2, first
        forged = first[0]["sq_id"]
        stranger = keys.generate()
        items = [_answer(job, wid, stranger if job is first[0] else key) for job in first]
        ws.send(json.dumps({"type": "results", "results": items}))
        answered = _serve(ws, run, wid, key, forge=set())

    events = trace(run)
    rejected = [e for e in named(events, "SubQuery.Return") if e["status"] == "rejected"]
    assert [(e["attrs"]["sq_id"], e["worker_id"]) for e in rejected] == [(forged, wid)]
    assert "signature is not worker" in rejected[0]["attrs"]["reason"]
    accepted = [
        e for e in named(events, "SubQuery.Return") if e["status"] == "ok" and e["worker_id"] == wid
    ]
    assert len(accepted) >= len(first) - 1 + len(answered) > 0
    assert get_redis().get(strikes_key(wid)) is not None


def test_a_refused_result_sends_its_job_elsewhere_at_once_not_at_its_timeout(web, venues) -> None:
    """A result the gateway refuses never reaches the conductor; the gateway tells it the
    job's holder will not answer, so the job is tried again now (a SubQuery.Retry naming
    the refusal) instead of when its sub-query timeout (60 s here) runs out."""
    wid, key = _registered("refused-retry", venue="refretry", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = _first_batch(ws, wid, key, "refretry", seed=5, timeout_s=60)
        items = [
            _answer(job, wid, key, status="finished" if job is first[0] else "ok") for job in first
        ]
        sent_at = time.time()
        ws.send(json.dumps({"type": "results", "results": items}))
        _serve(ws, run, wid, key, forge=set())
        took = time.time() - sent_at

    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert took < 30, f"the run waited {took:.0f} s: the refused job sat out its timeout"
    retries = [e for e in named(trace(run), "SubQuery.Retry") if "refused" in e["attrs"]["reason"]]
    assert retries, "the refused job was not tried again"
    assert "status must be ok, error or cancelled" in retries[0]["attrs"]["reason"]
    assert retries[0]["ts"] / 1e9 - sent_at < 10


def test_a_result_with_impossible_figures_is_refused_alone_and_a_claim_is_paid_at_price(
    web, venues
) -> None:
    """Found by a review, each from one hostile worker: tokens of 1.5 failed the whole batch
    (ValueError out of decode_result, "internal error in llm_query_batched" as the answer of
    a run that "succeeded"); a claimed cost of 1e400 dollars (not signed: the worker's
    report) was paid, and stored as Inf, which broke every page that sums costs. The bad
    reply is refused and struck and its job tried again at once; a claim is paid at most
    what the worker's price makes of its signed token counts."""
    wid, key = _registered("malformed", venue="malformed", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = _first_batch(ws, wid, key, "malformed", seed=6, timeout_s=60)
        assert len(first) >= 4, first
        bad = {
            first[0]["sq_id"]: {"tokens_in": 1.5},
            first[1]["sq_id"]: {"ms": "abc"},
            first[2]["sq_id"]: {"cost": "1e400"},
        }
        items = [_answer(job, wid, key, **bad.get(job["sq_id"], {})) for job in first]
        items[3]["result"]["cost"] = "123456"  # within bounds, far above its price
        sent_at = time.time()
        ws.send(json.dumps({"type": "results", "results": items}))
        _serve(ws, run, wid, key, forge=set())
        took = time.time() - sent_at

    run.refresh_from_db()
    assert run.status == "succeeded" and "internal error" not in run.answer, run.answer[:300]
    assert took < 30, f"the run waited {took:.0f} s: the refused jobs sat out their timeout"
    assert run.cost < 1, run.cost  # the 123456 claim paid at the worker's price
    events = trace(run)
    rejected = [e for e in named(events, "SubQuery.Return") if e["status"] == "rejected"]
    assert sorted(e["attrs"]["sq_id"] for e in rejected) == sorted(bad)
    assert all("sent a malformed result" in e["attrs"]["reason"] for e in rejected)
    assert get_redis().get(strikes_key(wid)) is not None
    receipts = [e for e in events if e["name"] == "Receipt.Emit"]
    assert receipts and all(
        Decimal(e["attrs"]["receipt"]["paid"]) < Decimal("0.01") for e in receipts
    )


def test_a_claim_is_priced_by_the_model_asked_for_and_its_tokens_by_its_text(web, venues):
    """A hostile review: a worker listing an unpriced model first and no price of its own
    had its $999,999 claims, with 1,000,000 signed tokens, paid in full, a $1 budget or
    not. The job's model prices it, and the tokens count at most what the prompt and the
    reply could hold."""
    wid, key = _registered(
        "claimer-x", venue="pricey", concurrency=4, models=["zzz-unpriced", "frlm-sim-worker"]
    )
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = _first_batch(ws, wid, key, "pricey", seed=8, timeout_s=60)
        items = []
        for job in first:
            item = _answer(job, wid, key)
            claim = {k: v for k, v in item["result"].items() if k != "sig"}
            claim.update(tokens_in=1_000_000, tokens_out=1_000_000, cost="999999")
            item["result"] = {**claim, "sig": signing.result_sign(key, claim)}
            items.append(item)
        ws.send(json.dumps({"type": "results", "results": items}))
        _serve(ws, run, wid, key, forge=set())
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.cost < 1, run.cost
    receipts = [e for e in trace(run) if e["name"] == "Receipt.Emit"]
    assert receipts and all(
        Decimal(e["attrs"]["receipt"]["paid"]) < Decimal("0.05") for e in receipts
    )


def test_an_event_the_recorder_would_refuse_is_refused_with_its_result() -> None:
    """Relayed as they were, events of ts 10**30 or ms "abc" were dead-lettered by the
    recorder and left the job's Execute span open in the trace (found by a review)."""
    job = relay.Held("r1", "1.1", "a" * 16, "b" * 16, 0, "frlm-sim-worker")
    end = {
        "name": "SubQuery.Execute",
        "phase": "end",
        "span_id": "b" * 16,
        "parent_id": "a" * 16,
        "ts": time.time_ns(),
        "status": "ok",
        "depth": 0,
        "ms": 1.0,
    }
    assert relay.worker_events([end], job, "edge", "w1")[0]["ms"] == 1.0
    for bad in ({"ts": 10**30}, {"depth": 10**30}, {"ms": "abc"}, {"bytes": "zz"}):
        with pytest.raises(relay.ProtocolError, match="does not fit the trace|must be a number"):
            relay.worker_events([{**end, **bad}], job, "edge", "w1")
    # A hostile review stored 30 MB of attributes in one span, and a cost of 1e308.
    reply = "4417" * 1000
    honest = {
        **end,
        "cost": 0.0002,
        "payload_ref": hashlib.sha256(reply.encode()).hexdigest(),
        "attrs": {"model_ms": 1.0, "_payload": reply},
    }
    assert relay.worker_events([honest], job, "edge", "w1")[0]["attrs"]["model_ms"] == 1.0
    for bad, says in (
        ({"attrs": {"blob": "A" * 20_000}}, "attributes are 20,0"),
        ({"attrs": {"_payload": "A" * 2_000_000}}, "over the reply cap"),
        ({"cost": 1e308}, "cost must be a number from 0 to 1000000"),
        ({"tokens_in": -1}, "tokens_in must be a number"),
    ):
        with pytest.raises(relay.ProtocolError, match=says):
            relay.worker_events([{**end, **bad}], job, "edge", "w1")


def test_a_started_item_naming_no_string_ids_changes_nothing() -> None:
    """A list for an id was unhashable and took the worker's socket down (a review)."""
    assert relay.started({"started": True, "run_id": 5, "sq_id": []}, {}) is None
    assert relay.started({"started": True, "run_id": "r", "sq_id": {"a": 1}}, {}) is None


def test_a_workers_buffer_is_its_share_of_its_slots_at_least_one_or_none() -> None:
    assert [buffer_for(slots, 0.5) for slots in (1, 2, 8, 9)] == [1, 1, 4, 4]
    assert buffer_for(8, 0.0) == 0  # FRLM_GATEWAY_BUFFER=0: one job per slot
    assert buffer_for(4, 2.0) == 8


def test_batches_keep_each_message_within_the_size_limit() -> None:
    parts = [json.dumps({"n": i, "text": "x" * 30}) for i in range(10)]
    messages = batches(parts, '"type":"jobs","jobs":', limit=200)
    assert all(len(m) <= 200 for m in messages) and len(messages) > 1
    decoded = [json.loads(m) for m in messages]
    assert {d["type"] for d in decoded} == {"jobs"}
    assert [j["n"] for d in decoded for j in d["jobs"]] == list(range(10))
    (alone,) = batches(['"' + "y" * 300 + '"'], '"type":"jobs","jobs":', limit=200)
    assert json.loads(alone)["jobs"] == ["y" * 300]  # larger than the limit: sent alone


# --- the model endpoint is the worker's own -------------------------------------------------
def test_a_job_cannot_name_the_endpoint_a_worker_calls() -> None:
    decoy = ModelSpec("openai", "m", "http://attacker.example/v1")
    with pytest.raises(ModelError, match="not one of this worker's endpoints"):
        served(decoy)
    # The simulated model is always this worker's own, whatever address the job names.
    assert served(ModelSpec("sim", "s", "http://attacker.example/v1")).base_url == (
        settings.FRLM_SIM_URL
    )


def test_a_run_naming_another_endpoint_for_its_workers_sends_them_nothing(venues) -> None:
    with endpoint(lambda _: (200, b"{}")) as (url, seen):
        run = finish(launch(task="sniah", tokens=20_000, seed=2, worker_base_url=url))
    assert run.status == "succeeded" and run.correct is True, run.error
    assert seen == []


def test_the_gateway_path_is_the_documented_one() -> None:
    assert ws_url("http://10.0.0.5:8000/") == "ws://10.0.0.5:8000/ws/workers/gateway"
    assert ws_url("https://frlm.example") == "wss://frlm.example/ws/workers/gateway"


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


def test_a_server_that_refuses_the_host_name_gets_a_hint() -> None:
    from workers.client import ControlError, HttpControl

    with endpoint(lambda _: (400, b"<h1>Bad Request (400)</h1>")) as (url, _):
        control = HttpControl(url.removesuffix("/v1"), "frlmt_x", keys.generate())
        with pytest.raises(ControlError) as refused:
            control.register({"name": "n", "venue": "v"})  # type: ignore[typeddict-item]
    assert "add the host of --server (127.0.0.1) to FRLM_ALLOWED_HOSTS" in str(refused.value)


def test_killing_the_web_server_ends_the_spans_of_the_jobs_it_held(venues, tmp_path) -> None:
    """The gateway opens and ends its workers' Execute spans itself; killed with -9 it ended
    none, and they stayed open for good (a review): the conductor, told of each span as
    the job started, ends them as abandoned when it finds the worker gone."""
    from tests.ownstack import open_spans, own_stack

    with own_stack(tmp_path, [], web=True) as own:
        server = f"http://127.0.0.1:{own.web_port}"
        worker = GatewayWorker(
            server, "far", "far-orphaned", tmp_path, "--concurrency", "4",
            "--sim-latency-ms", "3000",
        )  # fmt: skip
        try:
            from workers.venues import live_workers

            wait_until(
                lambda: any(w["label"] == "far-orphaned" for w in live_workers(own.client, "far")),
                timeout=60,
                what="the worker in the own stack's presence",
            )
            from runs.services import ContextSpec, run_create
            from workers.backends import model_spec

            run = run_create(
                question=scripted("rs = llm_query_batched(['q %d' % i for i in range(8)])",
                                  "FINAL('x')"),
                context=ContextSpec(text="x"), policy={"hedge": "off"},
                root_model=model_spec("sim", role="root"),
                worker_model=model_spec("sim", role="worker"), venues=["far"],
            )  # fmt: skip
            own.launch_run(run.id)

            def executing() -> bool:
                return any(e["name"] == "SubQuery.Execute" for e in own.events(run.id))

            wait_until(executing, timeout=60, what="the worker to run a job")
            own.kill("web", signal.SIGKILL)
            wait_until(
                lambda: not [e for e in open_spans(own.events(run.id)) if e["name"] ==
                             "SubQuery.Execute"],
                timeout=60, what="the held jobs' Execute spans ended",
            )  # fmt: skip
            ends = [
                e
                for e in own.events(run.id)
                if e["name"] == "SubQuery.Execute" and e["phase"] == "end"
            ]
            assert ends and {e["status"] for e in ends} == {"abandoned"}, ends
        finally:
            worker.kill()
