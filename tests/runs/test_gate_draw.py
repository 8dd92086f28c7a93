"""Which answer of a batch the check gate takes of each untrusted worker (runs/engine/
fanout/vouching.py, Vouching._draw_due; issue 23): a new or suspect worker's first, a
settled worker's drawn at random among the answers it is expected to give, so that no
answer is one a liar knows to be safe; and how much of the batch the gate lets it take
before the verdict (state.Vouches.cap)."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

from runs.engine.fanout.state import Batch, Flight, Outcome, Vouches
from runs.engine.fanout.vouching import Vouching
from runs.engine.policy import Policy
from runs.trust.verify import Sampler
from workers.reputation import Reputation, Reputations


def gate_of(n: int, seed: int = 1) -> tuple[Vouching, Batch]:
    """A gate and a batch of `n` over a roster: settled workers a and b (4 slots, 40 ms), c
    (4 slots, 80 ms: half their speed), a new worker, one caught lying in the run, a
    trusted one of the same venue, and one of a venue the run does not name."""
    reputations = Reputations(None)  # type: ignore[arg-type]
    for worker in ("a", "b", "c", "t", "other", "liar"):
        reputations.known[worker] = Reputation(worker, consecutive_valid=50)
    reputations.known["new"] = Reputation("new", consecutive_valid=2)
    workers = {
        w: {"venue": "edge", "concurrency": 4, "latency_ms": 40} for w in ("a", "b", "new", "liar")
    }
    workers["c"] = {"venue": "edge", "concurrency": 4, "latency_ms": 80}
    workers["t"] = {"venue": "edge", "concurrency": 4, "latency_ms": 40, "trusted": True}
    workers["other"] = {"venue": "far", "concurrency": 4, "latency_ms": 40}
    judge = SimpleNamespace(
        caught={"liar": "outvoted"}, reputations=reputations, rng=random.Random(seed)
    )
    gate = Vouching(
        scope=SimpleNamespace(policy=Policy(), answer_venues=frozenset({"edge"})),  # type: ignore[arg-type]
        roster=SimpleNamespace(workers=workers),  # type: ignore[arg-type]
        emitter=None,  # type: ignore[arg-type]
        judge=judge,  # type: ignore[arg-type]
        tally=None,  # type: ignore[arg-type]
        enqueue=lambda flights, wave: None,
    )
    state = Batch([Flight(Outcome(i), "p") for i in range(n)], "redundant", 0, None, True)
    gate._expected = gate._expect(state)
    return gate, state


def draws(n: int, batches: int = 1, seed: int = 1) -> list[dict[str, int]]:
    """The gate's draws for `batches` batches of `n` over gate_of's roster."""
    gate, state = gate_of(n, seed)
    return [gate._draw_due(state) for _ in range(batches)]


def test_only_settled_untrusted_workers_of_the_run_get_a_draw():
    (due,) = draws(45)
    # new: its first answer (no draw); liar: no more work; t: trusted, not gated; other:
    # not a venue of the run.
    assert set(due) == {"a", "b", "c"}


def test_a_draw_falls_anywhere_in_the_workers_expected_share_by_slots_over_latency():
    # 45 sub-queries over a, b, new, t at speed 1 and c at half: a's share is 10.
    seen = Counter(d["a"] for d in draws(45, batches=2000))
    assert set(seen) == set(range(1, 11))  # every answer of its share can be the one
    assert min(seen.values()) > 2000 / 10 * 0.7  # and none much less often than another
    assert max(d["c"] for d in draws(45, batches=500)) == 5  # half as fast: half the share
    # A batch smaller than the workers: the first answer, the only one it may give.
    assert {d["a"] for d in draws(3, batches=50)} == {1}


def test_the_gate_gives_the_answers_before_the_drawn_one_on_top_of_the_slots_less_one():
    gate = Vouches(barred={}, positions={}, due={"a": 5})
    assert gate.cap("a", 4) == 3 + 4
    assert gate.cap("new", 4) == 3  # its first answer is checked
    assert gate.cap("new", 1) == 1  # a one-slot worker still gets its one


def test_the_high_trust_floor_peek_expects_the_share_the_draw_is_made_over():
    # a's share of 45 is 10 (the trusted t takes its own share; the caught liar none). The
    # peek once split the batch evenly over the untrusted workers (9 here, the liar's and
    # the trusted worker's shares mixed in), so its floor check fell due in other batches
    # than the ones its answers would reach it.
    gate, _state = gate_of(45)
    assert round(gate._expected["a"], 9) == 10 and "liar" not in gate._expected
    policy = Policy(check_floor=0.04)
    gate.scope.policy = policy
    gate.judge.sampler = Sampler(random.Random(0))
    gate.judge.sampler._credit["a"] = 0.59  # 0.59 + 0.04 x 10 < 1: not in this batch
    assert gate._validator_due("a") == ""
    gate.judge.sampler._credit["a"] = 0.61  # 0.61 + 0.04 x 10 >= 1: in this batch
    assert "floor check" in gate._validator_due("a")
