"""The simulated swarm and the scheduler on real worker processes: profiles, routing that
a trace explains, failover when a worker is killed, churn, circuit breakers, forged
results."""

from __future__ import annotations

import os
import signal

import pytest

from frlm_web.redis_client import get_redis
from tests.helpers import finish, launch, named, scripted, trace, wait_until
from traces import store
from workers.jobs import encode_result, results_stream
from workers.reputation import Observation, Reputations, load
from workers.services import worker_strikes
from workers.swarm import ProfileFileError, SwarmProfile, devices, profile_load


def batch(n: int, tag: str = "question") -> str:
    return scripted(
        f"rs = llm_query_batched(['{tag} %d' % i for i in range({n})])\nFINAL(repr(rs))"
    )


def running_on(run, worker_id: str | None) -> bool:
    """Whether a sub-query of the run has started on the worker (any worker for None)."""
    return any(
        e["name"] == "SubQuery.Execute" and worker_id in (None, e["worker_id"])
        for e in store.read_events(run.id)
    )


def test_it_reads_profiles_and_says_what_is_wrong_with_a_bad_one(tmp_path) -> None:
    edge = profile_load("edge")
    assert edge.slow_share == 0.25 and edge.concurrency == 4
    with pytest.raises(ProfileFileError, match="shipped profiles: churn, datacenter, edge"):
        profile_load("nonesuch")
    bad = tmp_path / "bad.toml"
    bad.write_text("[latency]\nslow_share = 2\n[faults]\nfailure_rate = 'often'\n")
    with pytest.raises(ProfileFileError) as caught:
        profile_load(str(bad))
    assert "[latency] slow_share must be between 0 and 1, got 2" in str(caught.value)
    assert "[faults] failure_rate must be a number" in str(caught.value)
    # Typos and keys in the wrong table were ignored, the default left in force (found by a
    # review).
    typo = tmp_path / "typo.toml"
    typo.write_text("median_ms = 900\n[latency]\nmedian_m = 900\n[faults]\nfailure_rte = 0.5\n")
    with pytest.raises(ProfileFileError) as caught:
        profile_load(str(typo))
    said = str(caught.value)
    assert "median_ms is not a profile key (it goes under [latency])" in said
    assert "[latency] median_m is not a profile key (known: " in said
    assert "[faults] failure_rte is not a profile key" in said


def test_it_draws_the_same_devices_for_the_same_seed() -> None:
    profile = SwarmProfile("t", slow_share=0.25, slow_factor=3, lie_share=0.5, lie_rate=1)
    one, two = devices(profile, "edge", 8, 7), devices(profile, "edge", 8, 7)
    assert one == two
    assert sum(d.slow for d in one) == 2 and sum(d.liar for d in one) == 4
    assert {d.sim["latency_ms"] for d in one if d.slow} == {450.0}


def test_it_routes_away_from_slow_workers_and_records_why(swarm_factory) -> None:
    swarm = swarm_factory("swarmfast", 4, slow_share=0.25, latency=150)
    slow_names = {d.name for d in swarm.devices if d.slow}
    slow = {w["worker_id"] for w in swarm.live() if w["label"] in slow_names}
    assert len(slow) == 1
    run = finish(launch(question=batch(96), venues=["swarmfast"]))
    assert run.status == "succeeded", run.error
    events = trace(run)
    submits = named(events, "SubQuery.Submit", "start")
    assert len(submits) == 96
    routes = [e["attrs"]["routing"] for e in submits]
    assert all({"worker", "eta_ms", "reputation", "load", "price"} <= set(r) for r in routes)
    # Each job is explored or not once (policy explore 5%: about 5 of 96), however many
    # plans it waits through for a busy worker; redrawn per plan, a third were explored.
    assert sum(r["how"] == "explore" for r in routes) <= 14, routes
    by_worker = {}
    for e in submits:
        by_worker[e["worker_id"]] = by_worker.get(e["worker_id"], 0) + 1
    assert len(by_worker) == 4
    # The slow device runs at a quarter of the speed: it should get well under its quarter.
    slow_share = sum(by_worker.get(w, 0) for w in slow) / 96
    assert slow_share < 0.2, (slow, by_worker)


