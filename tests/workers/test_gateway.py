"""The worker gateway against the real stack: daphne, Redis, the conductor and `frlm_worker
--server ... --token ...` processes that hold nothing of this machine (tests/gateway.py).
A run over gateway workers is answered from fragments the server reads; a worker proves
its key before it gets anything; it can answer and report only for the jobs it holds; a
dropped worker's jobs go elsewhere at once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from decimal import Decimal

import pytest
import websockets
from django.conf import settings
from websockets.sync.client import connect

from frlm_web.redis_client import get_redis
from tests.gateway import (
    claims,
    first_batch,
    jobs_in,
    named,
    next_messages,
    registered_worker,
    say_hello,
    serve_run,
    signed_answer,
)
from tests.helpers import finish, launch, trace, wait_until
from traces import store
from traces.emitter import EVENTS_STREAM
from workers import keys, signing
from workers.backends import ModelSpec
from workers.gateway.agent import ws_url
from workers.jobs import cancelled_key, results_stream
from workers.models import worker_queue
from workers.reputation import strikes_key
from workers.tasks import subquery_execute

pytestmark = pytest.mark.timeout(240)


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


def test_a_queued_job_the_conductor_cancels_is_taken_back_from_the_buffer(web, venues) -> None:
    """A worker of 2 slots holds 1 job queued. Once the conductor cancels it (its hedge's
    twin answered), the server takes it back (`cancel`, within a heartbeat), fills its
    place, and holds it no more: when the worker is lost, it is not among the jobs handed
    back."""
    wid, key = registered_worker("taken-back", concurrency=2)
    run_id = "rtakeback" + os.urandom(4).hex()
    for i in range(1, 6):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key, 3)["buffer"] == 1
        jobs = {j["sq_id"]: j for j in jobs_in(next_messages(ws, {"jobs"}))}
        (queued,) = [sq for sq, j in jobs.items() if j.get("queued")]
        get_redis().sadd(cancelled_key(run_id), queued)
        got = next_messages(ws, {"cancel", "jobs"}, wait_s=5)
        refill = jobs_in([m for m in got if m["type"] == "jobs"])
        held = set(jobs) - {queued} | {j["sq_id"] for j in refill}
    cancels = [m for m in got if m["type"] == "cancel"]
    assert [m["jobs"] for m in cancels] == [[{"run_id": run_id, "sq_id": queued}]]
    assert len(refill) == 1 and refill[0]["queued"] is True  # its place, filled
    wait_until(
        lambda: {sq for st, sq in claims(run_id) if st == "lost"} == held,
        timeout=10,
        what="the lost hints, without the job taken back",
    )


# --- what a hostile worker can send ---------------------------------------------------------
def test_a_worker_must_sign_the_challenge_and_a_failure_is_no_strike(
    web, venues, api_failures_cleared
) -> None:
    victim, _ = registered_worker("victim")
    _, stranger = registered_worker("stranger")
    with connect(ws_url(web), open_timeout=10) as ws:
        answer = say_hello(ws, victim, stranger)  # signed with another worker's key
    assert answer["type"] == "error"
    assert "does not match this worker's registered key" in answer["error"]
    assert get_redis().get(strikes_key(victim)) is None

    with connect(ws_url(web), open_timeout=10) as ws:
        challenge = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "beat", "figures": {}}))  # skipping the hello
        answer = json.loads(ws.recv(timeout=10))
    assert challenge["type"] == "challenge" and answer["type"] == "error"


def test_json_nested_too_deeply_is_refused_as_a_protocol_error(
    web, venues, api_failures_cleared
) -> None:
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


def test_a_stranger_may_send_nothing_bigger_than_a_hello_and_pays_for_what_it_breaks(
    web, venues, api_failures_cleared
) -> None:
    """A 39 MB message before any hello was parsed whole: the web server grew to 1.1 GB and
    its event loop stood still for 3 s, and a broken message was never counted against its
    address (a review). Before hello a message is a hello's size, and a broken one counts."""
    from workers.gateway.handshake import HELLO_MAX_CHARS
    from workers.services import _fail_key

    big = "[" + ",".join(["{}"] * (HELLO_MAX_CHARS // 3 + 10)) + "]"
    with connect(ws_url(web), open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "challenge"
        ws.send(big)
        answer = json.loads(ws.recv(timeout=10))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert answer["type"] == "error" and closed.value.rcvd.code == 4400
    assert f"before hello a message is at most {HELLO_MAX_CHARS:,} characters" in answer["error"]
    with connect(ws_url(web), open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "challenge"
        ws.send("not json")
        assert json.loads(ws.recv(timeout=10))["type"] == "error"
    # Both count against the address, as failed signatures do.
    assert int(get_redis().get(_fail_key("127.0.0.1")) or 0) == 2


def test_a_worker_sees_no_prompt_but_those_of_its_own_queues(web, venues) -> None:
    """Connected and authenticated while another venue's run fans out: nothing but pings."""
    wid, key = registered_worker("eavesdropper")
    seen: list[str] = []
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key)["type"] == "welcome"
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
    victim, _ = registered_worker("throttled")
    _, stranger = registered_worker("guesser")
    for _ in range(settings.FRLM_API_FAIL_LIMIT):
        with connect(ws_url(web), open_timeout=10) as ws:
            assert say_hello(ws, victim, stranger)["type"] == "error"
    with connect(ws_url(web), open_timeout=10) as ws:
        refused = json.loads(ws.recv(timeout=10))
    assert refused["type"] == "error" and "too many requests" in refused["error"]
    assert "Retry-After" in refused["fix"]
    assert get_redis().get(strikes_key(victim)) is None


def test_a_worker_answers_and_reports_only_for_jobs_it_holds(web, venues) -> None:
    """A registered, authenticated worker claims another's job, forges events of the run,
    and reports a Run.Done: none of it reaches the run's streams."""
    run = finish(launch(task="sniah", tokens=20_000, seed=2))
    wid, key = registered_worker("claimer")
    client = get_redis()
    results_before = client.xlen(results_stream(run.id))
    events_before = client.xlen(EVENTS_STREAM)
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key)["type"] == "welcome"
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
        wid, key = registered_worker(f"batch-{kind}", concurrency=4)
        run_id = "rbatch" + os.urandom(4).hex()
        for i in range(1, 5):
            _queue_job(worker_queue(wid), run_id, f"{i}.1")
        with connect(ws_url(web), open_timeout=10) as ws:
            assert say_hello(ws, wid, key, version)["type"] == "welcome"
            messages = next_messages(ws, {"job", "jobs"})
        assert {m["type"] for m in messages} == {kind}
        assert sorted(j["sq_id"] for j in jobs_in(messages)) == ["1.1", "2.1", "3.1", "4.1"]
        if kind == "jobs":
            assert len(messages) < 4  # popped and sent together, not one by one


def test_a_bundle_that_reaches_a_gateway_workers_queue_is_sent_as_its_jobs(web, venues) -> None:
    """The conductor bundles only a broker worker's jobs, by what presence said last; a
    bundle that reaches a gateway worker all the same (a heartbeat of the other kind in
    between) was dropped as "not a sub-query task", its jobs left to time out."""
    from workers import wire

    wid, key = registered_worker("bundled", concurrency=4)
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
        assert say_hello(ws, wid, key, 3)["type"] == "welcome"
        messages = next_messages(ws, {"job", "jobs"})
    assert sorted(j["sq_id"] for j in jobs_in(messages)) == ["1.1", "2.1", "3.1"]


def test_a_worker_of_version_3_holds_a_buffer_and_its_queued_jobs_start_when_it_says(
    web, venues
) -> None:
    """A worker of 4 slots gets 2 jobs more than its slots, marked queued: the conductor is
    told it holds them (`queued`), not that they started, and no Execute span opens for
    them until the worker says it started one. A start said of a job that is not queued or
    not its own changes nothing; a queued job answered without its start said gets its
    span opened then; a lost worker's queued jobs are handed back with no span ended."""
    wid, key = registered_worker("buffered", concurrency=4)
    run_id = "rbuffer" + os.urandom(4).hex()
    for i in range(1, 9):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        welcome = say_hello(ws, wid, key, 3)
        assert welcome["buffer"] == 2
        jobs = {j["sq_id"]: j for j in jobs_in(next_messages(ws, {"jobs"}))}
        assert len(jobs) == 6
        queued = sorted(sq for sq, j in jobs.items() if j.get("queued"))
        running = sorted(set(jobs) - set(queued))
        assert len(queued) == 2
        wait_until(lambda: len(claims(run_id)) >= 6, timeout=10, what="the claims")
        assert sorted(claims(run_id)) == sorted(
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
                        signed_answer(jobs[running[0]], wid, key),
                        {"sq_id": first, "run_id": run_id, "started": True},
                    ],
                }
            )
        )
        (refill,) = jobs_in(next_messages(ws, {"jobs"}))
        assert refill["queued"] is True  # 4 running again, 1 queued: the buffer has room
        # The second queued job answered without its start said.
        ws.send(json.dumps({"type": "results", "results": [signed_answer(jobs[second], wid, key)]}))
        (last,) = jobs_in(next_messages(ws, {"jobs"}))
        assert last["queued"] is True
        wait_until(lambda: ("ok", second) in claims(run_id), timeout=10, what="the second's answer")
    after = claims(run_id)[6:]
    assert ("started", running[0]) not in after and ("started", "9.1") not in after
    assert ("started", first) in after and ("ok", running[0]) in after
    assert ("started", second) not in after  # answered: its start is moot
    # Lost: every job it held is handed back, the queued ones too.
    held = {*running[1:], first, refill["sq_id"], last["sq_id"]}
    wait_until(
        lambda: {sq for st, sq in claims(run_id) if st == "lost"} == held,
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
    wid, key = registered_worker("refusee", concurrency=4)
    run_id = "rrefuse" + os.urandom(4).hex()
    for i in range(1, 5):
        _queue_job(worker_queue(wid), run_id, f"{i}.1")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key, 2)["type"] == "welcome"
        jobs = {j["sq_id"]: j for j in jobs_in(next_messages(ws, {"jobs"}))}
        assert sorted(jobs) == ["1.1", "2.1", "3.1", "4.1"]
        forged_event = signed_answer(jobs["3.1"], wid, key)
        forged_event["events"].append({"name": "Run.Done", "parent_id": "x"})
        never_given = signed_answer({**jobs["1.1"], "sq_id": "9.1"}, wid, key)
        items = [
            signed_answer(jobs["1.1"], wid, key),
            signed_answer(jobs["2.1"], wid, key, status="finished"),
            forged_event,
            never_given,
            signed_answer(jobs["4.1"], wid, key),
        ]
        ws.send(json.dumps({"type": "results", "results": items}))
        (refused,) = next_messages(ws, {"refused", "error"})
        # The refused jobs' slots are free again: four more jobs fill all four.
        for i in range(5, 9):
            _queue_job(worker_queue(wid), run_id, f"{i}.1")
        more = jobs_in(next_messages(ws, {"job", "jobs"}))

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


