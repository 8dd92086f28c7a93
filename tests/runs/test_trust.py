"""Verification tiers, hedging, budgets and receipts on real worker processes: objective
checks (a regex, a JSON schema, the program's own function), validators' signed
attestations, a straggler hedged and its twin cancelled, each budget cap, and a run's
receipt chain checked by `frlm_receipts verify`."""

from __future__ import annotations

import json
import math

from django.core.management import call_command

from frlm_web.money import money, money_str
from frlm_web.redis_client import get_redis
from runs.engine.fanout.hedging import HEDGE_SHARE
from runs.trust.accounts import DEFAULT_TOKENS_OUT
from runs.trust.receipts import receipts_verify
from tests.helpers import finish, launch, named, scripted, trace
from workers.attestation import attestation_problem
from workers.models import Worker
from workers.pricing import model_price
from workers.venues import live_workers

# One sentence to read: an honest worker answers with it; a liar has nothing else in the
# text to pass off, so it makes up "The answer is NNNN." (what the checks catch).
PROMPTS = "['Where is station %d?\\nStation %d is north of the river.' % (i, i) for i in range(%d)]"
HONEST = r"Station \d+ is north of the river\."


def program(n: int, call: str = "llm_query_batched({prompts}{extra})", extra: str = "") -> str:
    prompts = PROMPTS.replace("%d)]", f"{n})]", 1)
    return scripted(f"rs = {call.format(prompts=prompts, extra=extra)}\nFINAL(repr(rs))")


def replies(run) -> list[str]:
    return eval(run.answer)  # noqa: S307 (our own repr of a list of str)


def worker_ids(swarm, *, liars: bool) -> set[str]:
    names = {d.name for d in swarm.devices if d.liar == liars}
    return {w["worker_id"] for w in swarm.live() if w["label"] in names}


def receipts_of(events: list[dict]) -> list[dict]:
    return [e["attrs"]["receipt"] for e in named(events, "Receipt.Emit")]


# --- objective checks ---------------------------------------------------------------------


def test_it_retries_a_reply_that_fails_its_regex_on_another_worker(swarm_factory):
    swarm = swarm_factory("objedge", 2, latency=30, lie_share=0.5)
    liar, honest = worker_ids(swarm, liars=True), worker_ids(swarm, liars=False)
    run = finish(
        launch(
            question=program(12, extra=f", validate={HONEST!r}"),
            venues=["objedge"],
            policy={"explore": 0.5},
        )
    )
    assert run.status == "succeeded", run.error
    assert all(r.startswith("Station") for r in replies(run)), replies(run)
    events = trace(run)
    checks = named(events, "Verify.Objective")
    failed = [e for e in checks if e["status"] == "rejected"]
    assert failed, "the liar answered nothing: the test proves nothing"
    assert {e["worker_id"] for e in failed} <= liar
    assert all(
        e["attrs"]["check"] == "regex" and "does not match" in e["attrs"]["reason"] for e in failed
    )
    rechecks = [e for e in named(events, "SubQuery.Submit", "start") if e["attrs"].get("copy")]
    assert len(rechecks) == len(failed)
    assert {e["worker_id"] for e in rechecks} <= honest
    # The liar is not paid for what failed; honest replies are.
    receipts = receipts_of(events)
    assert {r["verdict"] for r in receipts if r["worker"] in liar} == {"rejected"}
    assert all(r["paid"] == "0" for r in receipts if r["verdict"] == "rejected")
    assert all(
        r["paid"] == r["cost"] and money(r["cost"]) > 0
        for r in receipts
        if r["verdict"] == "accepted"
    )
    assert run.accounts["verification"]["by_kind"]["recheck"] == len(failed)


def test_it_rejects_what_fails_its_schema_on_every_worker_it_tries(swarm_factory):
    swarm_factory("objall", 2, latency=20)
    schema = {"type": "object", "required": ["station"]}
    question = scripted(
        f"r = llm_query('Where?\\nStation 1 is north.', validate={schema!r})\nFINAL(r)"
    )
    run = finish(launch(question=question, venues=["objall"], policy={"max_retries": 1}))
    assert run.status == "succeeded", run.error
    assert run.answer.startswith(
        "[frlm:rejected] sub-query 1: failed its check 2 time(s), on 2 worker(s)"
    )
    assert "not JSON" in run.answer
    checks = named(trace(run), "Verify.Objective")
    assert [e["status"] for e in checks] == ["rejected", "rejected"]
    assert len({e["worker_id"] for e in checks}) == 2  # the retry went to the other worker


