"""The report's measures read from a trace what the run did, not what a worker said."""

from __future__ import annotations

from runs.experiments.measures import RunTrace, budget_curve


def _event(name: str, phase: str, ts: int, span: str, cost: float | None = None) -> dict:
    return {
        "name": name,
        "phase": phase,
        "ts": ts,
        "span_id": span,
        "parent_id": None,
        "cost": cost,
        "attrs": {},
    }


def test_figure_2_draws_what_the_run_paid_not_what_a_worker_claimed() -> None:
    """A gateway worker may end its own Execute span with a cost of up to $1,000,000; the
    run pays it at most its price's worth of its tokens, on the Submit span's end. Figure 2
    summed the Execute spans: a run that paid $0.0002 of a $0.01 cap was drawn at a hundred
    million times its cap (a review)."""
    trace = RunTrace(
        "r1",
        [
            _event("Run.Init", "start", 0, "root"),
            _event("Run.Decode", "start", 2, "d1"),
            _event("Run.Decode", "end", 8, "d1", cost=0.0003),
            _event("SubQuery.Submit", "start", 10, "s1"),
            _event("SubQuery.Execute", "start", 20, "x1"),
            _event("SubQuery.Execute", "end", 30, "x1", cost=1_000_000.0),
            _event("SubQuery.Submit", "end", 40, "s1", cost=0.0002),
            _event("Run.Init", "end", 100, "root"),
        ],
    )
    curve = budget_curve(trace, 0.01)
    assert curve is not None
    assert curve[-1] == (0.0003 + 0.0002) / 0.01
    assert max(curve) == curve[-1]
