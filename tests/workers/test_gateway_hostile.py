"""A hostile gateway worker (a review): what it can do to other workers' jobs and to the
server's state with the protocol's `returned` message."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import websockets
from websockets.sync.client import connect

from frlm_web.redis_client import get_redis
from tests.gateway import (
    jobs_in,
    named,
    next_messages,
    registered_worker,
    say_hello,
    signed_answer,
)
from tests.helpers import launch, trace, wait_until
from traces import store
from workers.gateway.agent import ws_url
from workers.jobs import encode_result, results_stream
from workers.venues import live_workers

pytestmark = pytest.mark.timeout(300)


def tend(socks, seconds: float, *, quiet: frozenset[int] = frozenset()) -> list[dict]:
    """Keep scripted workers present for `seconds`: each answers the server's pings and
    beats (presence lapses after FRLM_VENUE_HEARTBEAT_TTL_S without beats); the jobs they
    are sent, each tagged with the index of its socket."""
    got: list[dict] = []
    deadline = time.monotonic() + seconds
    while True:
        for i, ws in enumerate(socks):
            try:
                if i not in quiet:  # a quiet one answers pings only
                    beat = {"type": "beat", "figures": {"inflight": 0, "memory_mb": 1.0}}
                    ws.send(json.dumps(beat))
                for message in next_messages(ws, {"job", "jobs"}, wait_s=0.25):
                    for job in jobs_in([message]):
                        got.append({**job, "_sock": i})
            except websockets.exceptions.ConnectionClosed:
                time.sleep(0.25)  # closed by the server: nothing more comes on it
        if time.monotonic() >= deadline:
            return got


def serve_beating(ws, run, worker_id: str, key, limit_s: float = 150) -> None:
    """Answer every job of `run` until it is done, beating meanwhile (serve_run does not
    beat, so over a long run its worker leaves presence)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.done:
            return
        items = [signed_answer(job, worker_id, key) for job in tend([ws], 0.3)]
        if items:
            ws.send(json.dumps({"type": "results", "results": items}))
    raise AssertionError(f"run {run.id} did not finish")