def test_a_forged_signature_in_a_batch_loses_only_that_result(web, venues) -> None:
    """Signatures are checked one result at a time by the conductor, batch or not: the
    forged one is rejected (and its worker struck), the others in the same message count."""
    wid, key = registered_worker("forger", venue="batchsig", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "batchsig", seed=4, timeout_s=4)
        assert len(first) >= 2, first
        forged = first[0]["sq_id"]
        stranger = keys.generate()
        items = [signed_answer(job, wid, stranger if job is first[0] else key) for job in first]
        ws.send(json.dumps({"type": "results", "results": items}))
        answered = serve_run(ws, run, wid, key, forge=set())

    events = trace(run)
    rejected = [e for e in named(events, "SubQuery.Return") if e["status"] == "rejected"]
    assert [(e["attrs"]["sq_id"], e["worker_id"]) for e in rejected] == [(forged, wid)]
    assert "signature is not worker" in rejected[0]["attrs"]["reason"]
    accepted = [
        e
        for e in named(events, "SubQuery.Submit", "end")
        if e["status"] == "ok" and e["worker_id"] == wid
    ]
    assert len(accepted) >= len(first) - 1 + len(answered) > 0
    assert get_redis().get(strikes_key(wid)) is not None


def test_a_refused_result_sends_its_job_elsewhere_at_once_not_at_its_timeout(web, venues) -> None:
    """A result the gateway refuses never reaches the conductor; the gateway tells it the
    job's holder will not answer, so the job is tried again now (a SubQuery.Retry naming
    the refusal) instead of when its sub-query timeout (60 s here) runs out."""
    wid, key = registered_worker("refused-retry", venue="refretry", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "refretry", seed=5, timeout_s=60)
        items = [
            signed_answer(job, wid, key, status="finished" if job is first[0] else "ok")
            for job in first
        ]
        sent_at = time.time()
        ws.send(json.dumps({"type": "results", "results": items}))
        serve_run(ws, run, wid, key, forge=set())
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
    wid, key = registered_worker("malformed", venue="malformed", concurrency=8)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "malformed", seed=6, timeout_s=60)
        assert len(first) >= 4, first
        bad = {
            first[0]["sq_id"]: {"tokens_in": 1.5},
            first[1]["sq_id"]: {"ms": "abc"},
            first[2]["sq_id"]: {"cost": "1e400"},
        }
        items = [signed_answer(job, wid, key, **bad.get(job["sq_id"], {})) for job in first]
        items[3]["result"]["cost"] = "123456"  # within bounds, far above its price
        sent_at = time.time()
        ws.send(json.dumps({"type": "results", "results": items}))
        serve_run(ws, run, wid, key, forge=set())
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
    wid, key = registered_worker(
        "claimer-x", venue="pricey", concurrency=4, models=["zzz-unpriced", "frlm-sim-worker"]
    )
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "pricey", seed=8, timeout_s=60)
        items = []
        for job in first:
            item = signed_answer(job, wid, key)
            claim = {k: v for k, v in item["result"].items() if k != "sig"}
            claim.update(tokens_in=1_000_000, tokens_out=1_000_000, cost="999999")
            item["result"] = {**claim, "sig": signing.result_sign(key, claim)}
            items.append(item)
        ws.send(json.dumps({"type": "results", "results": items}))
        serve_run(ws, run, wid, key, forge=set())
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.cost < 1, run.cost
    receipts = [e for e in trace(run) if e["name"] == "Receipt.Emit"]
    assert receipts and all(
        Decimal(e["attrs"]["receipt"]["paid"]) < Decimal("0.05") for e in receipts
    )
