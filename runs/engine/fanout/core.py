"""Asynchronous fanout: a batch of sub-queries goes out as Celery jobs on the run's venues
and is collected from the run's result stream as replies arrive, under a quorum and
deadlines. Stragglers are cancelled; a failed, timed-out or orphaned job is retried on
another venue while attempts remain.

Where a job goes is the policy's routing: by default the scheduler (workers.scheduler)
sends it to one registered worker's own queue, the one expected to finish it first given
reputation, latency, load and price; "shared" puts it on the venue's queue for any free
worker (what Celery does by itself); "round_robin" deals jobs to workers in turn.

Dispatch is credit-based: a worker (or, for a shared queue, a venue) is given as many jobs
as it has slots, plus a margin that hides the refill round trip, and each reply frees
a credit for the next job. Queues stay short, so a slow or busy worker takes less work
instead of holding the batch's tail, and every decision is made with current figures.

Every result is checked before it counts: it must come from the worker the job was given to
and carry that worker's signature. Outcomes feed the workers' reputations and circuit
breakers, which the next decisions read.

Trust and money (runs.trust.accounts): each dispatch reserves its estimated cost against the
run's budget caps before it leaves and settles on return; at the run's cap nothing more is
sent. A straggler past its venue's latency quantile is hedged on another worker once no
fresh work waits. Replies are then judged as the tier asks (objective checks, redundant
agreement, a validator's signed attestation) and each gets a countersigned receipt, paid
only when it was not judged wrong."""

from __future__ import annotations

import json
import math
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from runs.engine.fanout.attempts import Attempts
from runs.engine.fanout.hedging import Hedger, LatencyWindows
from runs.engine.fanout.intake import Intake
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
from runs.engine.policy import Policy
from runs.trust import accounts, attest, verify
from runs.trust.budget import BudgetRefused
from traces.emitter import Emitter, sha256_text
from workers.backends import ModelSpec
from workers.jobs import Job
from workers.reputation import Observation

# A worker whose validation record (its Beta mean) is below this has been caught recently:
# the high-trust tier re-runs all of its answers until the record mends.
SUSPECT_BELOW = 0.5


