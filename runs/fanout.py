"""Asynchronous fanout: a batch of sub-queries goes out as Celery jobs on the run's venues
and is collected from the run's result stream as replies arrive, under a quorum and
deadlines. Stragglers are cancelled; a failed, timed-out or orphaned job is retried on
another venue while attempts remain.

Dispatch is credit-based: a venue is given as many jobs as its live workers have slots,
plus a small margin that hides the refill round trip, and each reply frees a credit for the
next job. Queues stay short, so a slow or busy venue takes less work instead of holding
the batch's tail, and every routing decision is made with the venue's current load."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from runs.policy import Policy
from traces.emitter import Emitter, Span
from workers import venues
from workers.backends import ModelSpec
from workers.jobs import Job, Result, cancelled_key, decode_result, results_stream

# How often the liveness of workers holding jobs is checked, in seconds.
LIVENESS_EVERY_S = 1.0
# Jobs published per pipelined round trip: the first wave leaves before the batch is built.
DISPATCH_FLUSH = 8
# Jobs queued at a venue beyond its slots, as a fraction of them: enough that a worker
# finishing a job finds the next one waiting, few enough that queues stay short.
QUEUE_MARGIN = 0.25
NO_VENUE = "no live worker on any of the run's venues"


class FanoutAbort(Exception):
    """The batch cannot go on (no live worker, run cancelled); the run should end."""

    def __init__(self, message: str, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


class LimitExceeded(Exception):
    """A REPL call asked for more than the policy allows; the REPL code sees the message."""


@dataclass
class Outcome:
    index: int
    status: str = "pending"  # ok | error | timeout | cancelled
    text: str = ""
    error: str = ""
    venue: str = ""
    worker_id: str = ""
    attempts: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    ms: float = 0.0

    def reply(self) -> str:
        """What the REPL function returns: the text, or a marker saying what went wrong."""
        if self.status == "ok":
            return self.text
        return f"[frlm:{self.status}] sub-query {self.index}: {self.error}"


@dataclass
class Totals:
    turns: int = 0
    subqueries: int = 0
    subqueries_failed: int = 0
    settled: int = 0
    calls: int = 0  # sub-queries and child RLMs, counted against policy.max_subqueries
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0

    def add_tokens(self, tokens_in: int, tokens_out: int, cost: float | None) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost or 0.0


@dataclass
class _Flight:
    outcome: Outcome
    prompt: str
    span: Span | None = None
    sq_id: str = ""
    venue: str = ""
    task_id: str = ""
    deadline: float = 0.0
    worker_id: str = ""
    retry_reason: str = ""
    tried: set[str] = field(default_factory=set)


class Fanout:
    def __init__(
        self,
        *,
        run_id: str,
        client: redis.Redis,
        emitter: Emitter,
        policy: Policy,
        venue_names: list[str],
        worker_model: ModelSpec,
        totals: Totals,
        cancelled: Callable[[], bool],
        on_progress: Callable[[], None],
    ) -> None:
        self.run_id = run_id
        self.client = client
        self.emitter = emitter
        self.policy = policy
        self.venue_names = venue_names
        self.worker_model = worker_model
        self.totals = totals
        self.cancelled = cancelled
        self.on_progress = on_progress
        self.stream = results_stream(run_id)
        self.last_id = "0-0"
        self.counter = 0
        self.batches = 0
        self._inflight: dict[str, int] = {}  # this run's published, unsettled jobs per venue
        self._limit: dict[str, int] = {}  # slots plus margin, per live venue
        self._live: dict[str, set[str]] = {}
        self._checked = 0.0
        self._backlog: deque[_Flight] = deque()
        self._parent: str | None = None
        self._depth = 0

    # --- public ----------------------------------------------------------------------
    def check_limits(self, count: int, *, what: str = "llm_query_batched") -> None:
        if count > self.policy.max_batch:
            raise LimitExceeded(
                f"{what} got {count} prompts; this run allows at most "
                f"{self.policy.max_batch} per batch (policy.max_batch): split the list"
            )
        if self.totals.calls + count > self.policy.max_subqueries:
            left = self.policy.max_subqueries - self.totals.calls
            raise LimitExceeded(
                f"this run may make {self.policy.max_subqueries} sub-queries in all "
                f"(policy.max_subqueries); {left} are left and {count} were asked for"
            )

    def run_batch(self, prompts: list[str], *, depth: int, parent: str | None) -> list[Outcome]:
        """1. check the limits, 2. send as many jobs as the venues have credit for,
        3. collect replies, sending the rest as credit frees, until all are settled, the
        quorum is met or the deadline passes."""
        self.check_limits(len(prompts))
        self.totals.calls += len(prompts)
        self._refresh_venues(force=True)
        self._parent, self._depth = parent, depth
        self.batches += 1
        batch = [_Flight(Outcome(i), p) for i, p in enumerate(prompts)]
        for flight in batch:
            self.counter += 1
            flight.outcome.index = self.counter
        self._backlog = deque(batch)
        flights: dict[str, _Flight] = {}
        self.totals.subqueries += len(prompts)
        self._pump(flights)
        self.on_progress()
        self._collect(batch, flights)
        return [flight.outcome for flight in batch]

    # --- dispatch --------------------------------------------------------------------
    def _refresh_venues(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < LIVENESS_EVERY_S:
            return
        self._checked = now
        for name in self.venue_names:
            workers = venues.live_workers(self.client, name)
            self._live[name] = {w["name"] for w in workers}
            slots = sum(int(w.get("concurrency", 1)) for w in workers)
            self._limit[name] = slots + max(2, math.ceil(slots * QUEUE_MARGIN)) if slots else 0
        if force and not any(self._limit.values()):
            raise FanoutAbort(
                f"no live worker on the run's venues ({', '.join(self.venue_names)}); start one "
                f"with `python manage.py frlm_worker --venue {self.venue_names[0]}` or `make up`"
            )

    def _choose_venue(self, avoid: set[str]) -> tuple[str, str]:
        """The live venue with the most free credit, relative to its size; venues tried
        before for this sub-query only when no other has credit. "" when none has."""
        open_ = [v for v in self.venue_names if self._limit.get(v, 0) > self._inflight.get(v, 0)]
        fresh = [v for v in open_ if v not in avoid] or open_
        if not fresh:
            return "", ""
        best = max(fresh, key=lambda v: 1 - self._inflight.get(v, 0) / self._limit[v])
        return (
            best,
            f"most free credit: {self._inflight.get(best, 0)} of {self._limit[best]} in use",
        )

    def _pump(self, flights: dict[str, _Flight]) -> None:
        """Send backlog jobs while some venue has credit: their Submit spans in one round
        trip, their messages through one producer, pipelined DISPATCH_FLUSH at a time."""
        ready: list[tuple[_Flight, Job]] = []
        with self.emitter.batch():
            while self._backlog:
                venue, why = self._choose_venue(self._backlog[0].tried)
                if not venue:
                    break
                flight = self._backlog.popleft()
                ready.append((flight, self._prepare(flight, venue, why, flights)))
        if not ready:
            return
        from frlm_web.celery import app

        with app.producer_or_acquire() as producer, producer.batch(max_size=DISPATCH_FLUSH):
            for flight, job in ready:
                self._publish(flight, job, producer)

    def _prepare(self, flight: _Flight, venue: str, why: str, flights: dict[str, _Flight]) -> Job:
        """Give the attempt its venue, id and deadline, and say so in the trace."""
        before = flight.venue
        flight.outcome.attempts += 1
        flight.venue = venue
        flight.tried.add(venue)
        flight.worker_id = ""
        flight.task_id = ""
        flight.sq_id = f"{flight.outcome.index}.{flight.outcome.attempts}"
        flight.deadline = time.time() + self.policy.subquery_timeout_s
        self._inflight[venue] = self._inflight.get(venue, 0) + 1
        flights[flight.sq_id] = flight
        if flight.span is None:
            # The routing decision and its inputs travel on the Submit span itself.
            self._open_span(flight, venue=venue, route=why)
        else:
            self.emitter.instant(
                "SubQuery.Retry",
                parent=flight.span.span_id,
                depth=self._depth,
                reason=flight.retry_reason,
                from_venue=before,
                venue=venue,
                route=why,
                attempt=flight.outcome.attempts,
            )
        return {
            "run_id": self.run_id,
            "sq_id": flight.sq_id,
            "submit_span": flight.span.span_id,
            "prompt": flight.prompt,
            "model": self.worker_model.to_dict(),
            "deadline": flight.deadline,
            "depth": self._depth,
            "timeout_s": self.policy.subquery_timeout_s,
            "attempt": flight.outcome.attempts,
        }

    def _open_span(self, flight: _Flight, **attrs: object) -> Span:
        flight.span = self.emitter.start(
            "SubQuery.Submit",
            parent=self._parent,
            depth=self._depth,
            payload=flight.prompt,
            sq=flight.outcome.index,
            batch=self.batches,
            bytes=len(flight.prompt.encode("utf-8", "replace")),
            **attrs,
        )
        return flight.span

    def _publish(self, flight: _Flight, job: Job, producer: Any) -> None:
        from workers.tasks import subquery_execute

        # argsrepr: otherwise Celery builds a repr of the whole prompt for its logs.
        sent = subquery_execute.apply_async(
            args=[job],
            queue=venues.venue_queue(flight.venue),
            expires=self.policy.subquery_timeout_s,
            producer=producer,
            argsrepr=f"[{self.run_id} sub-query {flight.sq_id}]",
            kwargsrepr="{}",
        )
        flight.task_id = sent.id

    # --- collection ------------------------------------------------------------------
    def _collect(self, batch: list[_Flight], flights: dict[str, _Flight]) -> None:
        need = math.ceil(self.policy.quorum * len(batch))
        batch_deadline = time.time() + self.policy.batch_deadline_s
        last_progress = 0.0
        while flights or self._backlog:
            if self.cancelled():
                self._cancel_rest(flights, "the run was cancelled")
                raise FanoutAbort("the run was cancelled", status="cancelled")
            now = time.time()
            wake = min([f.deadline for f in flights.values()] + [batch_deadline])
            block_ms = int(max(1, min(200, (wake - now) * 1000)))
            reply = self.client.xread({self.stream: self.last_id}, count=1000, block=block_ms)
            with self.emitter.batch():
                for _, entries in reply or []:
                    for entry_id, fields in entries:
                        self.last_id = entry_id
                        self._on_result(decode_result(fields), flights)
                self._check_deadlines(flights)
                self._check_lost_workers(flights)
                settled = sum(1 for f in batch if f.outcome.status != "pending")
                if (flights or self._backlog) and settled >= need:
                    self._cancel_rest(flights, f"quorum of {need}/{len(batch)} reached")
                elif (flights or self._backlog) and time.time() > batch_deadline:
                    self._cancel_rest(
                        flights, f"batch deadline of {self.policy.batch_deadline_s} s passed"
                    )
                elif self._backlog and not any(self._limit.values()):
                    self._settle_backlog("error", NO_VENUE)
            self._pump(flights)
            if time.monotonic() - last_progress > 0.2:
                self.on_progress()
                last_progress = time.monotonic()
        self.on_progress()

    def _on_result(self, result: Result, flights: dict[str, _Flight]) -> None:
        flight = flights.get(result.get("sq_id", ""))
        if flight is None:
            return  # a late reply to an attempt that was already settled or replaced
        status = result.get("status")
        if status == "started":
            flight.worker_id = result.get("worker_id", "")
            return
        self._release(flight, flights)
        if status == "ok":
            self.totals.add_tokens(
                result.get("tokens_in", 0), result.get("tokens_out", 0), result.get("cost")
            )
            self._settle(flight, "ok", result=result)
        elif status == "error":
            self._retry_or_settle(flight, "error", result.get("error", "failed"))
        else:
            self._retry_or_settle(
                flight, "error", "the worker dropped the job as expired or cancelled"
            )

    def _check_deadlines(self, flights: dict[str, _Flight]) -> None:
        now = time.time()
        for flight in [f for f in flights.values() if f.deadline <= now]:
            self._abandon(flight, flights)
            self.emitter.instant(
                "SubQuery.Timeout",
                parent=flight.span.span_id,
                depth=self._depth,
                status="timeout",
                sq_id=flight.sq_id,
                venue=flight.venue,
                worker_id=flight.worker_id or None,
            )
            self._retry_or_settle(
                flight,
                "timeout",
                f"no reply within {self.policy.subquery_timeout_s} s (policy.subquery_timeout_s)",
            )

    def _check_lost_workers(self, flights: dict[str, _Flight]) -> None:
        if not flights and not self._backlog:
            return
        self._refresh_venues()
        for flight in list(flights.values()):
            live = self._live.get(flight.venue, set())
            if flight.worker_id and flight.worker_id not in live:
                reason = f"worker {flight.worker_id} was lost while running it"
            elif not flight.worker_id and not live:
                # Queued on, or reserved by, a venue whose workers are all gone.
                reason = f"venue {flight.venue} has no live worker left to run it"
            else:
                continue
            self._abandon(flight, flights)
            self._retry_or_settle(flight, "error", reason)

    def _release(self, flight: _Flight, flights: dict[str, _Flight]) -> None:
        flights.pop(flight.sq_id, None)
        self._inflight[flight.venue] = max(0, self._inflight.get(flight.venue, 1) - 1)

    def _abandon(self, flight: _Flight, flights: dict[str, _Flight]) -> None:
        self._release(flight, flights)
        self._revoke([flight])

    def _retry_or_settle(self, flight: _Flight, status: str, reason: str) -> None:
        """Another attempt, on another venue where one has credit, while attempts remain."""
        if flight.outcome.attempts <= self.policy.max_retries:
            flight.retry_reason = reason
            self._backlog.appendleft(flight)
            return
        self._settle(flight, status, error=reason)

    def _cancel_rest(self, flights: dict[str, _Flight], reason: str) -> None:
        for flight in flights.values():
            self.emitter.instant(
                "SubQuery.Cancel",
                parent=flight.span.span_id,
                depth=self._depth,
                status="cancelled",
                reason=reason,
                sq_id=flight.sq_id,
                venue=flight.venue,
            )
            self._settle(flight, "cancelled", error=f"cancelled: {reason}")
        self._revoke(list(flights.values()))
        for flight in flights.values():
            self._inflight[flight.venue] = max(0, self._inflight.get(flight.venue, 1) - 1)
        flights.clear()
        self._settle_backlog("cancelled", f"cancelled before it was sent: {reason}")

    def _settle_backlog(self, status: str, reason: str) -> None:
        while self._backlog:
            self._settle(self._backlog.popleft(), status, error=reason)

    def _revoke(self, gone: list[_Flight]) -> None:
        """Workers skip cancelled jobs they have not started; Celery drops queued ones."""
        if not gone:
            return
        from frlm_web.celery import app

        self.client.sadd(cancelled_key(self.run_id), *[f.sq_id for f in gone])
        self.client.expire(cancelled_key(self.run_id), 86_400)
        app.control.revoke([f.task_id for f in gone if f.task_id])

    def _settle(
        self, flight: _Flight, status: str, *, error: str = "", result: Result | None = None
    ) -> None:
        outcome = flight.outcome
        outcome.status = status
        outcome.error = error
        outcome.venue = flight.venue
        if result is not None:
            outcome.text = result.get("text", "")
            outcome.worker_id = result.get("worker_id", "")
            outcome.tokens_in = result.get("tokens_in", 0)
            outcome.tokens_out = result.get("tokens_out", 0)
            outcome.cost = result.get("cost", 0.0)
            outcome.ms = result.get("ms", 0.0)
        self.totals.settled += 1
        if status != "ok":
            self.totals.subqueries_failed += 1
        span = flight.span or self._open_span(flight)  # never sent: its span opens and ends
        self.emitter.instant(
            "SubQuery.Return",
            parent=span.span_id,
            depth=self._depth,
            status="ok" if status == "ok" else ("cancelled" if status == "cancelled" else "error"),
            venue=flight.venue or None,
            worker_id=outcome.worker_id or None,
            sq=outcome.index,
            attempts=outcome.attempts,
        )
        span.end(
            status if status in {"ok", "timeout", "cancelled"} else "error",
            payload=outcome.text if status == "ok" else None,
            tokens_in=outcome.tokens_in or None,
            tokens_out=outcome.tokens_out or None,
            cost=outcome.cost or None,
            venue=flight.venue or None,
            worker_id=outcome.worker_id or None,
            attempts=outcome.attempts,
            error=error or None,
        )