def test_a_worker_below_the_reputation_gate_gets_only_explored_work(swarm_factory) -> None:
    """While the good workers are busy, the jobs waiting for them are planned again after
    every reply; the gated worker stands idle beside them. Each job's exploration draw is
    made once and names the worker it explores, so the gated one gets about a third of the
    policy's 5% (redrawn per plan, it got a third of all the work)."""
    swarm = swarm_factory("swarmgate", 3, latency=40)
    gated = swarm.live()[0]["worker_id"]
    reputations = Reputations(get_redis())
    for _ in range(30):
        reputations.observe(Observation(gated, completion=True, agreement=False))
    reputations.flush()
    run = finish(launch(question=batch(120), venues=["swarmgate"]))
    assert run.status == "succeeded", run.error
    submits = named(trace(run), "SubQuery.Submit", "start")
    on_gated = [e for e in submits if e["worker_id"] == gated]
    assert len(on_gated) <= 14, len(on_gated)  # 5% of 120 over 3 workers is 2
    assert all(e["attrs"]["routing"]["how"] == "explore" for e in on_gated)


def test_it_finishes_the_work_of_a_killed_worker_elsewhere(swarm_factory) -> None:
    swarm = swarm_factory("swarmkill", 3, latency=600)
    run = launch(question=batch(24), venues=["swarmkill"], policy={"max_retries": 2})
    victim = swarm.live()[0]
    wait_until(lambda: running_on(run, victim["worker_id"]), what="the victim to hold work")
    os.kill(int(victim["pid"]), signal.SIGKILL)
    run = finish(run)
    assert run.status == "succeeded", run.error
    replies = eval(run.answer)  # noqa: S307 (our own repr of a list of str)
    assert len(replies) == 24 and not [r for r in replies if r.startswith("[frlm:")]
    events = trace(run)
    by = {}
    for e in named(events, "SubQuery.Submit", "start"):
        by[e["worker_id"]] = by.get(e["worker_id"], 0) + 1
    retries = [e["attrs"] for e in named(events, "SubQuery.Retry")]
    lost = named(events, "Worker.Lost")
    assert len(lost) == 1, (victim["worker_id"], by, retries)
    (lost,) = lost
    assert lost["worker_id"] == victim["worker_id"]
    assert named(events, "SubQuery.Retry")
    # The swarm brings the device back (a crash is restarted).
    wait_until(lambda: len(swarm.live()) == 3, timeout=60, what="the killed device to rejoin")


def test_it_keeps_answering_while_devices_come_and_go(swarm_factory) -> None:
    swarm = swarm_factory("swarmchurn", 4, latency=200, leave=2.0)
    runs = [
        launch(question=batch(16, f"q{i}"), venues=["swarmchurn"], policy={"max_retries": 3})
        for i in range(3)
    ]
    for run in runs:
        run = finish(run, timeout=120)
        assert run.status == "succeeded", run.error
        assert not [r for r in eval(run.answer) if r.startswith("[frlm:")]  # noqa: S307
    # A device that left late in the last run comes back after it: the swarm keeps going
    # until one has left and come back (the churn is random; 2 s apart on average).
    swarm.wait_said("rejoins")
    out = swarm.stop()
    assert "leaves" in out and "rejoins" in out


def test_it_opens_the_breaker_of_a_failing_worker_and_routes_around_it(swarm_factory) -> None:
    swarm_factory("swarmok", 1, latency=50, concurrency=4)
    bad = swarm_factory("swarmbad", 1, latency=20, concurrency=4, failure_rate=1.0)
    (bad_worker,) = [w["worker_id"] for w in bad.live()]
    run = finish(
        launch(question=batch(40), venues=["swarmok", "swarmbad"], policy={"max_retries": 3})
    )
    assert run.status == "succeeded", run.error
    assert not [r for r in eval(run.answer) if r.startswith("[frlm:")]  # noqa: S307
    events = trace(run)
    opened = [e for e in named(events, "Circuit.Open") if e["worker_id"] == bad_worker]
    assert opened and opened[0]["attrs"]["failures"] == 5
    # Once open, nothing more is sent there.
    when = opened[0]["ts"]
    later = [
        e
        for e in named(events, "SubQuery.Submit", "start") + named(events, "SubQuery.Retry")
        if e["ts"] > when and e["worker_id"] == bad_worker
    ]
    assert later == []


def test_it_rejects_a_forged_result_and_counts_it_against_the_worker(swarm_factory) -> None:
    swarm = swarm_factory("swarmforge", 2, latency=1500)
    run = launch(question=batch(4), venues=["swarmforge"])
    wait_until(lambda: running_on(run, None), what="the batch to start")
    client = get_redis()
    forger = swarm.live()[0]["worker_id"]
    before = worker_strikes(forger)
    for sq in ("1.1", "2.1", "3.1", "4.1"):
        client.xadd(
            results_stream(run.id),
            encode_result(
                {
                    "sq_id": sq,
                    "status": "ok",
                    "text": "FORGED",
                    "worker_id": forger,
                    "venue": "swarmforge",
                    "sig": "bm90IGEgc2lnbmF0dXJl",
                }
            ),
        )
    run = finish(run)
    assert run.status == "succeeded", run.error
    assert "FORGED" not in run.answer
    rejected = [e for e in named(trace(run), "SubQuery.Return") if e["status"] == "rejected"]
    assert len(rejected) == 4
    assert all(e["worker_id"] == forger for e in rejected)
    assert worker_strikes(forger) == pytest.approx(before + 4, abs=0.05)  # fading, slowly