# How much of an accepted answer a Verify.Redundant event quotes (the payload has it all).
QUOTE_CHARS = 200


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
        verify_venues = frozenset(v for v in policy.verify_venues.split(",") if v)
        self.scope = Scope(
            run_id=run_id,
            policy=policy,
            worker_model=worker_model,
            # Every venue is watched: the run's and those kept for checking its answers.
            venue_names=list(dict.fromkeys([*venue_names, *sorted(verify_venues)])),
            # Answers run on the run's venues, less those kept for checking them (unless that
            # would leave none).
            answer_venues=frozenset(venue_names) - verify_venues or frozenset(venue_names),
            verify_venues=verify_venues,
        )
        self.roster = Roster()
        self.client = client
        self.emitter = emitter
        self.policy = policy
        self.totals = totals
        self.cancelled = cancelled
        self.on_progress = on_progress
        self.counter = 0
        self.last_handle = ""  # the latest batch left for the REPL to check (defer_check)
        self.rng = random.Random(run_id)
        self.tally = verify.VerificationTally()
        self.accounts = accounts.RunAccounts(run_id, policy, emitter)
        self.latency = LatencyWindows(policy.hedge)
        self._deferred: dict[str, Batch] = {}  # batches awaiting the REPL's own checks
        self.transport = Transport(run_id=run_id, client=client, policy=policy)
        self.router = Router(
            scope=self.scope,
            roster=self.roster,
            client=client,
            emitter=emitter,
            accounts=self.accounts,
            rng=self.rng,
        )
        self.reputations = self.router.reputations
        self.spending = Spending(scope=self.scope, roster=self.roster, accounts=self.accounts)
        self.attempts = Attempts(
            scope=self.scope,
            emitter=emitter,
            totals=totals,
            router=self.router,
            spending=self.spending,
            transport=self.transport,
            latency=self.latency,
        )
        self.hedger = Hedger(
            scope=self.scope,
            emitter=emitter,
            latency=self.latency,
            abandon=self.attempts.abandon,
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

    @property
    def hedged(self) -> int:
        """Hedges sent in the run: extra work, but not verification."""
        return self.attempts.hedged

    @property
    def worker_model(self) -> ModelSpec:
        return self.scope.worker_model

    @worker_model.setter
    def worker_model(self, model: ModelSpec) -> None:
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
        check: Callable[[str], verify.CheckVerdict] | None = None,
        defer_check: bool = False,
    ) -> list[Outcome]:
        """1. check the limits, 2. send as many jobs as the workers have credit for,
        3. collect replies, sending the rest as credit frees, until all are settled, the
        quorum is met or the deadline passes, 4. judge them: `check` (an objective check),
        then the tier. With `defer_check` the REPL checks the replies itself: the batch
        waits under `self.last_handle` for its verdicts (apply_verdicts)."""
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
        self.check_limits(len(prompts))
        self.totals.calls += len(prompts)
        self.router.refresh(force=True)
        if tier == "high_trust":
            self._validator_venues()  # refuses the call when no validator is live
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
        self._dispatch(state.flights)
        self.tally.add_primary(len(state.flights))
        if check is not None:
            verdicts = self._check_all(state, check, range(len(state.flights)))
            while verdicts:
                verdicts = self._check_all(state, check, self._objective_round(state, verdicts))
        if defer_check:
            self.last_handle = f"b{self.scope.batches}"
            self._deferred[self.last_handle] = state
        else:
            self._finish_batch(state)
        return [flight.outcome for flight in state.flights]

    def apply_verdicts(
        self, handle: str, verdicts: dict[int, verify.CheckVerdict]
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
        again = self._objective_round(state, verdicts)
        if not again:
            del self._deferred[handle]
            self._finish_batch(state)
        return [flight.outcome for flight in state.flights], again

    def close(self) -> None:
        """At the run's end: replies of batches whose REPL check never came back (the cell
        failed before it) are paid for as they stand, unverified, so no work goes unreceipted."""
        with self.emitter.batch():
            for state in self._deferred.values():
                for flight in state.replied:
                    self.spending.pay(flight)
        self._deferred.clear()

    def _finish_batch(self, state: Batch) -> None:
        """Judge the replies as the tier asks, then pay for each one by its verdict."""
        if state.tier == "redundant":
            self._verify_redundant(state)
        elif state.tier == "high_trust":
            self._verify_high_trust(state)
        with self.emitter.batch():
            for flight in state.replied:
                self.spending.pay(flight)
            self.router.flush()
        state.replied.clear()

    def _dispatch(self, batch: list[Flight]) -> None:
        for flight in batch:
            self.counter += 1
            flight.outcome.index = self.counter
        wave = Wave({}, deque(batch))
        self.totals.subqueries += len(batch)
        self.hedger.start(len(batch))
        self._pump(wave)
        self.on_progress()
        self._collect(batch, wave)

    # --- verification ----------------------------------------------------------------
    def _copy(self, state: Batch, pos: int, kind: str, avoid: set[str]) -> Flight:
        """A copy of position `pos`'s sub-query, made to judge its reply; it runs on none
        of the workers in `avoid`."""
        holder = state.holder(pos)
        copy = Flight(
            Outcome(0),
            holder.prompt,
            replica_of=pos,
            venues=self.scope.verify_venues,
            original=state.flights[pos].outcome.index,
            kind=kind,
        )
        copy.tried = set(avoid)
        return copy

    def _verify_redundant(self, state: Batch) -> None:
        """Copies of each answered sub-query go to other workers, in rounds, until its
        answer is accepted or it is unresolved. An answer from a worker past the trust gate
        is copied only now and then (verify.should_replicate)."""
        policy = verify.RedundancyPolicy(
            replicas=self.policy.replicas,
            agree=self.policy.agree,
            max_replicas=self.policy.max_replicas,
            rule=verify.AgreementRule(mode=self.policy.agree_mode),
        )
        replies: dict[int, list[tuple[verify.Reply, Flight]]] = {}
        sent: dict[int, int] = {}  # copies sent, answered or not: the limit counts them all
        todo: list[int] = []
        for pos, flight in enumerate(state.flights):
            if flight.outcome.status != "ok":
                continue
            holder = state.holder(pos)
            replies[pos] = [(self._reply(holder), holder)]
            sent[pos] = 1
            trust = self.reputations.get(holder.outcome.worker_id).consecutive_valid
            if policy.agree > 1 and verify.should_replicate(trust, self.rng):
                todo.append(pos)
        while todo:
            copies: list[Flight] = []
            for pos in todo:
                going: set[str] = set()  # workers the copies going out now may not share
                judged = [reply for reply, _ in replies[pos]]
                decision = verify.redundant_decide(judged, policy)
                if decision.outcome != "more" or sent[pos] >= policy.max_replicas:
                    self._judge(state.flights[pos], decision, replies[pos])
                    continue
                for _ in range(min(decision.dispatch, policy.max_replicas - sent[pos])):
                    # Distinct workers: those that answered, and the copies going out now.
                    copy = self._copy(state, pos, "replica", set(decision.avoid_workers) | going)
                    going |= copy.tried
                    copies.append(copy)
                    sent[pos] += 1
            if not copies:
                break
            self.tally.add_extra("replica", len(copies))
            self._dispatch(copies)
            for copy in copies:
                if copy.outcome.status == "ok":
                    replies[copy.replica_of].append((self._reply(copy), copy))
            todo = sorted({c.replica_of for c in copies})

    def _reply(self, flight: Flight) -> verify.Reply:
        return verify.Reply(
            flight.outcome.worker_id,
            flight.outcome.venue,
            flight.outcome.text,
            flight.span.span_id if flight.span else "",
        )

    def _judge(
        self,
        flight: Flight,
        decision: verify.Decision,
        replies: list[tuple[verify.Reply, Flight]],
    ) -> None:
        """Record the verdict on the sub-query's span, teach reputation who was right, and
        make the accepted answer (or the lack of one) the sub-query's outcome."""
        if decision.outcome == "more":  # out of replicas without agreement
            decision = verify.Decision(
                "unresolved",
                groups=decision.groups,
                links=decision.links,
                replies=decision.replies,
                mode=decision.mode,
                reason=f"no agreement within {self.policy.max_replicas} replicas",
            )
        attrs = dict(decision.attrs())
        if attrs.get("text"):
            attrs["text"] = attrs["text"][:QUOTE_CHARS]
        self.emitter.instant(
            "Verify.Redundant",
            parent=flight.span.span_id,
            depth=self.scope.depth,
            status="ok" if decision.outcome == "accept" else "rejected",
            links=list(decision.links),
            sq=flight.outcome.index,
            **attrs,
        )
        right = verify.judgements(decision)
        for worker_id, ok in right.items():
            self.reputations.observe(Observation(worker_id, agreement=ok))
        for reply, replier in replies:
            if decision.outcome != "accept":
                replier.verdict = "unresolved"
            elif reply.worker_id in right:
                replier.verdict = "accepted" if right[reply.worker_id] else "rejected"
        if decision.outcome == "accept":
            flight.outcome.text = decision.text or ""
        else:
            flight.outcome.status = "unresolved"
            flight.outcome.error = (
                f"{len(replies)} workers never agreed ({decision.reason}); no answer is guessed"
            )
            self.totals.subqueries_failed += 1

    def _check_all(
        self, state: Batch, check: Callable[[str], verify.CheckVerdict], positions: Any
    ) -> dict[int, verify.CheckVerdict]:
        """The conductor's own check (a JSON schema, a regex) of the replies at `positions`."""
        return {
            pos: check(state.holder(pos).outcome.text)
            for pos in positions
            if state.holder(pos).outcome.status == "ok"
        }

    def _objective_round(self, state: Batch, verdicts: dict[int, verify.CheckVerdict]) -> list[int]:
        """Record one round of objective verdicts (Verify.Objective, reputation, the reply's
        verdict); send each failed sub-query to a worker that has not failed it, while
        attempts remain, else reject it. Returns the positions that got a new reply."""
        retry: list[Flight] = []
        for pos, verdict in sorted(verdicts.items()):
            flight, holder = state.flights[pos], state.holder(pos)
            if holder.outcome.status != "ok":
                continue
            worker = holder.outcome.worker_id
            self.emitter.instant(
                "Verify.Objective",
                parent=flight.span.span_id,
                depth=state.depth,
                status="ok" if verdict.ok else "rejected",
                links=[holder.span.span_id],
                worker_id=worker or None,
                venue=holder.outcome.venue or None,
                sq=flight.outcome.index,
                **verdict.attrs(),
            )
            if worker:
                self.reputations.observe(Observation(worker, validation=verdict.ok))
            holder.verdict = "accepted" if verdict.ok else "rejected"
            if verdict.ok:
                continue
            failed = state.failed.setdefault(pos, set())
            failed.add(worker)
            if len(failed) <= self.policy.max_retries:
                retry.append(self._copy(state, pos, "recheck", failed))
                continue
            flight.outcome.status = "rejected"
            flight.outcome.error = (
                f"failed its check on {len(failed)} worker(s); last: {verdict.reason}"
            )
            self.totals.subqueries_failed += 1
        if not retry:
            return []
        self.tally.add_extra("recheck", len(retry))
        self._dispatch(retry)
        again = []
        for copy in retry:
            outcome = state.flights[copy.replica_of].outcome
            if copy.outcome.status == "ok":
                state.holders[copy.replica_of] = copy
                _adopt(outcome, copy.outcome)
                again.append(copy.replica_of)
            else:
                outcome.status = "rejected"
                outcome.error = (
                    f"failed its check, and the retry got no reply: {copy.outcome.error}"
                )
                self.totals.subqueries_failed += 1
        return again

    def _validator_venues(self) -> frozenset[str]:
        """The venues whose live workers may validate (trusted ones among those watched);
        refuses the call when there is none."""
        trusted = frozenset(w["venue"] for w in self.roster.workers.values() if w.get("trusted"))
        if not trusted:
            raise LimitExceeded(
                "tier='high_trust' needs a live worker on a trusted venue to validate with; "
                f"none of {', '.join(self.scope.venue_names)} has one: add a trusted venue (e.g. "
                "local) to the run's venues or to policy.verify_venues, or mark one trusted "
                "in the admin"
            )
        return trusted

    def _verify_high_trust(self, state: Batch) -> None:
        """A validator re-runs a sample of the answers: often those only workers below the
        trust gate vouch for, rarely the others (verify.should_validate); each re-run comes
        back with the validator's signed attestation (Verify.Attest). A divergence takes
        the validator's answer and counts against the worker."""
        venues_ = self._validator_venues()
        copies: list[Flight] = []
        for pos, flight in enumerate(state.flights):
            holder = state.holder(pos)
            if flight.outcome.status != "ok" or holder.outcome.status != "ok":
                continue
            worker = holder.outcome.worker_id
            trusted = bool(self.roster.workers.get(worker, {}).get("trusted"))
            record = self.reputations.get(worker)
            passed = record.mean("validation")
            if not verify.should_validate(
                [verify.TRUST_AFTER if trusted else record.consecutive_valid],
                self.rng,
                untrusted_rate=self.policy.validate_rate,
                trusted_rate=self.policy.validate_trusted_rate,
                suspect=not trusted and passed is not None and passed < SUSPECT_BELOW,
            ):
                continue
            copy = self._copy(state, pos, "validator", {worker})
            copy.venues, copy.judged = venues_, holder
            copies.append(copy)
        if not copies:
            return
        self.tally.add_extra("validator", len(copies))
        self._dispatch(copies)
        for copy in copies:
            self._attest(state.flights[copy.replica_of], copy)

    def _attest(self, flight: Flight, copy: Flight) -> None:
        """Check a validator's attestation of `copy.judged` and act on its verdict."""
        judged = copy.judged
        assert judged is not None
        worker, validator = judged.outcome.worker_id, copy.outcome.worker_id
        links = [judged.span.span_id] + ([copy.span.span_id] if copy.span else [])
        base = {"parent": flight.span.span_id, "depth": self.scope.depth, "links": links}
        if copy.outcome.status != "ok" or copy.result is None:
            self.emitter.instant(
                "Verify.Attest",
                **base,
                status="error",
                tier="high_trust",
                worker_id=worker or None,
                reason=f"the validator gave no answer: {copy.outcome.error or copy.outcome.status}",
            )
            return
        signed, problem = self._attestation(flight, judged, copy)
        if problem is not None:
            from workers.services import worker_strike

            self.emitter.instant(
                "Verify.Attest",
                **base,
                status="rejected",
                tier="high_trust",
                worker_id=validator or None,
                reason=f"attestation refused: {problem}",
            )
            worker_strike(validator, f"bad attestation: {problem}")
            copy.verdict = "rejected"
            return
        assert signed is not None
        agreed = signed["attestation"]["verdict"] == "agree"
        self.emitter.instant(
            "Verify.Attest",
            **base,
            status="ok" if agreed else "rejected",
            worker_id=worker or None,
            sq=flight.outcome.index,
            attrs={"tier": "high_trust", **signed},
        )
        self.reputations.observe(Observation(worker, validation=agreed))
        judged.verdict = "accepted" if agreed else "rejected"
        copy.verdict = "validator"
        if not agreed:
            # The validator is trusted: its answer stands instead of the diverging one.
            _adopt(flight.outcome, copy.outcome)

    def _attestation(
        self, flight: Flight, judged: Flight, copy: Flight
    ) -> tuple[attest.SignedAttestation | None, str | None]:
        """The validator's signed attestation, and what is wrong with it (None when it is
        sound: signed with the validator's registered key, about this very reply)."""
        assert copy.result is not None
        try:
            signed = json.loads(copy.result.get("attestation") or "null")
        except ValueError:
            return None, "not JSON"
        if not isinstance(signed, dict):
            return None, "the validator sent none"
        key = self.intake.public_key(copy.outcome.worker_id)
        problem = attest.attestation_problem(signed, validator_key=key)  # type: ignore[arg-type]
        if problem is not None:
            return None, problem
        att = signed["attestation"]
        expected = {
            "run": self.scope.run_id,
            "subquery": flight.span.span_id,
            "span": judged.span.span_id,
            "worker": judged.outcome.worker_id,
            "validator": copy.outcome.worker_id,
            "input_sha256": sha256_text(judged.prompt),
            "worker_output_sha256": sha256_text(judged.outcome.text),
            "validator_output_sha256": sha256_text(copy.outcome.text),
        }
        wrong = [k for k, v in expected.items() if att.get(k) != v]
        if wrong:
            return None, f"it is not about this reply ({', '.join(wrong)} differ)"
        return signed, None  # type: ignore[return-value]

    def _pump(self, wave: Wave) -> None:
        """Send the backlog jobs that should go now: their Submit spans in one round trip,
        their messages through one producer, pipelined DISPATCH_FLUSH at a time."""
        if not wave.backlog:
            return
        picks = self.router.plan(wave)
        if not picks:
            if not wave.out and self.router.any_credit():
                # Workers are there but none may take it, and nothing in flight will free
                # a credit: waiting would wait forever. (With no worker at all, the batch
                # waits a while for one to come back: see _collect.)
                capped = self.accounts.capped_providers
                self.attempts.settle_backlog(
                    wave, "budget" if capped else "error", self.router.unroutable()
                )
            return
        taken = {id(flight) for flight, _ in picks}
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
        self.transport.publish(ready)

    # --- collection ------------------------------------------------------------------
    def _collect(self, batch: list[Flight], wave: Wave) -> None:
        need = math.ceil(self.policy.quorum * len(batch))
        batch_deadline = time.time() + self.policy.batch_deadline_s
        last_progress = 0.0
        while wave.out or wave.backlog:
            if self.cancelled():
                self.attempts.cancel_rest(wave, "the run was cancelled")
                raise FanoutAbort("the run was cancelled", status="cancelled")
            now = time.time()
            wake = min([f.deadline for f in wave.out.values()] + [batch_deadline])
            block_ms = int(max(1, min(200, (wake - now) * 1000)))
            reply = self.transport.read(block_ms, gather=bool(wave.backlog))
            with self.emitter.batch():
                for result in self.transport.results(reply):
                    self.intake.on_result(result, wave)
                self.liveness.check_deadlines(wave)
                self.liveness.check_lost_workers(wave)
                self.hedger.hedge_stragglers(wave)
                settled = sum(1 for f in batch if f.outcome.status != "pending")
                if (wave.out or wave.backlog) and settled >= need:
                    self.attempts.cancel_rest(wave, f"quorum of {need}/{len(batch)} reached")
                elif (wave.out or wave.backlog) and time.time() > batch_deadline:
                    self.attempts.cancel_rest(
                        wave, f"batch deadline of {self.policy.batch_deadline_s} s passed"
                    )
                else:
                    self.liveness.await_workers(wave)
            self._pump(wave)
            with self.emitter.batch():
                self.router.flush()
            if time.monotonic() - last_progress > 0.2:
                self.on_progress()
                last_progress = time.monotonic()
        self.on_progress()


def _adopt(outcome: Outcome, source: Outcome) -> None:
    """Make `source`'s reply the answer of `outcome`'s sub-query (a recheck or a validator
    replaced it)."""
    outcome.status = "ok"
    outcome.text = source.text
    outcome.error = ""
    outcome.venue = source.venue
    outcome.worker_id = source.worker_id
