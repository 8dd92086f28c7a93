"""An imported trace's totals: sub-queries cut off at the quorum count as cut, and those the
run's cancel left unanswered as cancelled, not failed, also where the trace has no Run.Done
to say so (a run that failed or was abandoned)."""

from __future__ import annotations

from runs.importing import _totals


def submit_end(status: str, **attrs: str) -> dict:
    return {"name": "SubQuery.Submit", "phase": "end", "status": status, "attrs": attrs}


def test_the_quorums_cut_is_read_from_the_submit_spans_end():
    events = [
        submit_end("ok"),
        submit_end("cancelled", cut="quorum"),
        submit_end("cancelled", cut="cancel"),
        submit_end("cancelled", cut="cancel"),
        submit_end("cancelled"),  # a batch deadline's cut: a failure
        submit_end("cancelled", cut="<anything else>"),  # a failure too
        submit_end("error"),
    ]
    totals = _totals(events, {})
    counts = ("subqueries", "subqueries_failed", "subqueries_cut", "subqueries_cancelled")
    assert [totals[k] for k in counts] == [7, 3, 1, 2]
