"""How long a batch waits for a worker when none of its venues has one live."""

from __future__ import annotations

from types import SimpleNamespace

from runs.engine.fanout.liveness import Liveness
from runs.engine.policy import Policy


def test_a_batch_waits_for_a_worker_as_long_as_an_attempt_may_take():
    """It waited 15 s at most: a run whose one remote worker's link was down for 20 s
    failed most of its batch ("no live worker") and "succeeded" on the rest (a review)."""
    for timeout_s in (5.0, 60.0, 300.0):
        scope = SimpleNamespace(policy=Policy.from_dict({"subquery_timeout_s": timeout_s}))
        liveness = Liveness(scope=scope, roster=None, emitter=None, router=None, attempts=None)
        assert liveness._grace_s == timeout_s