def test_it_accepts_only_what_distinct_workers_agree_on(swarm_factory) -> None:
    swarm = swarm_factory("swarmlie", 3, latency=30, lie_share=0.34)
    (liar_name,) = [d.name for d in swarm.devices if d.liar]
    (liar,) = [w["worker_id"] for w in swarm.live() if w["label"] == liar_name]
    policy = {"tier": "redundant", "replicas": 2, "agree": 2, "max_replicas": 3, "explore": 0}
    run = finish(launch(question=batch(24), venues=["swarmlie"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    verdicts = named(events, "Verify.Redundant")
    assert len(verdicts) == 24
    accepted = [v for v in verdicts if v["attrs"]["outcome"] == "accept"]
    # Two honest workers always agree with each other, so every sub-query is settled ...
    assert len(accepted) == 24
    # ... and never on the liar's word: where it answered, it was outvoted.
    assert all(liar not in v["attrs"]["agreed"] for v in accepted)
    caught = [v for v in accepted if liar in v["attrs"]["disagreed"]]
    assert caught and all(len(v["links"]) >= 3 for v in caught)
    assert not [r for r in eval(run.answer) if r.startswith("[frlm:")]  # noqa: S307
    assert load(get_redis(), [liar])[liar].mean("agreement") < 0.5


def test_it_leaves_unresolved_what_no_two_workers_agree_on(swarm_factory) -> None:
    swarm_factory("swarmallie", 3, latency=30, lie_share=1.0)
    program = scripted("FINAL(llm_query('question 1', tier='redundant'))")
    run = finish(launch(question=program, venues=["swarmallie"], policy={"max_replicas": 3}))
    assert run.status == "succeeded", run.error
    assert run.answer.startswith("[frlm:unresolved] sub-query 1: "), run.answer
    (verdict,) = named(trace(run), "Verify.Redundant")
    assert verdict["status"] == "rejected" and verdict["attrs"]["outcome"] == "unresolved"
    # Either the check gate asked the other two while the batch was out (three answers,
    # none agreeing), or each worker failed its known-answer probe first and none of them
    # votes: unresolved either way, nothing guessed, every worker flagged (issue 23).
    reason = verdict["attrs"]["reason"]
    assert "3 different answers" in reason or "no other live worker to ask" in reason, reason
    assert len({f["worker_id"] for f in named(trace(run), "Verify.Flag")}) == 3


def test_it_checks_edge_answers_on_the_venue_the_run_names_for_it(swarm_factory) -> None:
    swarm_factory("mobedge", 2, latency=30)
    swarm_factory("mobdc", 2, latency=10)
    policy = {"tier": "redundant", "verify_venues": "mobdc", "explore": 0}
    run = finish(launch(question=batch(12), venues=["mobedge"], policy=policy))
    assert run.status == "succeeded", run.error
    events = trace(run)
    submits = named(events, "SubQuery.Submit", "start")
    answers = [e for e in submits if not e["attrs"].get("replica_of") and not is_probe(e)]
    copies = [e for e in submits if e["attrs"].get("replica_of")]
    assert len(answers) == 12 and {e["venue"] for e in answers} == {"mobedge"}
    # New workers answer known-answer probes first, on their own venue (issue 23).
    assert {e["venue"] for e in submits if is_probe(e)} <= {"mobedge"}
    assert len(copies) == 12 and {e["venue"] for e in copies} == {"mobdc"}
    assert all(v["attrs"]["outcome"] == "accept" for v in named(events, "Verify.Redundant"))


def is_probe(event: dict) -> bool:
    return event["attrs"].get("copy") == "probe"


def test_it_refuses_a_bad_verify_venue_list() -> None:
    from runs.engine.policy import Policy, PolicyError

    with pytest.raises(PolicyError, match="policy.verify_venues must be venue names"):
        Policy.from_dict({"verify_venues": "dc; rm -rf"})
    assert Policy.from_dict({"verify_venues": "dc,pod-2"}).verify_venues == "dc,pod-2"
