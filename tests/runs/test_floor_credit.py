"""Which checks made outside the floor's sample count toward it (runs/engine/fanout/
judging.py, Judge._load_credit; issue 23): the gate's, a passed probe; on the high-trust
tier only a check a validator made, not a peer's agreement; and none while a worker is in
its warm-up, when every answer of it is checked anyway."""

from __future__ import annotations

import random
from types import SimpleNamespace

from runs.engine.fanout.judging import Judge
from runs.engine.fanout.state import Batch, Flight, Outcome, Vouches
from runs.trust.verify import CheckRule
from workers.reputation import Reputation, Reputations

SETTLED = ("a", "b", "c", "d")


def answered(worker: str, kind: str = "") -> Flight:
    return Flight(Outcome(0, status="ok", text="x", worker_id=worker), "p", kind=kind)


def judged(tier: str, early: dict[int, list[Flight]], probed: list[str]) -> dict[str, float]:
    """Each worker's credit after the judge loads it for a batch whose gate made `early`'s
    copies and whose probes `probed` passed, every credit starting at 0.5."""
    reputations = Reputations(None)  # type: ignore[arg-type]
    for worker in SETTLED:
        reputations.known[worker] = Reputation(worker, consecutive_valid=50)
    reputations.known["new"] = Reputation("new", consecutive_valid=2)
    workers = {w: {"venue": "edge"} for w in (*SETTLED, "new")}
    workers["v"] = {"venue": "local", "trusted": True}
    judge = Judge(
        scope=None,  # type: ignore[arg-type]
        roster=SimpleNamespace(workers=workers),  # type: ignore[arg-type]
        emitter=None,  # type: ignore[arg-type]
        totals=None,  # type: ignore[arg-type]
        tally=None,  # type: ignore[arg-type]
        reputations=reputations,
        rng=random.Random(1),
        public_key=lambda worker: None,
        send=lambda flights: None,
    )
    state = Batch([answered(w) for w in ("a", "c", "new")], tier, 0, None, True)
    state.vouches = Vouches(barred={}, positions={})
    state.vouches.early = early
    state.probed = probed
    assert judge.sampler is not None
    judge.sampler._credit = {w: 0.5 for w in (*SETTLED, "new")}
    judge._load_credit(state, CheckRule(floor=0.04, warmup=10))
    return judge.sampler._credit


def test_on_the_high_trust_tier_only_a_validators_check_or_a_probe_counts():
    credit = judged(
        "high_trust",
        {
            0: [answered("b", "replica")],  # a and b agreed: no validator's word
            1: [answered("d", "replica"), answered("v", "validator")],  # a validator decided
            2: [answered("v", "validator")],  # a new worker's check
        },
        probed=["b"],
    )
    assert credit["a"] == 0.5  # a peer's agreement: the floor's check is still owed
    assert credit["b"] == -0.5  # its passed probe counts, its copy for a does not
    assert credit["c"] == credit["d"] == -0.5  # checked against the validator's answer
    assert credit["new"] == 0.5  # in its warm-up every answer is checked anyway


def test_on_the_redundant_tier_a_copy_counts_for_both_workers():
    credit = judged("redundant", {0: [answered("b", "replica")]}, probed=[])
    assert credit["a"] == credit["b"] == -0.5
    assert credit["c"] == 0.5
