"""Checks of workers nobody vouches for (issue 23) on real worker processes: known-answer
probes for new workers, a turncoat with a long good record caught by a probe and its
answers in the batch corrected, the reasons and the cost of checking in the trace and the
accounts, and honest workers left alone."""

from __future__ import annotations

from frlm_web.redis_client import get_redis
from tests.helpers import finish, launch, named, scripted, trace
from workers.reputation import Observation, Reputations, load

PROMPTS = "['Where is station %d?\\nStation %d is north of the river.' % (i, i) for i in range(N)]"


def program(n: int) -> str:
    return scripted(f"rs = llm_query_batched({PROMPTS.replace('N', str(n))})\nFINAL(repr(rs))")


def ids(swarm, *, liars: bool) -> set[str]:
    names = {d.name for d in swarm.devices if d.liar == liars}
    return {w["worker_id"] for w in swarm.live() if w["label"] in names}


def vouch(worker_ids: set[str], results: int = 40) -> None:
    """Give each worker a long record of valid results, as a settled swarm has."""
    reputations = Reputations(get_redis())
    for wid in worker_ids:
        for _ in range(results):
            reputations.observe(Observation(wid, completion=True, agreement=True))
    reputations.flush()


def corrected_run(swarm, n: int, **policy):
    """A redundant-tier run of `n` questions on `swarm`, every worker (the liar too) with a
    long good record and the liar keeping its share: every answer must come out right, so
    whatever checks the policy makes must catch it and correct its answers. The liar's
    id and the run's events."""
    (liar,) = ids(swarm, liars=True)
    vouch(ids(swarm, liars=False) | {liar})
    policy = {
        "tier": "redundant",
        "max_replicas": 3,
        "explore": 0,
        "min_reputation": 0.0,  # the liar keeps its share: its answers must be corrected
        **policy,
    }
    run = finish(launch(question=program(n), venues=[swarm.venue], policy=policy))
    assert run.status == "succeeded", run.error
    replies = eval(run.answer)  # noqa: S307 (our own repr)
    assert replies == [f"Station {i} is north of the river." for i in range(n)]
    return liar, trace(run)