@contextmanager
def welcomed(web: str, *workers: tuple[str, Any]) -> Iterator[list[Any]]:
    """A gateway session for each (worker id, key), welcomed at protocol version 2 (no
    work buffer)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(connect(ws_url(web), open_timeout=10)) for _ in workers]
        for ws, (wid, key) in zip(sockets, workers, strict=True):
            assert say_hello(ws, wid, key, 2)["type"] == "welcome"
        yield sockets


def test_a_worker_cannot_give_back_a_shared_queue_job_another_worker_holds(web, venues) -> None:
    """routing=shared: jobs go on the venue's queue, with no assignee. A second worker of
    the same venue, which never held them, names the jobs the first one holds (their
    sq_ids are "<index>.<attempt>", its run id it learns from any job of the run) in a
    `returned` message. The conductor must not take that as the holder's return: it
    abandons the holder's attempts and sends them again, so the holder's work is thrown
    away (not paid) and, returned again on each attempt, the sub-queries fail."""
    venue = "sharedgb"
    wid, key = registered_worker("sholder", venue=venue, concurrency=16)
    thief, thief_key = registered_worker("sthief", venue=venue, concurrency=1)
    policy = {"subquery_timeout_s": 60, "hedge": "off", "routing": "shared"}
    # Version 2: no work buffer, so the thief holds one job at most.
    with welcomed(web, (wid, key), (thief, thief_key)) as (ws, other):
        tend([ws, other], 1.5)
        run = launch(task="sniah", tokens=60_000, seed=11, venues=[venue], policy=policy)
        got = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got = tend([ws, other], 0.5)
        got += tend([ws, other], 1.0)
        first = [job for job in got if job["_sock"] == 0]
        mine = [job for job in got if job["_sock"] == 1]
        assert first, f"the holder got no job ({len(mine)} for the thief)"
        # Even with the grants the holder's jobs came with (the thief cannot see them): a
        # grant proves the job was given to the worker it was made for.
        jobs = [{k: job[k] for k in ("run_id", "sq_id", "grant")} for job in first]
        other.send(json.dumps({"type": "returned", "jobs": jobs}))
        tend([ws, other], 3.0)  # the conductor reads the returns
        # Their second attempts' ids need no seeing: "<index>.2". Given back too, the
        # sub-queries are out of attempts (max_retries 1).
        again = [
            {"run_id": run.id, "sq_id": j["sq_id"].split(".")[0] + ".2", "grant": "0" * 32}
            for j in first
        ]
        other.send(json.dumps({"type": "returned", "jobs": again}))
        tend([ws, other], 3.0)
        # The holder answers what it was given; the thief too; the holder serves the rest.
        ws.send(
            json.dumps({"type": "results", "results": [signed_answer(j, wid, key) for j in first]})
        )
        if mine:
            other.send(
                json.dumps(
                    {
                        "type": "results",
                        "results": [signed_answer(j, thief, thief_key) for j in mine],
                    }
                )
            )
        other.close()
        serve_beating(ws, run, wid, key)

    run.refresh_from_db()
    events = trace(run)
    held = {job["sq_id"] for job in first}
    failed = [
        e
        for e in named(events, "SubQuery.Submit", "end")
        if e["status"] != "ok" and thief in str(e["attrs"])
    ]
    retried = [
        e
        for e in named(events, "SubQuery.Retry")
        if "returned" in str(e["attrs"].get("reason", "")) and thief in e["attrs"]["reason"]
    ]
    assert not retried, (
        f"a stranger's return of {len(held)} job(s) another worker held sent "
        f"{len(retried)} of them again ({len(failed)} sub-queries failed on its returns; "
        f"run {run.status}): {retried[0]['attrs']['reason'][:60]}"
    )


def test_returns_of_jobs_never_given_do_not_grow_a_runs_stream_without_bound(web, venues) -> None:
    """A run's result stream outlives the run (nothing deletes or trims it). A worker that
    was never given a job of that run sends `returned` for made-up sq_ids: MAX_RESULTS a
    session, and sessions are free (a hello is one signature), so over a few reconnects the
    stream of a run that ended long ago grows by as many entries as it likes."""
    from workers.gateway.protocol import MAX_RESULTS

    run_id = "rold" + time.strftime("%H%M%S") + "x"
    stream = results_stream(run_id)
    client = get_redis()
    client.delete(stream)
    # What a run leaves behind: its stream, with the results it read long ago.
    client.xadd(stream, {"run_id": run_id, "sq_id": "1.1", "status": "ok", "worker_id": "w0"})
    before = client.xlen(stream)
    stranger, key = registered_worker("flooder", venue="flood", concurrency=1)
    sessions = 4
    for session in range(sessions):
        with connect(ws_url(web), open_timeout=10) as ws:
            assert say_hello(ws, stranger, key, 4)["type"] == "welcome"
            jobs = [
                {"run_id": run_id, "sq_id": f"{session}{i}.1", "grant": "0" * 32}
                for i in range(MAX_RESULTS)
            ]
            ws.send(json.dumps({"type": "returned", "jobs": jobs}))
            next_messages(ws, {"nothing"}, wait_s=1.0)  # what it would write is written
    grown = client.xlen(stream) - before
    client.delete(stream)
    assert grown == 0, (
        f"a worker never given a job of run {run_id} added {grown} entries to its result "
        f"stream over {sessions} sessions ({MAX_RESULTS} a session, sessions unlimited)"
    )


def test_a_deregistered_worker_that_never_beats_gets_no_more_jobs(web, venues) -> None:
    """A worker deregistered (over the API, or by its operator) while its gateway session is
    open is refused at its next beat (WorkerGone, 4410). One that never beats again, but
    answers every ping (so it is never silent), keeps its session, and its pump keeps
    taking jobs off its venue's shared queue: jobs the conductor then refuses to hear of
    (their holder is no live worker), which wait out their sub-query timeout."""
    from workers import services
    from workers.models import Worker

    venue = "deregq"
    wid, key = registered_worker("dholder", venue=venue, concurrency=2)
    gone, gone_key = registered_worker("dgone", venue=venue, concurrency=4)
    policy = {"subquery_timeout_s": 30, "hedge": "off", "routing": "shared"}
    with welcomed(web, (wid, key), (gone, gone_key)) as (ws, other):
        tend([ws, other], 1.0)
        services.worker_deregister(Worker.objects.select_related("venue").get(id=gone))
        tend([ws, other], 1.0, quiet=frozenset({1}))
        run = launch(task="sniah", tokens=60_000, seed=12, venues=[venue], policy=policy)
        got: list[dict] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(j["_sock"] == 0 for j in got):
            got += tend([ws, other], 0.5, quiet=frozenset({1}))
        got += tend([ws, other], 2.0, quiet=frozenset({1}))
        taken = [job["sq_id"] for job in got if job["_sock"] == 1]
        run_id = run.id
        t0 = time.monotonic()
        for job in got:
            if job["_sock"] == 0:
                ws.send(json.dumps({"type": "results", "results": [signed_answer(job, wid, key)]}))
        other.close()
        serve_beating(ws, run, wid, key)
        waited = time.monotonic() - t0
    events = trace(run)
    timed_out = sorted({e["attrs"].get("sq_id") for e in named(events, "SubQuery.Timeout")})
    assert not taken, (
        f"worker {gone}, deregistered, was still given {len(taken)} job(s) of run {run_id} "
        f"over its open session: {taken[:6]}; the conductor refused its claims, so "
        f"{timed_out} waited out their {policy['subquery_timeout_s']} s timeout "
        f"(the rest of the run took {waited:.0f} s)"
    )
    # Nor did one it took off the queue unseen (its pump, before the server saw it gone)
    # wait out its timeout: the conductor sends such a job again at once.
    assert not timed_out, f"{timed_out} waited out their timeout (the run took {waited:.0f} s)"


def test_a_shared_queue_job_taken_by_a_worker_no_longer_live_is_sent_again_at_once(
    web, venues
) -> None:
    """routing=shared: a job on a venue's queue has no assignee until a live worker of the
    venue claims it. One taken off the queue by a worker that is no longer live (its
    session's pump popped it in the instant between the worker's deregistration and the
    server noticing) is claimed in a name the conductor refuses. Nobody else can take it
    or answer for it: it must be sent again now, not wait out its sub-query timeout (a
    CI run of the test above took 30 s longer than it should have: this was why). The
    stray pop is made here, by hand, so that the test does not hang on the race."""
    from workers.models import Worker
    from workers.wire import jobs_of

    venue = "sharedst"
    wid, key = registered_worker("stholder", venue=venue, concurrency=1)
    stray, _stray_key = registered_worker("ststray", venue=venue, concurrency=1)
    queue = Worker.objects.select_related("venue").get(id=wid).venue.queue
    policy = {"subquery_timeout_s": 30, "hedge": "off", "routing": "shared"}
    client = get_redis()
    with welcomed(web, (wid, key)) as (ws,):
        tend([ws], 1.0)
        run = launch(task="sniah", tokens=60_000, seed=13, venues=[venue], policy=policy)
        first: list[dict] = []
        deadline = time.monotonic() + 60
        while not first and time.monotonic() < deadline:
            first = tend([ws], 0.3)
        assert first, "the holder got no job"
        # Its one slot is busy: the rest wait on the venue's queue. One is taken off it
        # and claimed in the name of a worker not live in the venue.
        raw = None
        deadline = time.monotonic() + 30
        while raw is None and time.monotonic() < deadline:
            raw = client.rpop(queue)
            if raw is None:
                tend([ws], 0.2)
        assert raw is not None, "nothing waited on the venue's queue"
        (job,) = jobs_of(raw)
        claim = {
            "run_id": job["run_id"],
            "sq_id": job["sq_id"],
            "venue": venue,
            "worker_id": stray,
            "status": "started",
            "span": "0" * 16,
        }
        client.xadd(results_stream(job["run_id"]), encode_result(claim))
        t0 = time.monotonic()
        ws.send(
            json.dumps({"type": "results", "results": [signed_answer(j, wid, key) for j in first]})
        )
        serve_beating(ws, run, wid, key)
        took = time.monotonic() - t0
    run.refresh_from_db()
    events = trace(run)
    timed_out = [e["attrs"].get("sq_id") for e in named(events, "SubQuery.Timeout")]
    assert not timed_out and took < 20, (
        f"the job taken by {stray} ({job['sq_id']}) waited out its timeout: timed out "
        f"{timed_out}, the run took {took:.1f} s more"
    )
    assert run.status == "succeeded", run.error
    rejected = [
        e
        for e in named(events, "SubQuery.Return")
        if e["status"] == "rejected" and e["attrs"].get("sq_id") == job["sq_id"]
    ]
    assert rejected and "not a live worker" in rejected[0]["attrs"]["reason"], rejected


def test_a_worker_that_connects_again_keeps_one_session(web, venues) -> None:
    """A second connection signed with a worker's key while its first is open (a worker
    that connected again before the server saw its old socket drop, or one out to
    multiply its slots): the newer one serves the worker and the older is closed (4409)
    with what to do. Before, both were served, each taking its slots' worth of jobs off
    the queues, and a new session could not put back what its worker's other one held
    unclaimed."""
    from websockets.exceptions import ConnectionClosed

    venue = "twiceq"
    wid, key = registered_worker("twice", venue=venue, concurrency=2)
    with connect(ws_url(web), open_timeout=10) as first:
        assert say_hello(first, wid, key, 2)["type"] == "welcome"
        with connect(ws_url(web), open_timeout=10) as second:
            assert say_hello(second, wid, key, 2)["type"] == "welcome"
            said: list[dict] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    said.append(json.loads(first.recv(timeout=10)))
            errors = [m for m in said if m["type"] == "error"]
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4409, said
            assert errors and "newer connection" in errors[0]["error"], said
            assert "another process holds this worker's key" in errors[0]["fix"]
            live = [w for w in live_workers(get_redis(), venue) if w["worker_id"] == wid]
            assert live and live[0]["connection"] == "gateway", live
            assert json.loads(second.recv(timeout=15))["type"] == "ping"  # served still


def test_a_worker_naming_many_slots_holds_only_what_its_answers_earned(web, venues) -> None:
    """A hostile review registered 1,024 slots on a shared-queue venue, took every job of
    the queue and every retry of those it sat on, answered none, and the runs "succeeded"
    with answers made of timeouts. A worker of an untrusted venue holds at most its credit
    (workers/gateway/credit.py): START jobs at first, one more for each it answers, and the
    next session starts from there, not from START again."""
    from runs.services import run_cancel
    from tests.helpers import scripted
    from workers.gateway.credit import START, credit_key

    venue = "hoarding"
    wid, key = registered_worker("hoarder", venue=venue, concurrency=1024)
    prompts = "rs = llm_query_batched(['q %d' % i for i in range(120)])\nFINAL(repr(rs))"
    policy = {"subquery_timeout_s": 120, "hedge": "off", "routing": "shared"}
    run = None
    try:
        with welcomed(web, (wid, key)) as (ws,):
            tend([ws], 1.5)
            run = launch(question=scripted(prompts), venues=[venue], policy=policy)
            got = tend([ws], 6.0)
            assert len(got) == START, f"it took {len(got)} of 120 jobs, not {START}"
            # Ten answered: ten more places, filled again at once.
            ws.send(
                json.dumps(
                    {"type": "results", "results": [signed_answer(j, wid, key) for j in got[:10]]}
                )
            )
            more = tend([ws], 4.0)
            assert len(more) == 20, f"{len(more)} more jobs after ten answers, not 20"
            # The conductor is told what it may hold: routing sends it no more.
            (seen,) = live_workers(get_redis(), venue)
            assert seen["concurrency"] == START + 10, seen
        kept = str(START + 10).encode()
        wait_until(lambda: get_redis().get(credit_key(wid)) == kept, timeout=20, what="credit")
        with welcomed(web, (wid, key)) as (ws,):
            again = tend([ws], 6.0)
            assert len(again) == START + 10, f"a new session took {len(again)} jobs"
    finally:
        if run is not None:
            run_cancel(run)
        get_redis().delete(credit_key(wid))


def test_jobs_a_worker_sits_on_far_past_their_timeout_are_taken_back_and_cost_it(
    web, venues
) -> None:
    """Held LATE_TIMES its timeout and more, a job is taken back (its Execute span ended
    as abandoned: the conductor sent it elsewhere long ago), and the worker's credit is
    halved for each: a hoarder's 32 places become one."""
    from runs.services import run_cancel
    from tests.helpers import scripted
    from workers.gateway.credit import START, credit_key

    venue = "sitting"
    wid, key = registered_worker("sitter", venue=venue, concurrency=1024)
    prompts = "rs = llm_query_batched(['q %d' % i for i in range(60)])\nFINAL(repr(rs))"
    policy = {"subquery_timeout_s": 0.5, "hedge": "off", "routing": "shared", "max_retries": 0}
    run = None
    try:
        with welcomed(web, (wid, key)) as (ws,):
            tend([ws], 1.5)
            run = launch(question=scripted(prompts), venues=[venue], policy=policy)
            got = tend([ws], 3.0)
            assert len(got) == START
            deadline = time.monotonic() + 40
            while get_redis().get(credit_key(wid)) != b"1":  # present, answering nothing
                assert time.monotonic() < deadline, get_redis().get(credit_key(wid))
                got += tend([ws], 1.0)
            assert len(got) <= START + 1, len(got)
        trace(run)

        def taken() -> list[dict]:
            return [
                e
                for e in named(store.read_events(run.id), "SubQuery.Execute", "end")
                if "taken back by the gateway" in str(e["attrs"].get("error"))
            ]

        back = wait_until(lambda: len(taken()) >= START - 1 and taken(), timeout=30, what="ends")
        assert all(e["status"] == "abandoned" for e in back)
    finally:
        if run is not None:
            run_cancel(run)
        get_redis().delete(credit_key(wid))
