"""Fanout on real venue workers: overlap, quorum and straggler cancellation, timeouts and
retries, a worker killed mid-run, a venue with no live worker."""

from __future__ import annotations

import re
import time

import pytest

from frlm_web.stack import VenueSpec
from runs.cli import format_summary, summarise
from tests.helpers import finish, launch, named, scripted, trace, wait_until
from traces import store
from workers.models import Venue

pytestmark = [pytest.mark.stack]


def overlap(events: list[dict]) -> int:
    """Most Execute spans open at one instant, from their start and end events."""
    edges = sorted(
        [(e["ts"], 1) for e in named(events, "SubQuery.Execute", "start")]
        + [(e["ts"], -1) for e in named(events, "SubQuery.Execute", "end")]
    )
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def batch_program(n: int) -> str:
    return f"rs = llm_query_batched(['question %d' % i for i in range({n})])\nFINAL(repr(rs))"


def test_it_runs_a_batch_in_parallel_across_venues(venues):
    run = finish(launch(question=scripted(batch_program(32)), worker_sim={"latency_ms": 300}))
    assert run.status == "succeeded", run.error
    events = trace(run)
    assert len(named(events, "SubQuery.Execute", "end")) == 32
    assert overlap(events) >= 12  # 16 slots over two venues; one at a time would be 1
    assert {e["venue"] for e in named(events, "SubQuery.Execute", "end")} == {"local", "edge"}
    # 32 sub-queries of 300 ms on 16 slots: about 0.6 s of model time, not 9.6 s.
    assert run.wall_ms < 6000
    # Its result stream is let go once the run is over (every run's stayed for good).
    from frlm_web.redis_client import get_redis
    from runs.engine.fanout.transport import RESULTS_KEEP_S
    from workers.jobs import results_stream

    assert 0 < get_redis().ttl(results_stream(run.id)) <= RESULTS_KEEP_S


def test_a_cancelled_runs_unanswered_sub_queries_count_as_cancelled_not_failed(venues):
    """A user's cancel counted every sub-query not answered yet as failed ("334 (309
    failed)", a review): out or waiting, they are cancelled with the run, on its row, its
    Run.Done and the command's summary, and the trace says why of each."""
    from runs.models import Run
    from runs.services import run_cancel

    run = launch(
        question=scripted(batch_program(12)),
        worker_sim={"latency_ms": 20000},
        # Four out at once: the other eight wait to be sent when the cancel comes.
        policy={"max_inflight": 4, "hedge": "off", "subquery_timeout_s": 60},
    )
    wait_until(
        lambda: len(named(store.read_events(run.id), "SubQuery.Execute", "start")) >= 4,
        timeout=60,
        what="four sub-queries to run",
    )
    run_cancel(run)
    finish(run, timeout=60)
    assert run.status == Run.Status.CANCELLED, (run.status, run.error)
    assert (run.subqueries, run.subqueries_failed, run.subqueries_cancelled) == (12, 0, 12)
    events = trace(run)
    (done,) = named(events, "Run.Done")
    assert (done["attrs"]["subqueries_failed"], done["attrs"]["subqueries_cancelled"]) == (0, 12)
    submits = named(events, "SubQuery.Submit", "end")
    assert len(submits) == 12
    assert all(e["attrs"]["cut"] == "cancel" and e["status"] == "cancelled" for e in submits)
    assert "(0 failed, 12 cancelled with the run)" in format_summary(summarise(run))


def test_it_proceeds_at_quorum_and_cancels_stragglers(venues):
    sim = {"latency_ms": 30, "straggler_rate": 0.3, "straggler_factor": 300, "seed": 4}
    started = time.monotonic()
    run = finish(
        # Hedging would answer the stragglers from twins: this test is about the quorum.
        launch(
            question=scripted(batch_program(20)),
            worker_sim=sim,
            policy={"quorum": 0.6, "hedge": "off"},
        )
    )
    assert run.status == "succeeded", run.error
    assert time.monotonic() - started < 8  # a straggler takes 9 s
    replies = eval(run.answer)  # noqa: S307 (our own repr of a list of str)
    cancelled = [r for r in replies if r.startswith("[frlm:cancelled]")]
    assert cancelled and len(replies) - len(cancelled) >= 12
    events = trace(run)
    cancels = named(events, "SubQuery.Cancel")
    assert len(cancels) == len(cancelled)
    assert all("quorum of 12/20 reached" in e["attrs"]["reason"] for e in cancels)
    # Cut off by design, not failed: the run's row, its Run.Done and the command's summary.
    assert (run.subqueries_failed, run.subqueries_cut) == (0, len(cancelled))
    (done,) = named(events, "Run.Done")
    assert (done["attrs"]["subqueries_failed"], done["attrs"]["subqueries_cut"]) == (
        0,
        len(cancelled),
    )
    assert f"(0 failed, {len(cancelled)} cut off at the quorum)" in format_summary(summarise(run))


