"""How a run ends: the abort that stops it with a status and a reason, why a run stopped at
its budget, and the record of what happened (the Run row, then Run.Done and the run's span)."""

from __future__ import annotations

from django.utils import timezone

from runs.engine.fanout import Fanout, Totals
from runs.models import Run
from runs.taskgen import answer_correct
from runs.trust.accounts import RunAccounts, RunAccountsFigures
from traces.emitter import Emitter, Span


class RunAbort(Exception):
    def __init__(self, message: str, status: str = Run.Status.FAILED) -> None:
        super().__init__(message)
        self.status = status


def partial_reason(totals: Totals, accounts: RunAccounts, *, answered: bool) -> str:
    """Why the run ended at its budget, and what its answer rests on."""
    t = totals
    refused = accounts.budget.fill(top=0)["refused"]
    rests = (
        f"the answer rests on the {t.subqueries - t.subqueries_failed - t.subqueries_cut} "
        "sub-queries that returned"
        if answered
        else "the program gave no answer before it"
    )
    return (
        f"budget cap reached: {accounts.exhausted} ({refused} dispatches "
        f"refused); {rests}. Raise policy.budget_usd to go further"
    )


def run_record(
    run: Run,
    *,
    status: str,
    answer: str,
    error: str,
    wall_ms: float,
    fanout: Fanout,
    totals: Totals,
) -> tuple[bool | None, RunAccountsFigures]:
    """1. judge the answer if the task has one, 2. close the fan-out, 3. write the answer,
    totals, status and accounts to the run's row: (correct, the accounts' figures)."""
    correct = None
    if status in (Run.Status.SUCCEEDED, Run.Status.PARTIAL) and run.expected_answer:
        correct = answer_correct(run.task, run.expected_answer, answer)
    fanout.close()
    figures = fanout.figures()
    t = totals
    # Conditional: a run failed as abandoned meanwhile (runs/lease.py) keeps that outcome.
    Run.objects.filter(id=run.id, status=Run.Status.RUNNING).update(
        status=status,
        answer=answer,
        error=error,
        correct=correct,
        finished=timezone.now(),
        wall_ms=wall_ms,
        turns=t.turns,
        subqueries=t.subqueries,
        subqueries_failed=t.subqueries_failed,
        subqueries_cut=t.subqueries_cut,
        subqueries_cancelled=t.subqueries_cancelled,
        tokens_in=t.tokens_in,
        tokens_out=t.tokens_out,
        cost=t.cost,
        # Where the conductor's prices came from, as it priced: a command reading the row
        # in another environment (FRLM_PRICES set in its shell only) named its own.
        accounts={**figures, "prices": run.price_sources},
    )
    return correct, figures


def storable(text: str) -> str:
    """`text` as the database can hold it: a lone surrogate (REPL code can FINAL one) is
    replaced, where it failed the row's write and left the run running (a review)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def run_record_failed(run: Run, error: str, wall_ms: float, fanout: Fanout) -> RunAccountsFigures:
    """The run's row failed with `error`, when writing its outcome raised: a run never stays
    "running" (its lease is gone by then, so no watcher would fail it)."""
    figures = fanout.figures()
    Run.objects.filter(id=run.id, status=Run.Status.RUNNING).update(
        status=Run.Status.FAILED, error=error, finished=timezone.now(), wall_ms=wall_ms
    )
    return figures


def run_done(
    emitter: Emitter,
    run_span: Span,
    *,
    status: str,
    answer: str,
    error: str,
    correct: bool | None,
    wall_ms: float,
    totals: Totals,
    figures: RunAccountsFigures,
) -> None:
    """Run.Done with the run's answer and figures, then the run's span ends."""
    t = totals
    # A run stopped at its budget did what its policy said: cancelled, not an error.
    span_status = {"succeeded": "ok", "cancelled": "cancelled", "partial": "cancelled"}.get(
        status, "error"
    )
    emitter.instant(
        "Run.Done",
        parent=run_span.span_id,
        status=span_status,
        payload=answer or error,
        answer=answer[:500],
        error=error or None,
        correct=correct,
        wall_ms=wall_ms,
        subqueries=t.subqueries,
        subqueries_failed=t.subqueries_failed,
        subqueries_cut=t.subqueries_cut,
        subqueries_cancelled=t.subqueries_cancelled,
        tokens_in=t.tokens_in,
        tokens_out=t.tokens_out,
        cost=t.cost,
        run_status=status,
        accounts=figures,
    )
    run_span.end(
        span_status,
        ms=wall_ms,
        tokens_in=t.tokens_in,
        tokens_out=t.tokens_out,
        cost=t.cost,
        error=error or None,
    )