def test_it_judges_replies_with_the_programs_own_function(swarm_factory):
    swarm = swarm_factory("objfn", 2, latency=30, lie_share=0.5)
    liar = worker_ids(swarm, liars=True)
    cells = [
        "def clean(reply):\n    return reply.startswith('Station')",
        f"rs = llm_query_batched({PROMPTS.replace('%d)]', '10)]', 1)}, validate=clean)\n"
        "one = llm_query('Where?\\nStation 99 is east.', validate=lambda r: 1 / 0)\n"
        "FINAL(repr(rs + [one]))",
    ]
    run = finish(launch(question=scripted(*cells), venues=["objfn"], policy={"explore": 0.5}))
    assert run.status == "succeeded", run.error
    *answers, broken = replies(run)
    assert all(r.startswith("Station") for r in answers), answers
    assert broken.startswith("[frlm:rejected]") and "the check raised ZeroDivisionError" in broken
    checks = named(trace(run), "Verify.Objective")
    assert {e["attrs"]["check"] for e in checks} == {"function"}
    lied = [e for e in checks if e["worker_id"] in liar]
    assert lied and all(e["status"] == "rejected" for e in lied)


# --- the high-trust tier --------------------------------------------------------------------


def test_it_has_a_trusted_validator_attest_and_overrule_a_liar(swarm_factory, venues):
    trusted = {w["worker_id"] for w in live_workers(get_redis(), "local") if w.get("trusted")}
    assert trusted, "the stack's local venue should be trusted"
    swarm = swarm_factory("htedge", 2, latency=30, lie_share=0.5)
    liar = worker_ids(swarm, liars=True)
    policy = {
        "tier": "high_trust",
        "validate_rate": 1.0,
        "verify_venues": "local",
        "explore": 0.5,
        "probe_rate": 0.0,  # only the new workers' probes: a count the test can know
    }
    run = finish(launch(question=program(10), venues=["htedge"], policy=policy))
    assert run.status == "succeeded", run.error
    assert all(r.startswith("Station") for r in replies(run)), replies(run)
    events = trace(run)
    attests = named(events, "Verify.Attest")
    assert len(attests) == 10
    keys = dict(Worker.objects.values_list("id", "public_key"))
    for event in attests:
        att = event["attrs"]["attestation"]
        assert att["validator"] in trusted and att["worker"] == event["worker_id"]
        assert attestation_problem(event["attrs"], validator_key=keys[att["validator"]]) is None
        assert att["span"] in event["links"]
        lied = att["worker"] in liar
        assert att["verdict"] == ("diverge" if lied else "agree")
        assert event["status"] == ("rejected" if lied else "ok")
    assert any(e["attrs"]["attestation"]["worker"] in liar for e in attests)
    receipts = receipts_of(events)
    assert {r["verdict"] for r in receipts if r["worker"] in trusted} == {"validator"}
    # Both workers are new: each also answered a known-answer probe first (issue 23).
    assert run.accounts["verification"]["by_kind"] == {"validator": 10, "probe": 2}


def test_it_refuses_the_high_trust_tier_without_a_validator(swarm_factory):
    swarm_factory("htnone", 1, latency=20)
    question = scripted(
        "try:\n    llm_query('q', tier='high_trust')\nexcept Exception as exc:\n    FINAL(str(exc))"
    )
    run = finish(launch(question=question, venues=["htnone"]))
    assert "needs a live worker on a trusted venue" in run.answer
    assert "policy.verify_venues" in run.answer


# --- hedging ----------------------------------------------------------------------------------


def test_it_hedges_a_straggler_and_cancels_the_slower_twin(swarm_factory):
    # One slow worker in eight: its share of the venue's replies stays under 5%, so the
    # venue's p95 is the others' latency and its jobs stand out as stragglers.
    swarm = swarm_factory("hedgeedge", 8, latency=60, slow_share=0.125, slow_factor=20)
    slow = {
        w["worker_id"]
        for w in swarm.live()
        if w["label"] in {d.name for d in swarm.devices if d.slow}
    }
    policy = {"explore": 0, "hedge": "p95", "subquery_timeout_s": 30}
    # 48: a batch hedges at most a tenth of itself, and the slow worker may hold four.
    run = finish(launch(question=program(48), venues=["hedgeedge"], policy=policy))
    assert run.status == "succeeded", run.error
    assert all(r.startswith("Station") for r in replies(run))
    events = trace(run)
    hedges = named(events, "SubQuery.Hedge")
    assert hedges, "nothing was hedged"
    # The slow worker's jobs are hedged (on a loaded machine another may straggle too),
    # always onto another worker.
    assert slow & {e["attrs"]["hedged_worker"] for e in hedges}
    assert all(e["worker_id"] != e["attrs"]["hedged_worker"] for e in hedges)
    # Jobs queued on the slow worker (more than its two slots) wait on its straggling ones:
    # they are hedged too, unless stragglers elsewhere (a loaded machine) took the batch's
    # whole hedge allowance first (seen in CI: every hedge went to a running straggler).
    held = [e for e in named(events, "SubQuery.Submit", "start") if e["worker_id"] in slow]
    allowance = max(1, math.floor(HEDGE_SHARE * 48))
    if len(held) > 2 and len(hedges) < allowance:
        assert any(e["attrs"].get("queued") for e in hedges), [e["attrs"] for e in hedges]
    assert all(e["attrs"]["threshold_ms"] > 0 and e["attrs"]["quantile"] == "p95" for e in hedges)
    cancels = [e for e in named(events, "SubQuery.Cancel") if "hedged" in e["attrs"]["reason"]]
    assert len(cancels) == len(hedges)
    # Each hedged sub-query was answered once: one attempt's span ended ok.
    returns = [e for e in named(events, "SubQuery.Submit", "end") if e["status"] == "ok"]
    assert len(returns) == 48
    # ... and said so once: no instant beside the span's end (only a refused result has one).
    assert {e["status"] for e in named(events, "SubQuery.Return")} <= {"rejected"}
    assert run.accounts["hedges"] == len(hedges)
    assert "hedge" not in run.accounts["verification"]["by_kind"]  # not verification

    off = finish(launch(question=program(8), venues=["hedgeedge"], policy={"hedge": "off"}))
    assert named(trace(off), "SubQuery.Hedge") == []