def test_it_times_out_retries_elsewhere_and_marks_the_failure(venues):
    sim = {"latency_ms": 3000}
    run = finish(
        launch(
            question=scripted("FINAL(llm_query('slow'))"),
            worker_sim=sim,
            policy={"subquery_timeout_s": 0.5, "max_retries": 1},
        )
    )
    # One llm_query's timeout is its marker (a batch's, all timed out, fails the run).
    assert run.status == "succeeded", run.error
    assert run.answer.startswith("[frlm:timeout] sub-query 1: no reply within 0.5 s")
    events = trace(run)
    assert len(named(events, "SubQuery.Timeout")) == 2
    (retry,) = named(events, "SubQuery.Retry")
    assert retry["attrs"]["from_venue"] != retry["venue"]


def test_it_fails_clearly_when_no_worker_serves_the_venues(venues):
    Venue.objects.create(name="empty")
    run = finish(launch(question=scripted("FINAL(llm_query('x'))"), venues=["empty"]))
    assert run.status == "failed"
    assert "no live worker on the run's venues (empty)" in run.error
    assert "frlm_worker --venue empty" in run.error


@pytest.mark.parametrize("consumer", ["celery", "frlm"])
def test_it_finishes_the_work_of_a_worker_killed_mid_run(stack, venues, consumer):
    # Either consumer of its queues (workers/consumer.py); a name of its own each, since
    # a killed worker's presence lingers until it expires.
    doomed = VenueSpec("doomed", concurrency=4, worker_name=f"doomed-{consumer}", consumer=consumer)
    proc = stack.venue_proc(doomed)
    stack.launch(proc)
    stack.wait_ready(proc, 60)
    Venue.objects.get_or_create(name="doomed")
    try:
        run = launch(
            question=scripted(batch_program(16)),
            venues=["doomed", "local"],
            worker_sim={"latency_ms": 2000},
            policy={"subquery_timeout_s": 20},
        )
        from traces import store

        def doomed_busy() -> bool:
            return any(
                e["name"] == "SubQuery.Execute" and e["venue"] == "doomed"
                for e in store.read_events(run.id)
            )

        wait_until(doomed_busy, timeout=30, what="the doomed worker to start jobs")
        stack.kill(proc.name)
        run = finish(run, timeout=60)
        assert run.status == "succeeded", run.error
        replies = eval(run.answer)  # noqa: S307
        assert len(replies) == 16 and not [r for r in replies if r.startswith("[frlm:")]
        events = trace(run)
        lost = [e for e in named(events, "SubQuery.Retry") if "was lost" in e["attrs"]["reason"]]
        assert lost and all(e["venue"] == "local" for e in lost)
    finally:
        stack.kill(proc.name)


def test_it_takes_a_shared_queue_jobs_return_only_from_its_holder(stack, venues):
    """A `returned` word for a job on a shared queue, stamped with another live worker of the
    run (a trusted broker worker may write to a run's result stream): the conductor took it
    from any live worker of the run's venues, ended the holder's attempt and sent the job
    again (a review). It takes it only from the worker whose claim it took."""
    from frlm_web.redis_client import get_redis
    from workers.jobs import encode_result, results_stream

    policy = {"routing": "shared", "hedge": "off", "subquery_timeout_s": 60}
    run = launch(
        question=scripted(batch_program(8)), worker_sim={"latency_ms": 2000}, policy=policy
    )
    client, stream = get_redis(), results_stream(run.id)

    def started() -> dict | None:
        for _, fields in client.xrange(stream, "-", "+"):
            if fields.get(b"status") == b"started":
                return {k.decode(): v.decode() for k, v in fields.items()}
        return None

    claim = wait_until(started, timeout=60, what="a job started")
    other = next(w["id"] for w in stack.worker_rows if w["id"] != claim["worker_id"])
    word = {"run_id": run.id, "sq_id": claim["sq_id"], "status": "returned", "worker_id": other}
    client.xadd(stream, encode_result(word))  # type: ignore[arg-type]
    run = finish(run)
    assert run.status == "succeeded", run.error
    reasons = [e["attrs"]["reason"] for e in named(trace(run), "SubQuery.Retry")]
    assert not [r for r in reasons if "returned" in r], reasons