def test_it_probes_each_new_worker_before_trusting_it_and_catches_a_liar(swarm_factory):
    # Three workers, one liar: with two, the redundant tier's extra copies go back to the
    # same two workers and a liar answering twice outvoted the honest one (seen once in CI:
    # the honest worker flagged; issue 23's note).
    swarm = swarm_factory("probenew", 3, latency=20, lie_share=0.34)
    (liar,) = ids(swarm, liars=True)
    honest = set(ids(swarm, liars=False))
    assert len(honest) == 2
    # Only the new workers' probes; no gate, which would catch the liar while the batch
    # is out, before the probes are judged (test_a_turncoat_gets_no_more_than_...).
    policy = {"tier": "redundant", "probe_rate": 0.0, "check_cover": "batch"}
    run = finish(launch(question=program(8), venues=["probenew"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    verdicts = {e["worker_id"]: e for e in named(events, "Verify.Probe")}
    assert set(verdicts) == {liar} | honest
    assert all(verdicts[w]["status"] == "ok" for w in honest)
    assert verdicts[liar]["status"] == "rejected"
    assert verdicts[liar]["attrs"]["source"] == "context"  # built from the batch's own text
    assert "new worker" in verdicts[liar]["attrs"]["why"]
    # The probe catches it first; a later outvote of the same worker may flag it again.
    flags = named(events, "Verify.Flag")
    assert flags and {f["worker_id"] for f in flags} == {liar}, flags
    flag = flags[0]
    assert flag["attrs"]["caught_by"].startswith("failed probe sub-query")
    # Probes hide among the work: their Submit spans are ordinary ones to the worker.
    probes = [e for e in named(events, "SubQuery.Submit", "start") if e["attrs"].get("copy")]
    assert {e["worker_id"] for e in probes if e["attrs"]["copy"] == "probe"} == {liar} | honest
    figures = run.accounts["verification"]
    assert figures["by_kind"]["probe"] == 3 and "cost" in figures and "cost_by_kind" in figures
    assert load(get_redis(), [liar])[liar].score < 0.2


def test_it_catches_a_turncoat_with_a_good_record_and_corrects_its_answers(swarm_factory):
    # Every worker has a long good record, so the floor alone would check few answers; the
    # liar is caught by a probe, and then every answer of it in the batch is re-checked.
    swarm = swarm_factory("turncoat", 3, latency=20, lie_share=0.34)
    liar, events = corrected_run(swarm, 20, check_floor=0.0, probe_rate=1.0, check_cover="batch")
    assert any(e["status"] == "rejected" for e in named(events, "Verify.Probe"))
    # Caught, it is a suspect: each of its answers was checked, and outvoted.
    outvoted = [v for v in named(events, "Verify.Redundant") if liar in v["attrs"]["disagreed"]]
    assert outvoted
    assert all(v["attrs"]["why"].startswith(("suspect", "recheck")) for v in outvoted)


def test_a_turncoat_the_sampler_passes_over_is_caught_by_the_batch_cover(swarm_factory):
    # No floor and no probes: before every worker took part in a check of each batch, a
    # liar with a long good record went unchecked and its lies were the run's answers
    # (seen failing before runs.trust.verify.cover). Now its answer is copied, or another
    # worker's answer goes to it, and either way it is outvoted and its answers corrected.
    swarm = swarm_factory("covered", 4, latency=20, lie_share=0.25)
    liar, events = corrected_run(swarm, 24, check_floor=0.0, probe_rate=0.0, check_cover="batch")
    judged = named(events, "Verify.Redundant")
    assert any(v["attrs"]["why"].startswith("cover") for v in judged), judged
    assert liar in {f["worker_id"] for f in named(events, "Verify.Flag")}
    # Cheap with honest workers: at most one copy per two of them, beyond the liar's.
    honest_covers = [
        v
        for v in judged
        if v["attrs"]["why"].startswith("cover") and liar not in v["attrs"]["disagreed"]
    ]
    assert len(honest_covers) <= 2


def test_it_leaves_honest_workers_with_a_good_record_mostly_unchecked(swarm_factory):
    swarm = swarm_factory("honestfloor", 3, latency=20)
    vouch(ids(swarm, liars=False), results=200)
    policy = {"tier": "redundant", "probe_rate": 0.0, "check_floor": 0.1}
    run = finish(launch(question=program(60), venues=["honestfloor"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    # At the floor of 10%: 60 answers, each worker checked every tenth answer or so, and
    # the gate's check of each worker's first answer, which vouches for two at a time.
    checked = named(events, "Verify.Redundant")
    assert 3 <= len(checked) <= 14
    assert all(v["attrs"]["why"].startswith(("sampled", "gate")) for v in checked)
    gates = named(events, "Verify.Gate")
    assert 1 <= len(gates) <= 2 and all(g["status"] == "ok" for g in gates), gates
    assert {w for g in gates for w in g["attrs"]["vouched"]} == ids(swarm, liars=False)
    assert not named(events, "Verify.Flag")


def test_a_liar_asked_twice_never_outvotes_the_only_honest_worker(swarm_factory):
    # Two workers, one liar: the extra copies of a disagreement can only go back to the
    # same two. Each worker is one vote however often it answers, so the liar's repeated
    # answer never makes the honest worker "outvoted"; with nobody else to ask, the
    # sub-query stays unresolved rather than guessed. Failed before the fix: the honest
    # worker was named in `disagreed` and flagged.
    swarm = swarm_factory("twovoters", 2, latency=20, lie_share=0.5)
    (liar,) = ids(swarm, liars=True)
    (honest,) = ids(swarm, liars=False)
    # Every answer checked: the floor alone (3%) may check none of twelve (seen in CI).
    policy = {"tier": "redundant", "probe_rate": 0.0, "check_floor": 1.0, "max_replicas": 4}
    run = finish(launch(question=program(12), venues=["twovoters"], policy=policy))
    events = trace(run)
    judged = named(events, "Verify.Redundant")
    assert judged
    assert all(honest not in v["attrs"]["disagreed"] for v in judged), judged
    assert honest not in {f["worker_id"] for f in named(events, "Verify.Flag")}
    assert load(get_redis(), [honest])[honest].score > 0.5
    for verdict in judged:
        # No worker is two votes: an accepted answer has two different workers behind it.
        agreed = verdict["attrs"]["agreed"]
        assert len(agreed) == len(set(agreed)), verdict["attrs"]


def test_a_liar_whose_only_checker_is_a_trusted_worker_is_caught_and_its_answers_replaced(
    swarm_factory, venues
):
    # One stranger, a settled liar, beside the operator's trusted venue: every check of it
    # is a copy to a trusted worker, one against one. The tie went unresolved, so a third
    # of the answers came back "[frlm:unresolved] ... 2 workers never agreed" and the liar
    # was never caught (this test failed so). A trusted worker's answer now settles a tie
    # it is on one side of (verify.redundant_decide).
    swarm = swarm_factory("lonely", 1, latency=20, lie_share=1.0, concurrency=4)
    (liar,) = ids(swarm, liars=True)
    vouch({liar})
    policy = {
        "tier": "redundant",
        "probe_rate": 0.0,
        "check_floor": 1.0,
        "explore": 0,
        "min_reputation": 0.0,  # the liar keeps its share: its answers must be replaced
        # Every trusted answer sampled too: its copy goes to the liar until the liar is
        # caught, and then to nobody (the answer stands, unchecked, rather than being lost).
        "validate_trusted_rate": 1.0,
    }
    run = finish(launch(question=program(12), venues=["lonely", "local"], policy=policy))
    assert run.status == "succeeded", run.error
    assert eval(run.answer) == [f"Station {i} is north of the river." for i in range(12)]
    events = trace(run)
    assert liar in {f["worker_id"] for f in named(events, "Verify.Flag")}
    judged = [v for v in named(events, "Verify.Redundant") if liar in v["attrs"]["disagreed"]]
    assert judged and all("a trusted worker's answer" in v["attrs"]["reason"] for v in judged)
    alone = [v for v in named(events, "Verify.Redundant") if "unchecked" in v["attrs"]["reason"]]
    assert alone, "no trusted answer was left with nobody to check it"


def work_sent(events, worker: str) -> int:
    """The answers a worker was asked for in a run: its Submit spans that are no copy."""
    return sum(
        1
        for e in named(events, "SubQuery.Submit", "start")
        if e["worker_id"] == worker and not e["attrs"].get("copy")
    )


def test_a_turncoat_gets_no_more_than_its_slots_less_one_past_the_answer_the_gate_checks(
    swarm_factory,
):
    # A liar with a long good record, no floor, no probe: checked at the end of the batch
    # (check_cover=batch), it took its share of the batch first, 12 of 40 answers here
    # (this test fails so). The gate checks one answer of each settled worker as it
    # arrives, drawn among the 10 it is expected to give, and gives it at most 3 of its 4
    # slots past the ones before it until the verdict; the answers it lied on before the
    # checked one are corrected with the batch.
    swarm = swarm_factory("gated", 4, latency=40, lie_share=0.25, concurrency=4)
    liar, events = corrected_run(swarm, 40, check_floor=0.0, probe_rate=0.0)
    gates = named(events, "Verify.Gate")
    (caught,) = [g for g in gates if g["status"] == "rejected"]
    assert caught["attrs"]["caught"] == [liar] and caught["attrs"]["why"].startswith("gate")
    # Caught on its own answer, the one drawn (not one of its last, its share having fallen
    # short of the draw, nor a copy it answered for another worker's check).
    if caught["worker_id"] == liar and "drawn at random" in caught["attrs"]["why"]:
        assert 1 <= caught["attrs"]["answer"] <= 10
        assert work_sent(events, liar) <= 3 + caught["attrs"]["answer"] - 1
    assert work_sent(events, liar) <= 3 + 10 - 1
    (flag,) = [f for f in named(events, "Verify.Flag") if f["worker_id"] == liar][:1]
    assert flag["attrs"]["caught_by"].startswith("outvoted at the gate")
    honest = ids(swarm, liars=False)
    assert {w for g in gates for w in g["attrs"]["vouched"]} == honest
    # Its answers of the batch were checked again with it (corrected_run: all are right),
    # and so was a copy it answered for another worker's check, if it was given one.
    rechecked = [v for v in named(events, "Verify.Redundant") if liar in v["attrs"]["disagreed"]]
    assert work_sent(events, liar) <= len(rechecked) <= work_sent(events, liar) + 1


def settle(worker_ids: set[str]) -> None:
    """A long record of passed checks, validators' too, as a settled high-trust swarm has."""
    vouch(worker_ids, results=200)
    reputations = Reputations(get_redis())
    for wid in worker_ids:
        for _ in range(40):
            reputations.observe(Observation(wid, validation=True))
    reputations.flush()


HIGH_TRUST = {
    "tier": "high_trust",
    "verify_venues": "local",
    "probe_rate": 0.0,
    "validate_trusted_rate": 0.0,
    "explore": 0,
    "min_reputation": 0.0,
}


def test_the_high_trust_gate_has_settled_peers_check_each_other_and_a_validator_decide(
    swarm_factory, venues
):
    # Settled workers (one a turncoat), no floor, no probe: no validator's check is due,
    # so the gate copies each untrusted worker's first answer to a settled peer. The
    # turncoat disagrees with whichever honest worker it meets (as the checked worker or
    # as the peer), a validator decides, and its signed verdict catches it; its other
    # answers are then validated and replaced. Before the change each first answer went
    # to a validator: one per worker per batch.
    swarm = swarm_factory("htgate", 5, latency=40, lie_share=0.2, concurrency=4)
    (liar,) = ids(swarm, liars=True)
    honest = ids(swarm, liars=False)
    settle(honest | {liar})
    policy = {**HIGH_TRUST, "check_floor": 0.0}
    run = finish(launch(question=program(30), venues=["htgate"], policy=policy))
    assert run.status == "succeeded", run.error
    assert eval(run.answer) == [f"Station {i} is north of the river." for i in range(30)]
    events = trace(run)
    # At most its slots less one past the answer the gate checks, drawn among its ~6.
    assert work_sent(events, liar) <= 3 + 6 - 1
    gates = named(events, "Verify.Gate")
    whys = [g["attrs"]["why"] for g in gates]
    # A peer checks each answer the gate takes, or the validator when no settled peer is
    # left that its copy would check too.
    assert all("a settled peer checks it" in w or "no settled peer unchecked" in w for w in whys)
    assert any("a settled peer checks it" in w for w in whys), whys
    # Caught at the gate (as the checked worker, or as the peer that checked another),
    # always on a validator's word.
    rejected = [g for g in gates if g["status"] == "rejected"]
    assert rejected and all(g["attrs"]["caught"] == [liar] for g in rejected)
    assert all("validator" in g["attrs"]["why"] for g in rejected)
    attests = named(events, "Verify.Attest")
    lies = [e for e in attests if e["worker_id"] == liar]
    assert all(e["status"] == "rejected" for e in lies)
    # The honest workers: vouched for by each other or cleared by the validator, never
    # caught; and not one validator's check per worker: a peer's agreement stood for some.
    assert {w for g in gates for w in g["attrs"]["vouched"]} == honest
    assert not {w for g in gates for w in g["attrs"]["caught"]} - {liar}
    assert run.accounts["verification"]["by_kind"].get("replica", 0) >= 1
    assert any(g["status"] == "ok" and "a settled peer" in g["attrs"]["why"] for g in gates)


def test_the_high_trust_gate_has_a_validator_check_a_new_worker_or_one_whose_floor_is_due(
    swarm_factory, venues
):
    # New workers: no record, so every first answer goes to the validator at the gate.
    swarm = swarm_factory("htnew", 2, latency=40, concurrency=4)
    workers = ids(swarm, liars=False)
    run = finish(
        launch(question=program(12), venues=["htnew"], policy={**HIGH_TRUST, "check_floor": 0.0})
    )
    assert run.status == "succeeded", run.error
    gates = named(trace(run), "Verify.Gate")
    assert {g["worker_id"] for g in gates} == workers
    assert all("a validator checks it: new worker" in g["attrs"]["why"] for g in gates), gates
    # Settled, with a floor of 100%: the floor's check is due on every answer, so the gate
    # has the validator's check it, not a peer's.
    settle(workers)
    run = finish(
        launch(question=program(12), venues=["htnew"], policy={**HIGH_TRUST, "check_floor": 1.0})
    )
    assert run.status == "succeeded", run.error
    gates = named(trace(run), "Verify.Gate")
    assert {g["worker_id"] for g in gates} == workers
    assert all("its floor check (100% of its answers) is due" in g["attrs"]["why"] for g in gates)


def test_a_liar_that_answers_its_first_jobs_of_each_batch_honestly_is_caught_at_the_gate(
    swarm_factory, venues
):
    # A settled liar that knows the gate: it answers the first 3 jobs it begins after a
    # pause (a batch's first: its first answer of the batch is one of them) honestly and
    # lies on the others. On the high-trust tier with no settled peer (the other worker is
    # new), a validator makes its gate check and it checks no one. When the gate always
    # took a worker's first answer of a batch, the validator vouched for it every batch
    # and, with no floor and no probe, every other answer of it was taken (this test failed
    # so: never caught in 4 batches). Now the answer checked is drawn among the ~20 it is
    # expected to give: one of its 3 honest ones 3 times in 20, so four batches leave it
    # uncaught once in 2,000 runs.
    swarm = swarm_factory("gateaware", 2, latency=30, lie_share=0.5, concurrency=4, honest_first=3)
    (liar,) = ids(swarm, liars=True)
    settle({liar})  # the honest one is new: a validator checks its answers
    batches, n = 4, 40
    code = (
        "import time\nout = []\n"
        f"for b in range({batches}):\n"
        "    if b:\n        time.sleep(1.0)\n"
        f"    out.append(llm_query_batched({PROMPTS.replace('N', str(n))}))\n"
        "FINAL(repr(out))"
    )
    policy = {**HIGH_TRUST, "check_floor": 0.0}
    run = finish(launch(question=scripted(code), venues=["gateaware"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    gates = named(events, "Verify.Gate")
    caught = [g for g in gates if liar in g["attrs"]["caught"]]
    assert caught, [g["attrs"]["why"] for g in gates if g["worker_id"] == liar]
    # On a validator's word: its gate check, or a peer's disagreement the validator decided
    # (once the new worker is settled, each may be the other's peer).
    assert "validator" in caught[0]["attrs"]["why"]
    if caught[0]["worker_id"] == liar:
        assert caught[0]["attrs"]["answer"] >= 2  # its first answer of a batch is honest
    # Caught, its answers of that batch were validated again and replaced, and it got no
    # more work in the run: the last batch is all right.
    out = eval(run.answer)  # noqa: S307 (our own repr)
    assert out[-1] == [f"Station {i} is north of the river." for i in range(n)]
    assert any(f["worker_id"] == liar for f in named(events, "Verify.Flag"))


def test_a_turncoat_caught_once_gets_only_probes_in_the_next_runs(swarm_factory):
    # After its catch its record is a suspect's: it is neither explored for work nor
    # asked to check another worker's answer (it vouches for no one), so the runs after
    # it send it known-answer probes only. Before, it took explored work or a check in
    # most runs after its turn (bench/trust.py's turncoat: 3 more sends).
    swarm = swarm_factory("aftercatch", 4, latency=30, lie_share=0.25, concurrency=4)
    (liar,) = ids(swarm, liars=True)
    vouch(ids(swarm, liars=False) | {liar})
    policy = {"tier": "redundant", "explore": 0.2, "check_floor": 0.0}
    first = finish(launch(question=program(24), venues=["aftercatch"], policy=policy))
    assert first.status == "succeeded", first.error
    assert liar in {f["worker_id"] for f in named(trace(first), "Verify.Flag")}
    for _ in range(3):
        run = finish(launch(question=program(24), venues=["aftercatch"], policy=policy))
        assert run.status == "succeeded", run.error
        assert eval(run.answer) == [f"Station {i} is north of the river." for i in range(24)]
        sent = [
            e["attrs"].get("copy")
            for e in named(trace(run), "SubQuery.Submit", "start")
            if e["worker_id"] == liar
        ]
        assert set(sent) <= {"probe"}, sent


def test_a_trusted_venues_answers_are_checked_at_the_trusted_rate_only(venues):
    # A trusted venue's workers are vouched for by the operator: on the redundant tier
    # they were checked like strangers (all answers in their warm-up, then the floor),
    # 3-5 copies of every honest batch of 100 in bench/trust.py. Now at
    # validate_trusted_rate, as on the high-trust tier; the gate leaves them alone.
    policy = {"tier": "redundant", "validate_trusted_rate": 0.0, "probe_rate": 0.0}
    run = finish(launch(question=program(12), venues=["local"], policy=policy))
    assert run.status == "succeeded", run.error
    assert eval(run.answer) == [f"Station {i} is north of the river." for i in range(12)]
    assert run.accounts["verification"]["extra"] == 0
    events = trace(run)
    assert not named(events, "Verify.Redundant") and not named(events, "Verify.Gate")
