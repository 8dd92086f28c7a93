"""The life of a batch. A REPL call's prompts are checked against the policy's limits and
become a batch of sub-queries, then, until every one is settled, the quorum is met or the
batch's deadline passes:

- plan: the router picks where each waiting job goes, as the workers have credit for it;
- send: each reserves its estimated cost, is prepared (worker, id, deadline, trace) and is
  published, all of them through one producer;
- collect: replies are read from the run's result stream as they arrive and checked, and
  deadlines, lost workers and stragglers are watched; each reply frees a credit for the next
  job, so the plan and the send run again;
- settle: at the quorum or the deadline the rest is cancelled.

Then the replies are judged as the tier asks, and each is paid by its verdict. The Fanout
holds one part per responsibility (the package's docstring maps them) and reads as these
steps; the parts share the state objects of state.py, not the Fanout."""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from runs.engine.fanout.attempts import Attempts
from runs.engine.fanout.book import RUN_CANCELLED
from runs.engine.fanout.hedging import Hedger, LatencyWindows
from runs.engine.fanout.intake import Intake
from runs.engine.fanout.judging import Judge
from runs.engine.fanout.liveness import Liveness
from runs.engine.fanout.routing import Router
from runs.engine.fanout.spending import Spending
from runs.engine.fanout.state import (
    CALL_TIERS,
    Batch,
    FanoutAbort,
    Flight,
    LimitExceeded,
    Outcome,
    Roster,
    Scope,
    Totals,
    Wave,
)
from runs.engine.fanout.transport import Transport
from runs.engine.fanout.vouching import Vouching
from runs.engine.policy import Policy
from runs.trust import accounts, objective, verify
from runs.trust.budget import BudgetRefused
from traces.emitter import Emitter
from traces.schema import CUT_CANCEL, CUT_QUORUM
from workers.backends import ModelSpec
from workers.jobs import Job

# How a batch's cut at its quorum begins its reason (a replay reads it back from the book).
QUORUM_CUT = "quorum of"


