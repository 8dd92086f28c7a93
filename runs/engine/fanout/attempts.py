"""An attempt's start and end, which every other part of the fanout asks for. It leaves
(prepare: its worker, id, deadline and credit; its Submit span, Retry or Hedge in the trace;
the job the worker gets). It ends once (settle: its outcome, the Return event and the span's
end, and its payment, or its place among the batch's replies while they are judged). Or it is
given up (abandon), sent again elsewhere (retry_or_settle), cancelled with the rest of its
batch (cancel_rest), or stopped by a budget cap (refused)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from frlm_web.money import ZERO
from runs.engine.fanout.book import Place, attempt_place
from runs.engine.fanout.hedging import LatencyWindows
from runs.engine.fanout.routing import Router
from runs.engine.fanout.spending import Spending
from runs.engine.fanout.state import Flight, Scope, Target, Totals, Wave
from runs.engine.fanout.transport import Transport
from runs.trust.budget import BudgetRefused
from traces.emitter import Emitter, Span
from traces.schema import CUT_CANCEL, CUT_QUORUM
from workers.jobs import Job, Result


@dataclass(kw_only=True, eq=False)
class Attempts:
    scope: Scope
    emitter: Emitter
    totals: Totals
    router: Router
    spending: Spending
    transport: Transport
    latency: LatencyWindows
    # Hedges sent in the run: extra work, but not verification.
    hedged: int = field(default=0, init=False)

    # --- leaving ---------------------------------------------------------------------
    def prepare(self, flight: Flight, target: Target, wave: Wave) -> Job:
        """Give the attempt its worker, id and deadline, and say so in the trace."""
        before = flight.venue
        flight.outcome.attempts += 1
        flight.venue = target.venue
        flight.assigned = flight.worker_id = target.worker_id
        flight.queue = target.queue
        flight.slot = target.worker_id or f"venue:{target.venue}"
        flight.tried.update({target.venue, target.worker_id} - {""})
        flight.task_id = ""
        worker = self.router.roster.workers.get(target.worker_id) if target.worker_id else None
        flight.may_bundle = (
            worker is not None
            and worker.get("connection") == "broker"
            and bool(worker.get("trusted"))
        )
        flight.sq_id = f"{flight.outcome.index}.{flight.outcome.attempts}"
        flight.sent_at = time.time()
        flight.deadline = flight.sent_at + self.scope.policy.subquery_timeout_s
        self.router.take(flight, target)
        wave.out[flight.sq_id] = flight
        self._announce(flight, target, before)
        self._follow_book(flight)
        return {
            "run_id": self.scope.run_id,
            "sq_id": flight.sq_id,
            "submit_span": flight.span.span_id,
            "prompt": flight.prompt,
            "model": self.scope.worker_model.to_dict(),
            "deadline": flight.deadline,
            "depth": self.scope.depth,
            "timeout_s": self.scope.policy.subquery_timeout_s,
            "attempt": flight.outcome.attempts,
            **({"validate": self._validate_order(flight)} if flight.judged else {}),
            **self._recorded(flight),
        }

    def place(self, flight: Flight) -> Place:
        """Where the flight's latest attempt stands in the run (book.Place)."""
        scope, done = self.scope, flight.outcome
        return attempt_place(scope.depth, scope.batches, done.index, flight.sq_id, done.attempts)

    def withheld(self, flight: Flight) -> bool:
        """Whether a full replay keeps the attempt's job back: no worker of the recording
        ever started it (Celery dropped it, revoked while queued)."""
        book = self.scope.book
        return book is not None and book.withheld(self.place(flight))

    def _follow_book(self, flight: Flight) -> None:
        """A full replay's attempt that leaves: one whose recorded worker found it cancelled
        as it started is cancelled before it leaves, so the replay's worker does the same
        (its twin's reply or the batch's cut settles it: intake); one the recording timed
        out without a worker ever starting it is due at once (liveness.check_deadlines)."""
        book = self.scope.book
        if book is None:
            return
        place = self.place(flight)
        if book.cancelled_at(place):
            self.transport.revoke([flight])
        elif book.timed_out(place) and book.withheld(place):
            flight.deadline = 0.0
        elif book.withheld(place) and book.held(place):
            self.unburden(flight)

    def unburden(self, flight: Flight) -> None:
        """A full replay's attempt that only waits for the recording's cut or its twin's
        reply, its worker done with it (or never given it): its credit goes to the next job
        and the router no longer counts it as running. Held, such attempts once took every
        credit of the workers the router preferred, and the batch waited for credit that
        never came (seen: three sub-queries unsent until their workers' timeouts)."""
        if flight.slot:
            self.router.free(flight)
            flight.slot = ""  # its release at the cut frees nothing a second time
        flight.started_at = 0.0

    def _recorded(self, flight: Flight) -> dict[str, Any]:
        """A full replay's job carries what its recorded worker answered, a reply or an
        error: no worker loads the cassette, and a failure fails again (book.recorded)."""
        book = self.scope.book
        if book is None or self.scope.worker_model.kind != "cassette":
            return {}
        recorded = book.recorded(self.place(flight))
        return {"recorded": recorded} if recorded else {}

    def _announce(self, flight: Flight, target: Target, before: str) -> None:
        """The attempt in the trace: a first one opens its Submit span, a hedge or a retry is
        an event on it."""
        where = {"venue": target.venue, "worker_id": target.worker_id or None}
        how = self._how(flight, target)
        if flight.span is None:
            # The routing decision and its inputs travel on the Submit span itself.
            self.open_span(
                flight,
                **where,
                route=how,
                routing=target.routing,
                replica_of=flight.original or None,
                copy=flight.kind or None,
            )
        elif flight.hedge and flight.twin is not None:
            twin = flight.twin
            self.hedged += 1  # counted when it leaves: a queued one may be dropped
            self.emitter.instant(
                "SubQuery.Hedge",
                parent=flight.span.span_id,
                depth=self.scope.depth,
                status="ok",
                **where,
                hedged_worker=twin.worker_id or None,
                hedged_venue=twin.venue,
                # How long the hedged attempt had run, or waited queued behind a straggler.
                after_ms=round((flight.sent_at - (twin.started_at or twin.sent_at)) * 1000, 1),
                queued=not twin.started_at or None,
                threshold_ms=self.latency.threshold_ms(twin.venue),
                # What the hedged worker's replies usually take in this run, when known.
                expected_ms=self.latency.worker_ms(twin.worker_id or ""),
                quantile=self.scope.policy.hedge,
                route=how,
                routing=target.routing,
                attempt=flight.outcome.attempts,
                replayed=self.scope.book is not None or None,  # from the recording's book
            )
        else:
            self.emitter.instant(
                "SubQuery.Retry",
                parent=flight.span.span_id,
                depth=self.scope.depth,
                reason=flight.retry_reason,
                from_venue=before,
                **where,
                route=how,
                routing=target.routing,
                attempt=flight.outcome.attempts,
            )

    def _how(self, flight: Flight, target: Target) -> str:
        """Why the attempt goes where it goes: the router's reason, or in a full replay that
        sends it where the recording did (core.Fanout._kept_back), the recording's."""
        book = self.scope.book
        route = book.route(self.place(flight)) if book is not None else None
        return route[1] if route is not None and route[0] == target.venue else target.how

    def _validate_order(self, flight: Flight) -> dict[str, Any]:
        """What a validator needs to attest to the reply it re-runs."""
        judged, batch = flight.judged, self.scope.batch
        assert judged is not None and judged.span is not None
        assert batch is not None and batch.flights[flight.replica_of].span is not None, flight
        return {
            "subquery": batch.flights[flight.replica_of].span.span_id,
            "span": judged.span.span_id,
            "worker": judged.outcome.worker_id,
            "output": judged.outcome.text,
            "mode": self.scope.policy.agree_mode,
        }

    def open_span(self, flight: Flight, **attrs: object) -> Span:
        flight.span = self.emitter.start(
            "SubQuery.Submit",
            parent=self.scope.parent,
            depth=self.scope.depth,
            payload=flight.prompt,
            sq=flight.outcome.index,
            batch=self.scope.batches,
            bytes=len(flight.prompt.encode("utf-8", "replace")),
            **attrs,
        )
        return flight.span

    def refused(self, flight: Flight, refused: BudgetRefused, wave: Wave) -> None:
        """A cap refused the attempt's reservation. The run's stops all dispatching (this
        flight and the backlog end as `budget`), a provider's sends the flight back to be
        routed to another provider, a sub-query's ends that sub-query."""
        reason = refused.attrs["reason"]
        if refused.scope == "provider":
            wave.backlog.appendleft(flight)
        elif refused.scope == "subquery":
            self.settle(flight, "budget", error=reason)
        else:
            self.settle(flight, "budget", error=reason)
            self.settle_backlog(wave, "budget", reason)

    # --- ending ----------------------------------------------------------------------
    def release(self, flight: Flight, wave: Wave, *, spent: Result | None = None) -> None:
        """The attempt is no longer out: free its credit and close its reservation, settled
        at what the reply cost, or released when nothing came of it."""
        wave.out.pop(flight.sq_id, None)
        self.router.free(flight)
        self.spending.close(flight, spent)

    def abandon(self, flight: Flight, wave: Wave) -> None:
        self.release(flight, wave)
        self.transport.revoke([flight])

    def retry_or_settle(self, flight: Flight, status: str, reason: str, wave: Wave) -> None:
        """Another attempt, on another venue where one has credit, while attempts remain
        (none when a hedge twin may still answer for it)."""
        twin = flight.twin
        if twin is not None and wave.holds(twin):
            twin.twin = None
            flight.twin = None
            return
        # An attempt refused for the endpoint it names is not one of its tries (intake).
        if flight.outcome.attempts - flight.unserved <= self.scope.policy.max_retries:
            flight.retry_reason = reason
            if not flight.kind and self.scope.premium_for("retries"):
                flight.venues = self.scope.premium_venues
            wave.backlog.appendleft(flight)
            return
        self.settle(flight, status, error=reason)

    def cancel_rest(self, wave: Wave, reason: str, *, cut: str | None = None) -> None:
        """Cancel what is out and settle what waits, counted as `cut` says (Attempts.settle):
        cut off by the batch's quorum ("quorum") or the run's cancel ("cancel"), or failed
        (a batch deadline's)."""
        gone = list(wave.out.values())
        for flight in gone:
            self.emitter.instant(
                "SubQuery.Cancel",
                parent=flight.span.span_id,
                depth=self.scope.depth,
                status="cancelled",
                reason=reason,
                sq_id=flight.sq_id,
                venue=flight.venue,
            )
            if flight.outcome.status == "pending":  # a hedge's twin settles it only once
                self.settle(flight, "cancelled", error=f"cancelled: {reason}", cut=cut)
        self.transport.revoke(gone)
        for flight in gone:
            self.release(flight, wave)
        self.settle_backlog(wave, "cancelled", f"cancelled before it was sent: {reason}", cut=cut)

    def settle_backlog(
        self, wave: Wave, status: str, reason: str, *, cut: str | None = None
    ) -> None:
        while wave.backlog:
            flight = wave.backlog.popleft()
            if flight.outcome.status == "pending":  # a queued hedge's twin may have settled it
                self.settle(flight, status, error=reason, cut=cut)

    def settle(
        self,
        flight: Flight,
        status: str,
        *,
        error: str = "",
        result: Result | None = None,
        cut: str | None = None,
    ) -> None:
        """The sub-query's outcome, its Return and the end of its Submit span. `cut`: not a
        failure but the batch's quorum, met without it ("quorum", counted as cut off), or the
        run's cancel ("cancel", counted as cancelled): a user's cancel counted every sub-query
        not yet answered as failed (a review)."""
        outcome = flight.outcome
        outcome.status = status
        outcome.error = error
        outcome.venue = flight.venue
        if result is not None:
            outcome.text = result.get("text", "")
            outcome.worker_id = result.get("worker_id", "")
            outcome.tokens_in, outcome.tokens_out = result.get("counted") or (
                result.get("tokens_in", 0),
                result.get("tokens_out", 0),
            )
            outcome.cost = result.get("cost") or ZERO
            outcome.ms = result.get("ms", 0.0)
        self.totals.settled += 1
        if status != "ok" and cut == CUT_QUORUM:
            self.totals.subqueries_cut += 1
        elif status != "ok" and cut == CUT_CANCEL:
            self.totals.subqueries_cancelled += 1
        elif status != "ok":
            self.totals.subqueries_failed += 1
        elif result is not None:
            # The reply is paid for through the attempt it answers for: a winning hedge's
            # through the attempt it hedged, which the tier's verdicts name.
            owner = flight.twin if flight.hedge and flight.twin is not None else flight
            owner.result = result
            state = self.scope.batch
            if state is not None and state.judging:
                state.replied.append(owner)
            else:
                self.spending.pay(owner)
        span = flight.span or self.open_span(flight)  # never sent: its span opens and ends
        # The span's end is the attempt's return: its status, worker and figures. An
        # instant beside it (SubQuery.Return, kept for a result refused, intake.py) said
        # the same again and was a seventh of a sub-query's events (issue 18).
        span.end(
            status if status in {"ok", "timeout", "cancelled"} else "error",
            payload=outcome.text if status == "ok" else None,
            tokens_in=outcome.tokens_in or None,
            tokens_out=outcome.tokens_out or None,
            cost=outcome.cost or None,
            venue=flight.venue or None,
            worker_id=outcome.worker_id or outcome.said_by or None,
            attempts=outcome.attempts,
            error=error or None,
            cut=cut,
        )