def test_a_worker_that_joins_mid_run_takes_queued_jobs_without_a_strike(stack, venues):
    """A worker that joins while a run's jobs wait on its venue's shared queue claims one at
    once, before the conductor reads presence again (every second): it was refused as not
    live, with a strike against its reputation, and its claim was not taken (a review).
    Presence is now read again before a sender is refused."""
    from frlm_web.redis_client import get_redis
    from traces import store
    from workers.services import worker_strikes
    from workers.venues import live_workers

    first = stack.venue_proc(VenueSpec("joiner", concurrency=2, worker_name="joiner-first"))
    late = stack.venue_proc(VenueSpec("joiner", concurrency=4, worker_name="joiner-late"))
    stack.launch(first)
    stack.wait_ready(first, 60)
    try:
        policy = {"routing": "shared", "hedge": "off", "subquery_timeout_s": 60}
        run = launch(
            question=scripted(batch_program(16)),
            venues=["joiner"],
            worker_sim={"latency_ms": 1500},
            policy=policy,
        )
        wait_until(
            lambda: any(e["name"] == "SubQuery.Execute" for e in store.read_events(run.id)),
            timeout=60,
            what="the first worker to start jobs",
        )
        stack.launch(late)
        stack.wait_ready(late, 60)
        run = finish(run, timeout=120)
        assert run.status == "succeeded", run.error
        events = trace(run)
        joined = live_workers(get_redis(), "joiner")
        (late_id,) = [w["worker_id"] for w in joined if w["label"] == "joiner-late"]
        rejected = [e for e in named(events, "SubQuery.Return") if e["status"] == "rejected"]
        assert not rejected, [e["attrs"]["reason"] for e in rejected]
        ran = {e["worker_id"] for e in named(events, "SubQuery.Execute", "end")}
        assert late_id in ran, "the late worker took no queued job"
        assert worker_strikes(late_id) == 0
    finally:
        stack.kill(first.name)
        stack.kill(late.name)


def test_workers_that_cannot_call_the_runs_endpoint_are_passed_over_not_struck(venues):
    """A run naming a model endpoint its venue's workers are not configured for: each
    worker refused its jobs (workers/execution.served), each refusal used up a retry and
    counted against the worker, and five opened its breaker, so the next ordinary run on
    the venue failed "behind an open circuit breaker" (a review). Now a refusing worker
    gets none of the run's work, the run says which endpoint nobody calls and how to add
    a worker that does, and the venue's next run goes as usual."""
    from tests.helpers import endpoint
    from workers.backends import ModelSpec

    program = "rs = llm_query_batched(['q%d' % i for i in range(8)])\nFINAL(rs[0])"
    with endpoint(lambda _: (500, b"{}")) as (url, seen):
        run = finish(
            launch(
                question=scripted(program),
                venues=["local"],
                worker_model=ModelSpec("openai", "elsewhere-model", url),
                policy={"hedge": "off"},
            )
        )
    assert run.status == "failed", (run.status, run.answer)
    assert f"no live worker of local calls the model endpoint {url} (" in run.error, run.error
    assert "--backend openai --base-url" in run.error
    assert seen == []  # no worker called it
    # A refusal is no try of its own, and the refusing worker got no second job: each
    # sub-query's retry went to it too, and was refused again.
    assert named(trace(run), "SubQuery.Retry") == []
    after = finish(launch(task="sniah", tokens=20_000, seed=2, venues=["local"]))
    assert after.status == "succeeded", after.error


def test_a_refusal_after_the_job_started_is_a_failure_like_any_other():
    """A worker could sit on its jobs to their timeout and give them back as 'not my
    endpoint', with no strike and no try used (a review): only a refusal before its
    `started` is one."""
    from runs.engine.fanout.intake import Intake
    from runs.engine.fanout.state import Flight, Outcome
    from workers.jobs import UNSERVED_ENDPOINT

    flight = Flight(outcome=Outcome(index=0, attempts=1), prompt="p")
    refusal = {"status": "error", "error": f"{UNSERVED_ENDPOINT} 'http://x/v1', which is not"}
    assert Intake._unserved(flight, refusal)
    assert not Intake._unserved(flight, {"status": "error", "error": "HTTP 500"})
    flight.started_attempt = 1  # its worker said it started this attempt
    assert not Intake._unserved(flight, refusal)
    flight.outcome.attempts = 2  # the next attempt, on another worker, not started yet
    assert Intake._unserved(flight, refusal)


def test_a_workers_error_names_the_worker_that_said_it(venues):
    """ "the model endpoint http://127.0.0.1:33853/v1 answered HTTP 500" was a remote
    worker's own endpoint, and nothing said whose (a federation review)."""
    run = finish(
        launch(
            question=scripted(batch_program(3)),
            worker_sim={"failure_rate": 1.0},
            policy={"max_retries": 0, "hedge": "off"},
        )
    )
    assert run.status == "failed", (run.status, run.answer)
    assert re.search(r"first: worker w\w+ of (local|edge): ", run.error), run.error
    ends = named(trace(run), "SubQuery.Submit", "end")
    assert ends and all(e["worker_id"].startswith("w") for e in ends), ends[0]
    # Beside the error, not in it: the program reads the error in its marker, and a
    # replay's worker is another than the recording's.
    assert all(e["attrs"]["error"].startswith("the model endpoint") for e in ends), ends[0]
