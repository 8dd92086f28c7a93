"""What a hostile gateway worker, speaking the protocol by hand, claims of its work: the
tokens it says it used, the budget its replies are paid from, the jobs it says were
cancelled. Each test failed on the code before its fix (a review)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from websockets.sync.client import connect

from frlm_web.money import money
from frlm_web.redis_client import get_redis
from runs.models import Run
from tests.gateway import (
    jobs_in,
    named,
    next_messages,
    registered_worker,
    say_hello,
    signed_answer,
)
from tests.helpers import finish, launch, scripted, trace
from workers import reputation
from workers.gateway.agent import ws_url

pytestmark = pytest.mark.timeout(300)

PROMPTS = (
    "['Where is station %d?\\nStation %d is north of the river.' % (i, i) for i in range({n})]"
)


def batch_question(n: int) -> str:
    return scripted(
        f"rs = llm_query_batched({PROMPTS.format(n=n)})\n"
        "FINAL('%d replies' % sum(not r.startswith('[frlm:') for r in rs))"
    )


@contextmanager
def on_a_batch(
    web: str,
    name: str,
    venue: str,
    slots: int,
    n: int,
    *,
    version: int = 2,
    venues: list[str] | None = None,
    **policy: Any,
) -> Iterator[tuple[Any, Run, str, Any]]:
    """A worker `name` of `venue` with `slots` slots and no record, spoken by hand on the
    gateway at protocol `version`, and a run of a batch of `n` sub-queries on `venues`
    (its own venue alone by default), hedging off: (socket, run, worker id, key)."""
    wid, key = registered_worker(name, venue=venue, concurrency=slots)
    get_redis().delete(reputation.rep_key(wid))
    policy = {"hedge": "off", "subquery_timeout_s": 60, **policy}
    with connect(ws_url(web), open_timeout=10) as ws:
        run = launch(question=batch_question(n), venues=venues or [venue], policy=policy)
        assert say_hello(ws, wid, key, version)["type"] == "welcome"
        yield ws, run, wid, key


def answer(job: dict, worker_id: str, key, **claim) -> dict:
    """A result signed over exactly what it claims (tokens included), and its span's end."""
    return signed_answer(job, worker_id, key, claim=claim)