# --- budgets --------------------------------------------------------------------------------


def spending(run) -> tuple[float, float]:
    """What a run's root turns and its sub-queries cost, from its trace."""
    events = trace(run)
    root = sum(e["cost"] or 0 for e in named(events, "Run.Decode", "end"))
    work = sum(e["cost"] or 0 for e in named(events, "SubQuery.Execute", "end"))
    return root, work


# Long prompts (about 1,000 tokens each): what the work costs outweighs the reply-length
# guess in each dispatch's reservation, as in real runs.
LONG_PROMPTS = PROMPTS.replace("(i, i)", "(i, i) + ' The weather was mild.' * 180")


def long_batch(n: int) -> str:
    return scripted(
        f"rs = llm_query_batched({LONG_PROMPTS.replace('%d)]', f'{n})]', 1)})\nFINAL(repr(rs))"
    )


def test_it_stops_at_the_run_budget_and_ends_with_a_partial_answer(swarm_factory):
    swarm_factory("budgetrun", 2, latency=20, concurrency=4)
    question = scripted(
        f"rs = llm_query_batched({LONG_PROMPTS.replace('%d)]', '120)]', 1)})\n"
        "FINAL('%d answered' % sum(not r.startswith('[frlm:') for r in rs))"
    )
    full = finish(launch(question=question, venues=["budgetrun"]))
    assert full.status == "succeeded" and full.answer == "120 answered", full.error
    root, work = spending(full)
    # The root turn reserves its estimate (the usual reply length at its price) before it
    # is asked; what it does not spend of it is freed. Room for that, and half the work.
    root_estimate = float(DEFAULT_TOKENS_OUT * model_price("frlm-sim-root").per_1k_out / 1000)
    cap = root + root_estimate + work / 2
    run = finish(launch(question=question, venues=["budgetrun"], policy={"budget_usd": cap}))
    assert run.status == "partial", (run.status, run.error)
    assert run.error.startswith("budget cap reached: budget cap of the run reached")
    assert "Raise policy.budget_usd" in run.error
    answered = int(run.answer.split()[0])
    assert 0 < answered < 120
    events = trace(run)
    refused = [e for e in named(events, "Budget.Reserve") if e["status"] == "rejected"]
    assert refused and refused[0]["attrs"]["refused_by"] == "run"
    (alert,) = [e for e in named(events, "Budget.Alert") if e["attrs"]["scope"] == "run"]
    assert alert["attrs"]["fraction"] >= 0.8
    settled = sum(money(e["attrs"]["cost"]) for e in named(events, "Budget.Settle"))
    assert settled <= money(cap)
    assert run.accounts["budget"]["run"]["settled"] == money_str(settled)  # exact, as a string
    assert run.accounts["exhausted"]
    # Per sub-query, not per span: under load a hedge copy or a retry of a sub-query that
    # was answered in the end may itself have ended refused by the cap.
    sq_of = {e["span_id"]: e["attrs"]["sq"] for e in named(events, "SubQuery.Submit", "start")}
    ends = named(events, "SubQuery.Submit", "end")
    answered_sq = {sq_of[e["span_id"]] for e in ends if e["status"] != "error"}
    unsent = {sq_of[e["span_id"]] for e in ends if e["status"] == "error"} - answered_sq
    assert len(unsent) == 120 - answered


