"""Judging a batch's replies as its tier asks. Objective: the call's own check (a JSON schema,
a regex, the program's function); a reply that fails it goes to a worker that has not failed
it, while attempts remain. Redundant: copies go to other workers in rounds until enough agree.
High trust: a validator on a trusted venue re-runs a sample and signs an attestation of its
verdict. Each verdict teaches the reputations who was right and names what each reply is paid
as. The judge sends its copies through the callback it is given, as any batch is sent."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runs.engine.fanout.state import Batch, Flight, LimitExceeded, Outcome, Roster, Scope, Totals
from runs.trust import verify
from traces.emitter import Emitter, sha256_text
from workers import attestation
from workers.agreement import AgreementRule
from workers.reputation import Observation, Reputations
from workers.services import worker_strike

# A worker whose validation record (its Beta mean) is below this has been caught recently:
# the high-trust tier re-runs all of its answers until the record mends.
SUSPECT_BELOW = 0.5
# How much of an accepted answer a Verify.Redundant event quotes (the payload has it all).
QUOTE_CHARS = 200


@dataclass(kw_only=True, eq=False)
class Judge:
    scope: Scope
    roster: Roster
    emitter: Emitter
    totals: Totals
    tally: verify.VerificationTally
    reputations: Reputations
    rng: random.Random
    public_key: Callable[[str], str | None]  # a worker's key (intake.Intake.public_key)
    send: Callable[[list[Flight]], None]  # dispatches copies, collects replies, as any batch

    # --- objective: the call's own check ---------------------------------------------
    def check_all(
        self, state: Batch, check: Callable[[str], verify.CheckVerdict], positions: Any
    ) -> dict[int, verify.CheckVerdict]:
        """The conductor's own check (a JSON schema, a regex) of the replies at `positions`."""
        return {
            pos: check(state.holder(pos).outcome.text)
            for pos in positions
            if state.holder(pos).outcome.status == "ok"
        }

    def objective_round(self, state: Batch, verdicts: dict[int, verify.CheckVerdict]) -> list[int]:
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
            if len(failed) <= self.scope.policy.max_retries:
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
        self.send(retry)
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

    # --- redundant: agreement among workers ------------------------------------------

    def redundant(self, state: Batch) -> None:
        """Copies of each answered sub-query go to other workers, in rounds, until its
        answer is accepted or it is unresolved. An answer from a worker past the trust gate
        is copied only now and then (verify.should_replicate)."""
        policy = verify.RedundancyPolicy(
            replicas=self.scope.policy.replicas,
            agree=self.scope.policy.agree,
            max_replicas=self.scope.policy.max_replicas,
            rule=AgreementRule(mode=self.scope.policy.agree_mode),
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
            self.send(copies)
            for copy in copies:
                if copy.outcome.status == "ok":
                    replies[copy.replica_of].append((self._reply(copy), copy))
            todo = sorted({c.replica_of for c in copies})

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
                reason=f"no agreement within {self.scope.policy.max_replicas} replicas",
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

    def _reply(self, flight: Flight) -> verify.Reply:
        return verify.Reply(
            flight.outcome.worker_id,
            flight.outcome.venue,
            flight.outcome.text,
            flight.span.span_id if flight.span else "",
        )

    # --- high trust: a validator's signed attestation --------------------------------

    def validator_venues(self) -> frozenset[str]:
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

    def high_trust(self, state: Batch) -> None:
        """A validator re-runs a sample of the answers: often those only workers below the
        trust gate vouch for, rarely the others (verify.should_validate); each re-run comes
        back with the validator's signed attestation (Verify.Attest). A divergence takes
        the validator's answer and counts against the worker."""
        venues_ = self.validator_venues()
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
                untrusted_rate=self.scope.policy.validate_rate,
                trusted_rate=self.scope.policy.validate_trusted_rate,
                suspect=not trusted and passed is not None and passed < SUSPECT_BELOW,
            ):
                continue
            copy = self._copy(state, pos, "validator", {worker})
            copy.venues, copy.judged = venues_, holder
            copies.append(copy)
        if not copies:
            return
        self.tally.add_extra("validator", len(copies))
        self.send(copies)
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
    ) -> tuple[attestation.SignedAttestation | None, str | None]:
        """The validator's signed attestation, and what is wrong with it (None when it is
        sound: signed with the validator's registered key, about this very reply)."""
        assert copy.result is not None
        try:
            signed = json.loads(copy.result.get("attestation") or "null")
        except ValueError:
            return None, "not JSON"
        if not isinstance(signed, dict):
            return None, "the validator sent none"
        key = self.public_key(copy.outcome.worker_id)
        problem = attestation.attestation_problem(signed, validator_key=key)  # type: ignore[arg-type]
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


def _adopt(outcome: Outcome, source: Outcome) -> None:
    """Make `source`'s reply the answer of `outcome`'s sub-query (a recheck or a validator
    replaced it)."""
    outcome.status = "ok"
    outcome.text = source.text
    outcome.error = ""
    outcome.venue = source.venue
    outcome.worker_id = source.worker_id