def answer_every_job(ws, run, reply) -> None:
    """Beat, and answer each job given with `reply(job)` in one `results` message, until
    the run is done."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.done:
            return
        beat(ws)
        items = [reply(job) for job in jobs_in(next_messages(ws, {"job", "jobs"}, wait_s=1))]
        if items:
            ws.send(json.dumps({"type": "results", "results": items}))


def beat(ws) -> None:
    ws.send(json.dumps({"type": "beat", "figures": {"inflight": 0, "memory_mb": 1.0}}))


def test_a_worker_that_drops_every_job_it_is_given_as_cancelled_pays_for_it_in_its_record(
    web, venues
) -> None:
    """A worker may answer `cancelled`: it found the job cancelled (a hedge's twin won, the
    batch was cut) or past its deadline as it came to start it. The conductor takes that
    word as it is: the job is tried again elsewhere, and neither the worker's breaker nor
    its completion record hears of it. A worker that takes every job it is given and at once
    says `cancelled`, of jobs nobody cancelled and long before their deadline, costs each
    of them an attempt and a round trip, for ever: its breaker never opens and its record
    stays that of a worker nobody has seen fail (with two of them on two venues, a
    sub-query's attempts run out on them and it fails)."""
    dropped: list[str] = []
    with on_a_batch(web, "dropper", "dropvenue", 8, 24, venues=["dropvenue", "edge"]) as (
        ws,
        run,
        wid,
        key,
    ):

        def drop(job: dict) -> dict:
            assert job["deadline"] > time.time() + 30  # nowhere near its deadline
            dropped.append(job["sq_id"])
            said = {"run_id": job["run_id"], "sq_id": job["sq_id"], "status": "cancelled"}
            return {"sq_id": job["sq_id"], "result": said}

        answer_every_job(ws, run, drop)
    run = finish(run)
    assert run.status == "succeeded", run.error
    events = trace(run)
    cancelled_by_conductor = named(events, "SubQuery.Cancel")
    assert dropped and not cancelled_by_conductor, (dropped, cancelled_by_conductor)
    rep = reputation.load(get_redis(), [wid])[wid]
    completion = rep.mean("completion")
    assert completion is not None and completion < 1.0, (
        f"worker {wid} took {len(dropped)} jobs nobody cancelled, each far from its "
        f"deadline, and dropped every one as `cancelled`; its record: {rep.as_dict()}"
    )


def test_a_runs_token_counts_are_not_a_workers_unbounded_claim(web, venues) -> None:
    """What a reply costs is held to four tokens a character of its prompt and of its text
    (spending.fair_cost): a worker's token counts beyond that are not believed. Its token
    counts are taken as they are all the same into the run's totals (Run.tokens_in /
    tokens_out, the run page's header and Submit spans, Table 2's tokens per solved task):
    four one-line replies claimed at a billion tokens each make the run read 4 billion."""
    with on_a_batch(web, "tokclaimer", "tokvenue", 4, 4) as (ws, run, wid, key):
        answer_every_job(
            ws,
            run,
            lambda job: answer(
                job, wid, key, text=job["prompt"].splitlines()[-1],
                tokens_in=10**9, tokens_out=10**9, cost="0.001",
            ),
        )  # fmt: skip
    run = finish(run)
    assert run.status == "succeeded", run.error
    # Four replies of ~40 characters: 4 x (4 x 40 + 64) tokens at the very most, and the
    # root's turns, a few thousand.
    assert run.tokens_out < 1_000_000, (
        f"run {run.id} records {run.tokens_out:,} tokens out (and {run.tokens_in:,} in) for "
        f"four one-line replies; its cost, held to the bound, is ${run.cost}"
    )


def test_a_worker_inflating_a_whole_batch_overruns_the_run_budget_by_one_reply_at_most(
    web, venues
) -> None:
    """Every dispatch reserves its estimate (the prompt's tokens, the usual reply length)
    against the run's cap; the reply settles at the worker's claim, bounded only by four
    tokens a character of the prompt and of the reply it chose to write. A worker handed a
    whole batch at once (16 slots) answers every job with a long reply and the bound's
    tokens: each settled far past its reservation, none was refused, and a $0.05 cap was
    passed by eleven replies' worth. A worker's reply is now paid at most what the caps
    have left; only the root's own turns may pass the cap."""
    cap = Decimal("0.05")
    with on_a_batch(web, "hog", "hogvenue", 16, 16, budget_usd=float(cap)) as (ws, run, wid, key):
        answer_every_job(
            ws,
            run,
            lambda job: answer(
                job, wid, key, text="x" * 4000, tokens_in=10**6, tokens_out=10**6, cost="1"
            ),
        )
    run = finish(run)
    events = trace(run)
    settles = [
        money(e["attrs"]["cost"])
        for e in named(events, "Budget.Settle")
        if e["attrs"]["subquery"] and not e["attrs"]["released"]
    ]
    assert settles, f"no reply settled ({run.status}: {run.error})"
    settled = money(run.accounts["budget"]["run"]["settled"])
    one_reply = max(settles)
    assert settled <= cap + one_reply, (
        f"run {run.id} ({run.status}) with a ${cap} cap settled ${settled}: "
        f"{len(settles)} replies of up to ${one_reply} each, reserved at "
        f"${named(events, 'Budget.Reserve')[-1]['attrs']['amount']} each; the cap was passed "
        f"by {(settled - cap) / one_reply:.1f} replies' worth"
    )
    paid = sum(money(r["attrs"]["receipt"]["paid"]) for r in named(events, "Receipt.Emit"))
    assert paid <= cap, f"the worker was paid ${paid} under a ${cap} cap"
    cut = [e for e in named(events, "Budget.Settle") if "claimed" in e["attrs"]]
    assert cut and all(money(e["attrs"]["claimed"]) > money(e["attrs"]["cost"]) for e in cut)


def test_a_worker_that_says_it_started_a_job_only_as_it_answers_is_measured_as_slow_as_it_is(
    web, venues
) -> None:
    """A worker of protocol version 3 holds a job beyond its slots `queued`, and says when
    it starts it (a `started` item); the conductor measures its latency from that word. A
    slow worker (0.4 s a job, one slot) that says `started` in the same message as the
    job's result is measured at about 0 ms a job: the router's latency EWMA (what the
    scheduler ranks workers by, and hedging's windows) calls it the fastest worker there
    is, and it attracts work it is slow to do. A queued job now starts, at the latest, when
    a slot frees for it."""
    took: list[float] = []
    with on_a_batch(web, "quickliar", "fakefast", 1, 12, version=3) as (ws, run, wid, key):
        waiting: list[dict] = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.done:
                break
            beat(ws)
            waiting += jobs_in(next_messages(ws, {"job", "jobs"}, wait_s=0.3))
            if not waiting:
                continue
            job = waiting.pop(0)
            began = time.monotonic()
            time.sleep(0.4)  # the model call, one at a time
            items = []
            if job.get("queued"):
                # Its start said only now, with its result.
                items.append({"run_id": job["run_id"], "sq_id": job["sq_id"], "started": True})
            line = job["prompt"].splitlines()[-1]
            items.append(answer(job, wid, key, text=line, tokens_in=20, tokens_out=10))
            ws.send(json.dumps({"type": "results", "results": items}))
            took.append(time.monotonic() - began)
    run = finish(run)
    assert run.status == "succeeded", run.error
    rep = reputation.load(get_redis(), [wid])[wid]
    assert len(took) >= 12 and min(took) >= 0.4
    assert rep.latency_ms is not None and rep.latency_ms >= 200, (
        f"a worker that took at least 400 ms on each of its {len(took)} jobs is measured at "
        f"{rep.latency_ms} ms (EWMA): it said `started` with each queued job's result"
    )
