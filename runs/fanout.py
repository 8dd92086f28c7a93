"""Asynchronous fanout: a batch of sub-queries goes out at once as Celery jobs on the run's
venues and is collected from the run's result stream as replies arrive, under a quorum and
deadlines. Stragglers are cancelled; a failed, timed-out or orphaned job is retried on
another venue while attempts remain."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from runs.policy import Policy
from traces.emitter import Emitter, Span
from workers import venues
from workers.backends import ModelSpec
from workers.jobs import Job, Result, cancelled_key, decode_result, results_stream

# How often the liveness of workers holding jobs is checked, in seconds.
LIVENESS_EVERY_S = 1.0


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
    span: Span
    sq_id: str = ""
    venue: str = ""
    task_id: str = ""
    deadline: float = 0.0
    worker_id: str = ""
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
        self._load: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._live: dict[str, set[str]] = {}
        self._checked = 0.0

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
        """1. check the limits, 2. open a Submit span per prompt and send every job,
        3. collect replies until all are settled, the quorum is met or the deadline passes."""
        self.check_limits(len(prompts))
        self.totals.calls += len(prompts)
        self._refresh_venues(force=True)
        flights: dict[str, _Flight] = {}
        batch = [_Flight(Outcome(i), p, span=None) for i, p in enumerate(prompts)]  # type: ignore[arg-type]
        with self.emitter.batch():
            for flight in batch:
                self.counter += 1
                flight.outcome.index = self.counter
                flight.span = self.emitter.start(
                    "SubQuery.Submit",
                    parent=parent,
                    depth=depth,
                    payload=flight.prompt,
                    sq=flight.outcome.index,
                    bytes=len(flight.prompt.encode("utf-8", "replace")),
                )
        for flight in batch:
            self._dispatch(flight, flights, depth)
        self.totals.subqueries += len(prompts)
        self.on_progress()
        self._collect(batch, flights, depth)
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
            self._capacity[name] = sum(int(w.get("concurrency", 1)) for w in workers)
            if force:
                self._load[name] = venues.queued(self.client, name)
        if force and not any(self._capacity.values()):
            raise FanoutAbort(
                f"no live worker on the run's venues ({', '.join(self.venue_names)}); start one "
                f"with `python manage.py frlm_worker --venue {self.venue_names[0]}` or `make up`"
            )

    def _choose_venue(self, avoid: set[str]) -> tuple[str, str]:
        """The least loaded live venue, relative to its slots; avoid those tried before."""
        live = [v for v in self.venue_names if self._capacity.get(v)]
        fresh = [v for v in live if v not in avoid] or live
        if not fresh:
            return "", "no live venue"
        best = min(fresh, key=lambda v: (self._load.get(v, 0) + 1) / self._capacity[v])
        return best, f"least loaded: {self._load.get(best, 0)} jobs on {self._capacity[best]} slots"

    def _dispatch(self, flight: _Flight, flights: dict[str, _Flight], depth: int) -> bool:
        from workers.tasks import subquery_execute

        venue, why = self._choose_venue(flight.tried)
        if not venue:
            self._settle(flight, "error", error="no live worker on any of the run's venues")
            return False
        flight.outcome.attempts += 1
        flight.venue = venue
        flight.tried.add(venue)
        flight.worker_id = ""
        flight.sq_id = f"{flight.outcome.index}.{flight.outcome.attempts}"
        flight.deadline = time.time() + self.policy.subquery_timeout_s
        self._load[venue] = self._load.get(venue, 0) + 1
        job: Job = {
            "run_id": self.run_id,
            "sq_id": flight.sq_id,
            "submit_span": flight.span.span_id,
            "prompt": flight.prompt,
            "model": self.worker_model.to_dict(),
            "deadline": flight.deadline,
            "depth": depth,
            "timeout_s": self.policy.subquery_timeout_s,
            "attempt": flight.outcome.attempts,
        }
        if flight.outcome.attempts == 1:
            flight.span.progress(venue=venue, route=why)
        sent = subquery_execute.apply_async(
            args=[job], queue=venues.venue_queue(venue), expires=self.policy.subquery_timeout_s
        )
        flight.task_id = sent.id
        flights[flight.sq_id] = flight
        return True

    # --- collection ------------------------------------------------------------------
    def _collect(self, batch: list[_Flight], flights: dict[str, _Flight], depth: int) -> None:
        need = math.ceil(self.policy.quorum * len(batch))
        batch_deadline = time.time() + self.policy.batch_deadline_s
        last_progress = 0.0
        while flights:
            if self.cancelled():
                self._cancel_rest(flights, "the run was cancelled")
                raise FanoutAbort("the run was cancelled", status="cancelled")
            now = time.time()
            wake = min(min(f.deadline for f in flights.values()), batch_deadline)
            block_ms = int(max(1, min(200, (wake - now) * 1000)))
            reply = self.client.xread({self.stream: self.last_id}, count=1000, block=block_ms)
            with self.emitter.batch():
                for _, entries in reply or []:
                    for entry_id, fields in entries:
                        self.last_id = entry_id
                        self._on_result(decode_result(fields), flights, depth)
                self._check_deadlines(flights, depth)
                self._check_lost_workers(flights, depth)
                settled = sum(1 for f in batch if f.outcome.status != "pending")
                if flights and settled >= need:
                    self._cancel_rest(flights, f"quorum of {need}/{len(batch)} reached")
                elif flights and time.time() > batch_deadline:
                    self._cancel_rest(
                        flights, f"batch deadline of {self.policy.batch_deadline_s} s passed"
                    )
            if time.monotonic() - last_progress > 0.2:
                self.on_progress()
                last_progress = time.monotonic()
        self.on_progress()

    def _on_result(self, result: Result, flights: dict[str, _Flight], depth: int) -> None:
        flight = flights.get(result.get("sq_id", ""))
        if flight is None:
            return  # a late reply to an attempt that was already settled or replaced
        status = result.get("status")
        if status == "started":
            flight.worker_id = result.get("worker_id", "")
            return
        del flights[flight.sq_id]
        self._load[flight.venue] = max(0, self._load.get(flight.venue, 1) - 1)
        if status == "ok":
            self.totals.add_tokens(
                result.get("tokens_in", 0), result.get("tokens_out", 0), result.get("cost")
            )
            self._settle(flight, "ok", result=result)
        elif status == "error":
            self._retry_or_settle(flight, flights, depth, "error", result.get("error", "failed"))
        else:
            self._retry_or_settle(
                flight,
                flights,
                depth,
                "error",
                "the worker dropped the job as expired or cancelled",
            )

    def _check_deadlines(self, flights: dict[str, _Flight], depth: int) -> None:
        now = time.time()
        for flight in [f for f in flights.values() if f.deadline <= now]:
            self._abandon(flight, flights)
            self.emitter.instant(
                "SubQuery.Timeout",
                parent=flight.span.span_id,
                depth=depth,
                status="timeout",
                sq_id=flight.sq_id,
                venue=flight.venue,
                worker_id=flight.worker_id or None,
            )
            self._retry_or_settle(
                flight,
                flights,
                depth,
                "timeout",
                f"no reply within {self.policy.subquery_timeout_s} s (policy.subquery_timeout_s)",
            )

    def _check_lost_workers(self, flights: dict[str, _Flight], depth: int) -> None:
        if not flights:
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
            self._retry_or_settle(flight, flights, depth, "error", reason)

    def _abandon(self, flight: _Flight, flights: dict[str, _Flight]) -> None:
        flights.pop(flight.sq_id, None)
        self._load[flight.venue] = max(0, self._load.get(flight.venue, 1) - 1)
        self._revoke([flight])

    def _retry_or_settle(
        self, flight: _Flight, flights: dict[str, _Flight], depth: int, status: str, reason: str
    ) -> None:
        if flight.outcome.attempts <= self.policy.max_retries:
            before = flight.venue
            if self._dispatch(flight, flights, depth):
                self.emitter.instant(
                    "SubQuery.Retry",
                    parent=flight.span.span_id,
                    depth=depth,
                    reason=reason,
                    from_venue=before,
                    venue=flight.venue,
                    attempt=flight.outcome.attempts,
                )
                return
        self._settle(flight, status, error=reason)

    def _cancel_rest(self, flights: dict[str, _Flight], reason: str) -> None:
        for flight in flights.values():
            self.emitter.instant(
                "SubQuery.Cancel",
                parent=flight.span.span_id,
                depth=flight.span.depth,
                status="cancelled",
                reason=reason,
                sq_id=flight.sq_id,
                venue=flight.venue,
            )
            self._settle(flight, "cancelled", error=f"cancelled: {reason}")
        self._revoke(list(flights.values()))
        flights.clear()

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
        self.emitter.instant(
            "SubQuery.Return",
            parent=flight.span.span_id,
            depth=flight.span.depth,
            status="ok" if status == "ok" else ("cancelled" if status == "cancelled" else "error"),
            venue=flight.venue,
            worker_id=outcome.worker_id or None,
            sq=outcome.index,
            attempts=outcome.attempts,
        )
        flight.span.end(
            status if status in {"ok", "timeout", "cancelled"} else "error",
            payload=outcome.text if status == "ok" else None,
            tokens_in=outcome.tokens_in or None,
            tokens_out=outcome.tokens_out or None,
            cost=outcome.cost or None,
            venue=flight.venue,
            worker_id=outcome.worker_id or None,
            attempts=outcome.attempts,
            error=error or None,
        )