def test_it_holds_each_sub_query_and_each_provider_to_its_cap(swarm_factory):
    swarm_factory("budgetcaps", 2, latency=20)
    tiny = finish(
        launch(question=program(3), venues=["budgetcaps"], policy={"subquery_budget_usd": 1e-7})
    )
    assert tiny.status == "succeeded", tiny.error  # the run itself is not over budget
    assert all(
        r.startswith("[frlm:budget]") and "budget cap of sub-query" in r for r in replies(tiny)
    )
    full = finish(launch(question=long_batch(40), venues=["budgetcaps"]))
    _root, work = spending(full)
    capped = finish(
        launch(
            question=long_batch(40),
            venues=["budgetcaps"],
            policy={"provider_budgets": f"frlm-sim-worker={work / 2:.8f}"},
        )
    )
    answers = replies(capped)
    refused = [r for r in answers if r.startswith("[frlm:budget]")]
    assert refused and len(refused) < 40
    assert all("provider has reached its budget cap (frlm-sim-worker)" in r for r in refused)
    assert capped.status == "succeeded"  # a provider's cap ends its work, not the run


# --- receipts -------------------------------------------------------------------------------


def test_it_pays_each_reply_by_its_verdict_and_the_chain_verifies(swarm_factory):
    swarm = swarm_factory("receipts", 3, latency=20, lie_share=0.34)
    liar = worker_ids(swarm, liars=True)
    policy = {"tier": "redundant", "explore": 0.3, "max_replicas": 3}
    run = finish(launch(question=program(12), venues=["receipts"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    receipts = receipts_of(events)
    ok_replies = [e for e in named(events, "SubQuery.Submit", "end") if e["status"] == "ok"]
    assert len(receipts) == len(ok_replies) == run.accounts["receipts"]["count"]
    assert [r["seq"] for r in sorted(receipts, key=lambda r: r["seq"])] == list(
        range(1, len(receipts) + 1)
    )
    assert {r["verdict"] for r in receipts if r["worker"] in liar} <= {"rejected"}
    assert sum(money(r["paid"]) for r in receipts) == money(run.accounts["receipts"]["paid"])
    report = receipts_verify(run.id)
    assert report["ok"], report["broken"]
    assert report["workers_unknown"] == []
    call_command("frlm_receipts", "verify", run.id)  # exits 0 on a whole chain

    best = finish(launch(question=program(6), venues=["receipts"], policy={"tier": "best_effort"}))
    verdicts = {r["verdict"] for r in receipts_of(trace(best))}
    assert verdicts == {"unverified"}
    assert json.dumps(best.accounts["verification"])  # stored on the run, as JSON


def test_a_redundant_run_with_one_worker_to_ask_is_warned_and_fails_rather_than_guess(
    swarm_factory,
):
    """tier=redundant on a venue of one untrusted worker: every answer stayed unresolved
    ("no other live worker to ask"), the program went on with the markers, and the run
    "succeeded" with an answer made from nothing (a review). The launch now says the
    venues cannot serve the tier, and a batch with no answer accepted fails the run."""
    from runs.services import tier_note

    swarm_factory("solo", 1, latency=20)
    run = launch(question=program(4), venues=["solo"], policy={"tier": "redundant"})
    note = tier_note(run)
    assert "tier=redundant accepts an answer once 2 workers give it" in note
    assert "(solo) have 1 live worker(s) now" in note
    run = finish(run)
    assert run.status == "failed", (run.status, run.answer)
    assert "every sub-query of a batch of 4 failed" in run.error, run.error
    assert "no other live worker" in run.error, run.error
    best = launch(question=program(4), venues=["solo"], policy={"tier": "best_effort"})
    assert tier_note(best) == ""


def test_a_batch_after_the_venues_workers_left_waits_for_them_to_come_back(swarm_factory):
    """The link of a run's one remote worker dropped between two batches: the next batch
    failed the run at once ("no live worker on the run's venues"), where the same outage a
    moment later, inside a batch, was ridden out (a review). Only the run's first batch
    fails at once; a later one waits as long as an attempt may take."""
    import time

    from runs.models import Run
    from tests.helpers import wait_until
    from traces import store

    swarm = swarm_factory("comeback", 2, latency=20)
    cells = [
        "a = llm_query_batched(['first %d' % i for i in range(4)])\nprint(len(a))",
        "import time\ntime.sleep(4)\nb = llm_query_batched(['second %d' % i for i in range(4)])"
        "\nFINAL(str(len(a) + len(b)))",
    ]
    run = launch(question=scripted(*cells), venues=["comeback"], policy={"hedge": "off"})

    def first_cell_done() -> bool:
        ends = named(store.read_events(run.id), "Repl.Exec", "end")
        return bool(ends)

    wait_until(first_cell_done, timeout=60, what="the first cell")
    swarm.stop()  # gone before the second batch asks
    wait_until(lambda: not live_workers(get_redis(), "comeback"), timeout=30, what="none live")
    time.sleep(4)
    swarm_factory("comeback", 2, latency=20)
    run = finish(run, timeout=120)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.answer == "8"