class Fanout:
    # One place builds every part and gives each only what it uses: read together, the
    # keyword arguments are the package's dependency map, and the order they must be built
    # in; split into helpers, that map would be spread over several. Hence its length.
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
        verify_venues = frozenset(v for v in policy.verify_venues.split(",") if v)
        premium = frozenset(v for v in policy.premium_venues.split(",") if v)
        kept = verify_venues | premium
        self.scope = Scope(
            run_id=run_id,
            policy=policy,
            worker_model=worker_model,
            # The checking venues and the premium lane are watched too.
            venue_names=list(dict.fromkeys([*venue_names, *sorted(kept)])),
            # Answers run on the run's venues, less those kept for checking them or for the
            # premium steps (unless that would leave none).
            answer_venues=frozenset(venue_names) - kept or frozenset(venue_names),
            verify_venues=verify_venues,
            premium_venues=premium,
        )
        self.roster = Roster()
        self.emitter = emitter
        self.policy = policy
        self.totals = totals
        self.cancelled = cancelled
        self.on_progress = on_progress
        self.counter = 0
        self.last_handle = ""  # the latest batch left for the REPL to check (defer_check)
        self._deferred: dict[str, Batch] = {}  # batches awaiting the REPL's own checks
        rng = random.Random(run_id)  # one stream of draws: the scheduler's and the judge's
        latency = LatencyWindows(policy.hedge)
        self.tally = verify.VerificationTally()
        self.accounts = accounts.RunAccounts(run_id, policy, emitter)
        self.transport = Transport(run_id=run_id, client=client, policy=policy)
        self.router = Router(
            scope=self.scope,
            roster=self.roster,
            client=client,
            emitter=emitter,
            accounts=self.accounts,
            rng=rng,
        )
        self.spending = Spending(scope=self.scope, roster=self.roster, accounts=self.accounts)
        self.attempts = Attempts(
            scope=self.scope,
            emitter=emitter,
            totals=totals,
            router=self.router,
            spending=self.spending,
            transport=self.transport,
            latency=latency,
        )
        self.hedger = Hedger(
            scope=self.scope,
            emitter=emitter,
            latency=latency,
            abandon=self.attempts.abandon,
            release=self.attempts.release,
        )
        self.intake = Intake(
            scope=self.scope,
            roster=self.roster,
            emitter=emitter,
            totals=totals,
            router=self.router,
            attempts=self.attempts,
            hedger=self.hedger,
        )
        self.liveness = Liveness(
            scope=self.scope,
            roster=self.roster,
            emitter=emitter,
            router=self.router,
            attempts=self.attempts,
        )
        self.judge = Judge(
            scope=self.scope,
            roster=self.roster,
            emitter=emitter,
            totals=totals,
            tally=self.tally,
            reputations=self.router.reputations,
            rng=rng,
            public_key=self.intake.public_key,
            send=self._dispatch,
        )
        self.vouching = Vouching(
            scope=self.scope,
            roster=self.roster,
            emitter=emitter,
            judge=self.judge,
            tally=self.tally,
            enqueue=self._enqueue,
        )

    @property
    def hedged(self) -> int:
        """Hedges sent in the run: extra work, but not verification."""
        return self.attempts.hedged

    def figures(self) -> accounts.RunAccountsFigures:
        """The run's accounts as they stand: verification, hedges, workers lost, budget and
        receipts."""
        return self.accounts.figures(
            dict(self.tally.figures()), self.hedged, list(self.liveness.lost.values())
        )

    @property
    def worker_model(self) -> ModelSpec:
        """The model the sub-queries run on."""
        return self.scope.worker_model

    @worker_model.setter
    def worker_model(self, model: ModelSpec) -> None:
        # A replay that goes live swaps it for a live one: every part reads it from the scope.
        self.scope.worker_model = model

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

    def run_batch(
        self,
        prompts: list[str],
        *,
        depth: int,
        parent: str | None,
        tier: Any = None,
        check: Callable[[str], objective.CheckVerdict] | None = None,
        defer_check: bool = False,
    ) -> list[Outcome]:
        """1. check the limits, 2. send as many jobs as the workers have credit for,
        3. collect replies, sending the rest as credit frees, until all are settled, the
        quorum is met or the deadline passes, 4. judge them: `check` (an objective check),
        then the tier. With `defer_check` the REPL checks the replies itself: the batch
        waits under `self.last_handle` for its verdicts (apply_verdicts)."""
        tier = self._call_tier(tier, check, defer_check)
        self.check_limits(len(prompts))
        self.totals.calls += len(prompts)
        # No worker at all fails the run's first batch at once (a venue never up); a later
        # one waits for a worker to come back, as a batch under way does (Liveness): the
        # link of a run's one remote worker dropped between batches, and the run failed at
        # once where the same outage a moment later was ridden out (a review).
        self.router.refresh(force=True, fail_fast=self.scope.batches == 0)
        if tier == "high_trust":
            self.judge.validator_venues()  # refuses the call when no validator is live
        self.scope.parent, self.scope.depth = parent, depth
        self.scope.batches += 1
        state = Batch(
            [Flight(Outcome(i), p) for i, p in enumerate(prompts)],
            tier,
            depth,
            parent,
            judging=tier != "best_effort" or check is not None or defer_check,
        )
        self.scope.batch = state
        if len(prompts) == 1 and self.scope.premium_for("single"):
            state.flights[0].venues = self.scope.premium_venues
        # Known-answer probes go out in the same dispatch as the work they hide among.
        probes = self.judge.probes_for(state)
        self.vouching.begin(state)
        try:
            self._dispatch(state.flights + probes)
        finally:
            self.vouching.end(state)
        self.tally.add_primary(len(state.flights))
        self.judge.probe_round(state, probes)
        if check is not None:
            verdicts = self.judge.check_all(state, check, range(len(state.flights)))
            while verdicts:
                again = self.judge.objective_round(state, verdicts)
                verdicts = self.judge.check_all(state, check, again)
        if defer_check:
            self.last_handle = f"b{self.scope.batches}"
            self._deferred[self.last_handle] = state
        else:
            self._finish_batch(state)
        return [flight.outcome for flight in state.flights]

    def apply_verdicts(
        self, handle: str, verdicts: dict[int, objective.CheckVerdict]
    ) -> tuple[list[Outcome], list[int]]:
        """The REPL's own check of a deferred batch's replies (by position): the failed ones
        go to other workers while attempts remain. Returns the batch's outcomes and the
        positions with new replies, to check again; when there are none, the batch is
        judged by its tier and closed."""
        state = self._deferred.get(handle)
        if state is None:
            raise LimitExceeded(f"no batch {handle!r} is waiting for verdicts")
        known = {p for p in verdicts if 0 <= p < len(state.flights)}
        if known != set(verdicts):
            raise LimitExceeded("verdicts name positions that are not in the batch")
        self.scope.batch, self.scope.parent, self.scope.depth = state, state.parent, state.depth
        again = self.judge.objective_round(state, verdicts)
        if not again:
            del self._deferred[handle]
            self._finish_batch(state)
        return [flight.outcome for flight in state.flights], again

    def close(self) -> None:
        """At the run's end: replies of batches whose REPL check never came back (the cell
        failed before it) are paid for as they stand, unverified, so no work goes unreceipted;
        Execute spans a dead worker left open on settled attempts are ended, and the run's
        result stream is let go (Transport.retire)."""
        with self.emitter.batch():
            for state in self._deferred.values():
                for flight in state.replied:
                    self.spending.pay(flight)
            self.liveness.settle_executing()
        self._deferred.clear()
        self.transport.retire()

    # --- the life of a batch ---------------------------------------------------------
    def _call_tier(
        self, tier: Any, check: Callable[[str], objective.CheckVerdict] | None, defer_check: bool
    ) -> str:
        """The tier the call names (the policy's by default); "objective" is best effort
        once its check is known."""
        tier = tier or self.policy.tier
        if tier not in CALL_TIERS:
            raise LimitExceeded(f"tier={tier!r}: choose one of {', '.join(CALL_TIERS)}")
        if tier == "objective":
            if check is None and not defer_check:
                raise LimitExceeded(
                    "tier='objective' needs a check: validate=<JSON schema dict>, <regex str> "
                    "or <function of the reply returning True when it is acceptable>"
                )
            tier = "best_effort"
        return tier

    def _dispatch(self, batch: list[Flight]) -> None:
        """Number the sub-queries, send what the workers have credit for, and collect until
        the batch is settled. The judge sends its copies through here too."""
        for flight in batch:
            self.counter += 1
            flight.outcome.index = self.counter
        wave = Wave({}, deque(batch))
        self.totals.subqueries += len(batch)
        self.hedger.start(len(batch))
        self._pump(wave)
        self.on_progress()
        self._collect(batch, wave)

    def _enqueue(self, flights: list[Flight], wave: Wave) -> None:
        """Copies made while a batch is out (vouching.Vouching's checks) join its dispatch,
        ahead of the work still waiting."""
        for flight in flights:
            self.counter += 1
            flight.outcome.index = self.counter
        self.totals.subqueries += len(flights)
        wave.backlog.extendleft(reversed(flights))

    def _pump(self, wave: Wave) -> None:
        """Plan and send the backlog jobs that should go now (a full replay keeps back those
        its recording's batch cut off while they waited), then, in a replay, the recorded
        hedges of what just left."""
        kept = self._as_recorded(wave)
        try:
            self._send(wave)
        finally:
            wave.backlog.extend(kept)
        if self.hedger.follow_book(wave):
            self._pump(wave)  # a replay sends the recorded hedge before its twin's reply is in

    def _as_recorded(self, wave: Wave) -> list[Flight]:
        """A full replay plans its backlog as the recording went: each job's next attempt
        may run only on the venue the recording sent it to (while that venue has a live
        worker), and the flights that waited to be sent when the recording's batch was cut
        off are taken out of the backlog, not to be sent (the cut settles them)."""
        book = self.scope.book
        if book is None or not wave.backlog:
            return []
        place = (self.scope.depth, self.scope.batches)
        for flight in wave.backlog:
            route = book.route((*place, flight.outcome.index, flight.outcome.attempts + 1))
            if route is not None and self.roster.live.get(route[0]):
                flight.venues = frozenset({route[0]})
        kept = [
            f
            for f in wave.backlog
            if not f.hedge and book.waits((*place, f.outcome.index, f.outcome.attempts))
        ]
        if kept:
            wave.backlog = deque(f for f in wave.backlog if not any(f is k for k in kept))
        return kept

    def _send(self, wave: Wave) -> None:
        """Plan and send the backlog jobs that should go now: their Submit spans in one round
        trip, their messages through one producer (transport.Transport.publish)."""
        if not wave.backlog:
            return
        room = self._room(wave)
        if room <= 0:
            return
        picks = self.router.plan(wave)[:room]
        if not picks:
            if not wave.out and self.router.any_credit():
                # Workers are there but none may take it, and nothing in flight will free
                # a credit: waiting would wait forever. (With no worker at all, the batch
                # waits a while for one to come back: see liveness.Liveness.await_workers.)
                capped = self.accounts.capped_providers
                self.attempts.settle_backlog(
                    wave, "budget" if capped else "error", self.router.unroutable()
                )
            return
        taken = {id(flight) for flight, _ in picks}
        lead = 0  # most often the picks are the backlog's first jobs: no need to rebuild it
        for flight in wave.backlog:
            if id(flight) not in taken:
                break
            lead += 1
        if lead == len(taken):
            for _ in range(lead):
                wave.backlog.popleft()
        else:
            wave.backlog = deque(f for f in wave.backlog if id(f) not in taken)
        ready: list[tuple[Flight, Job]] = []
        with self.emitter.batch():
            for flight, target in picks:
                try:
                    reservation = self.spending.reserve(flight, target)
                except BudgetRefused as refused:
                    self.attempts.refused(flight, refused, wave)
                    continue
                ready.append((flight, self.attempts.prepare(flight, target, wave)))
                self.spending.hold(flight, reservation)
        # A replay's attempt that no recorded worker started is not sent to any either.
        self.transport.publish([(f, job) for f, job in ready if not self.attempts.withheld(f)])

    def _room(self, wave: Wave) -> int:
        """How many more attempts may go out now: policy.max_inflight less those out (hedges
        count, so a sequential run never has two attempts out)."""
        limit = self.policy.max_inflight
        return len(wave.backlog) if limit == 0 else limit - len(wave.out)

    def _collect(self, batch: list[Flight], wave: Wave) -> None:
        """Read replies as they come, one read per gather window, and send more as they free
        credit, until nothing of the batch is out or waiting."""
        need = math.ceil(self.policy.quorum * len(batch))
        batch_deadline = time.time() + self.policy.batch_deadline_s
        last_progress = 0.0
        while wave.out or wave.backlog:
            if self.cancelled():
                self.attempts.cancel_rest(wave, RUN_CANCELLED, cut=CUT_CANCEL)
                raise FanoutAbort(RUN_CANCELLED, status="cancelled")
            now = time.time()
            wake = min([f.deadline for f in wave.out.values()] + [batch_deadline])
            block_ms = int(max(1, min(200, (wake - now) * 1000)))
            reply = self.transport.read(block_ms, gather=bool(wave.backlog))
            with self.emitter.batch():
                for result in self.transport.results(reply):
                    self._take(result, wave)
                self.liveness.check_deadlines(wave)
                self.liveness.check_lost_workers(wave)
                self.hedger.hedge_stragglers(wave)
                self._settle_rest(batch, wave, need, batch_deadline)
            self._pump(wave)
            with self.emitter.batch():
                for result in self.hedger.unpark(wave):
                    self._take(result, wave)
                self.router.flush()
            if time.monotonic() - last_progress > 0.2:
                self.on_progress()
                last_progress = time.monotonic()
        self.on_progress()

    def _take(self, result: Any, wave: Wave) -> None:
        """One reply in; an attempt it ended may move the batch's check gate on."""
        ended = self.intake.on_result(result, wave)
        if ended is not None:
            self.vouching.on_settled(ended, wave)

    def _settle_rest(
        self, batch: list[Flight], wave: Wave, need: int, batch_deadline: float
    ) -> None:
        """At the quorum or the batch's deadline, what is still out or waiting is cancelled;
        while no worker is live, the batch waits a while for one."""
        busy = bool(wave.out or wave.backlog)
        if self.scope.book is not None:
            cut = self._recorded_cut(batch, wave)  # a full replay cuts off where it was cut
        elif need >= len(batch):
            # The whole batch is wanted (quorum 1, the default): nothing to cut, and no
            # count of the batch after every read (at 4,096 sub-queries, 3.5% of the
            # conductor's CPU went on counting).
            cut = None
        elif sum(1 for f in batch if f.outcome.status != "pending") >= need:
            cut = f"{QUORUM_CUT} {need}/{len(batch)} reached"
            if all(f.outcome.status != "pending" for f in batch):
                cut = None  # only the gate's checks are left (vouching.Vouching): they finish
        else:
            cut = None
        if busy and cut is not None:
            # A replay's recorded cut may be a deadline's: only a quorum's is not a failure.
            self.attempts.cancel_rest(
                wave, cut, cut=CUT_QUORUM if cut.startswith(QUORUM_CUT) else None
            )
        elif busy and time.time() > batch_deadline:
            self.attempts.cancel_rest(
                wave, f"batch deadline of {self.policy.batch_deadline_s} s passed"
            )
        else:
            self.liveness.await_workers(wave)

    def _recorded_cut(self, batch: list[Flight], wave: Wave) -> str | None:
        """A full replay cuts its batch off where the recording did, not at its own count:
        once every sub-query the recording's cut did not find is settled and every one it
        found stands as it found it (its attempt out, or waiting after as many attempts).
        The reason the recording gave, or None while it is not time (or the recording
        cut nothing off in this batch)."""
        book = self.scope.book
        assert book is not None
        reason = None
        for flight in batch:
            sub = (self.scope.depth, self.scope.batches, flight.outcome.index)
            cut = book.cut(sub)
            if flight.outcome.status != "pending":
                continue
            if cut is None:
                return None  # still to settle
            if cut.sent and any(
                wave.out.get(f"{sub[2]}.{place[3]}") is None for place in book.found_out(sub)
            ):
                return None  # an attempt the cut found out is not out yet
            waiting = flight.outcome.attempts == cut.attempts and wave.holds(flight)
            if not cut.sent and not waiting:
                return None  # not yet waiting after its attempts
            reason = cut.reason
        return reason

    def _finish_batch(self, state: Batch) -> None:
        """Judge the replies as the tier asks, then pay for each one by its verdict."""
        if state.tier == "redundant":
            self.judge.redundant(state)
        elif state.tier == "high_trust":
            self.judge.high_trust(state)
        with self.emitter.batch():
            for flight in state.replied:
                self.spending.pay(flight)
                if flight.kind:  # a copy or a probe: the cost of checking
                    self.tally.add_cost(flight.kind, flight.outcome.cost)
            self.router.flush()
        state.replied.clear()
