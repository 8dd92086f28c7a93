"""Judging a batch's replies as its tier asks. Objective: the call's own check (a JSON schema,
a regex, the program's function); a reply that fails it goes to a worker that has not failed
it, while attempts remain. Redundant: copies go to other workers in rounds until enough agree.
High trust: a validator on a trusted venue re-runs a sample and signs an attestation of its
verdict. Each verdict teaches the reputations who was right and names what each reply is paid
as. The judge sends its copies through the callback it is given, as any batch is sent."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from runs.engine.fanout.attesting import sound_attestation
from runs.engine.fanout.state import Batch, Flight, LimitExceeded, Outcome, Roster, Scope, Totals
from runs.trust import objective, probes, verify
from traces.emitter import Emitter
from workers.agreement import AgreementRule
from workers.reputation import Observation, Reputations
from workers.services import worker_strike

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
    # Workers caught lying in this run, each with what caught it (issue 23).
    caught: dict[str, str] = field(default_factory=dict)
    # Answers of earlier batches taken unchecked, by worker: (sub-query span, number). They
    # went back to the REPL already; if their worker is caught they are flagged.
    returned: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    sampler: verify.Sampler | None = None

    def __post_init__(self) -> None:
        self.sampler = verify.Sampler(self.rng, self.reputations.client)

    # --- objective: the call's own check ---------------------------------------------
    def check_all(
        self, state: Batch, check: Callable[[str], objective.CheckVerdict], positions: Any
    ) -> dict[int, objective.CheckVerdict]:
        """The conductor's own check (a JSON schema, a regex) of the replies at `positions`."""
        return {
            pos: check(state.holder(pos).outcome.text)
            for pos in positions
            if state.holder(pos).outcome.status == "ok"
        }

    def objective_round(
        self, state: Batch, verdicts: dict[int, objective.CheckVerdict]
    ) -> list[int]:
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
            tries = state.check_failures[pos] = state.check_failures.get(pos, 0) + 1
            if tries <= self.scope.policy.max_retries:
                retry.append(self._copy(state, pos, "recheck", set(failed)))
                continue
            flight.outcome.status = "rejected"
            flight.outcome.error = (
                f"failed its check {tries} time(s), on {len(failed)} worker(s); "
                f"last: {verdict.reason}"
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
        answer is accepted or it is unresolved. Which answers are copied: all of a new
        worker's and a suspect's, policy.check_floor of the others (Judge._sample), and
        enough more that every untrusted worker of the batch takes part in a check
        (Judge._cover); a worker outvoted here has its other answers of the batch copied
        too."""
        policy = verify.RedundancyPolicy(
            replicas=self.scope.policy.replicas,
            agree=self.scope.policy.agree,
            max_replicas=self.scope.policy.max_replicas,
            rule=AgreementRule(mode=self.scope.policy.agree_mode),
        )
        replies: dict[int, list[tuple[verify.Reply, Flight]]] = {}
        sent: dict[int, int] = {}  # copies sent, answered or not: the limit counts them all
        why: dict[int, str] = {}  # why each checked answer was checked, for its span
        rule = verify.CheckRule(
            floor=self.scope.policy.check_floor, warmup=self.scope.policy.check_warmup
        )
        self._load_credit(state, rule)
        gate = state.vouches
        for pos, flight in enumerate(state.flights):
            if flight.outcome.status != "ok":
                continue
            holder = state.holder(pos)
            replies[pos] = [(self._reply(holder), holder)]
            sent[pos] = 1
            early = gate.early.get(pos) if gate is not None else None
            if early and policy.agree > 1:
                # Checked at the gate as it came in (vouching.Vouching): its copies are the
                # first replicas, and more go out here only if they did not settle it.
                answered = [c for c in early if c.outcome.status == "ok"]
                replies[pos] += [(self._reply(c), c) for c in answered]
                sent[pos] += len(answered)
                why[pos] = gate.why.get(pos, "gate") if gate is not None else "gate"
                continue
            if policy.agree > 1:
                reason = self._trusted_sample(holder.outcome.worker_id)
                if reason is None:
                    reason = self._sample(holder.outcome.worker_id, rule)
                if reason:
                    why[pos] = reason
        self._save_credit()
        pins = self._cover(replies, why) if policy.agree > 1 else {}
        self._rounds(state, policy, sorted(why), replies, sent, why, pins)
        # A worker caught in this batch has every other answer of it checked too: these
        # have not gone back to the REPL yet, so the check corrects them.
        again = [
            pos
            for pos in replies
            if pos not in why and policy.agree > 1 and replies[pos][0][0].worker_id in self.caught
        ]
        for pos in again:
            why[pos] = self._recheck_why(replies[pos][0][0].worker_id)
        self._rounds(state, policy, again, replies, sent, why)
        self._remember_unchecked(state, [p for p in replies if p not in why])

    def _rounds(
        self,
        state: Batch,
        policy: verify.RedundancyPolicy,
        todo: list[int],
        replies: dict[int, list[tuple[verify.Reply, Flight]]],
        sent: dict[int, int],
        why: dict[int, str],
        pins: dict[int, str] | None = None,
    ) -> None:
        """Copies of the sub-queries at `todo` go out in rounds until each is judged; the
        first copy of a position in `pins` goes to the worker named there."""
        pins = dict(pins or {})
        while todo:
            copies: list[Flight] = []
            trusted = self.trusted()  # once a round, not once a sub-query
            for pos in todo:
                judged = [reply for reply, _ in replies[pos]]
                decision = verify.redundant_decide(
                    judged, policy, barred=self.caught, trusted=trusted
                )
                # Distinct workers: a worker asked again would not vote again
                # (verify.redundant_decide).
                avoid = set(decision.avoid_workers)
                others = self._others(avoid)
                if decision.outcome == "more" and not others:
                    short = f"no other live worker to ask ({len(avoid)} asked already)"
                    decision = (
                        verify.trusted_alone(judged, policy.rule, self.caught, trusted) or decision
                    )
                    self._judge(state.flights[pos], decision, replies[pos], why.get(pos, ""), short)
                    continue
                if decision.outcome != "more" or sent[pos] >= policy.max_replicas:
                    self._judge(state.flights[pos], decision, replies[pos], why.get(pos, ""))
                    continue
                # The round's copies share one set of workers tried: each worker one of
                # them goes to is kept from the others (scheduler.Need.group).
                tried = avoid | set(self.caught)
                count = min(decision.dispatch, policy.max_replicas - sent[pos], others)
                target = pins.pop(pos, None)
                if count and target is not None and target not in tried:
                    copies.append(self._copy(state, pos, "replica", self._only(target)))
                    tried.add(target)
                    sent[pos] += 1
                    count -= 1
                for _ in range(count):
                    copies.append(self._copy(state, pos, "replica", tried))
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
        why: str = "",
        short: str = "",
    ) -> None:
        """Record the verdict on the sub-query's span, teach reputation who was right, and
        make the accepted answer (or the lack of one) the sub-query's outcome. `short` says
        why no more copies could go out when workers, not replicas, ran out."""
        if decision.outcome == "more":  # out of replicas, or of workers, without agreement
            decision = verify.Decision(
                "unresolved",
                groups=decision.groups,
                links=decision.links,
                replies=decision.replies,
                mode=decision.mode,
                reason=f"no agreement within {self.scope.policy.max_replicas} replicas"
                + (f" ({decision.reason}; {short})" if short else ""),
            )
        attrs: dict[str, Any] = dict(decision.attrs())
        attrs["why"] = why
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
            if not ok:
                self._caught(worker_id, f"outvoted on sub-query {flight.outcome.index}")
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
        """A validator re-runs a sample of the answers: all of a new worker's (until it has
        passed policy.check_warmup checks), then policy.check_floor of them, and rarely
        those of a trusted venue's workers; each re-run comes back with the validator's
        signed attestation (Verify.Attest). A divergence takes the validator's answer and
        counts against the worker, whose other answers in the batch are then re-run too."""
        venues_ = self.validator_venues()
        policy = self.scope.policy
        rule = verify.CheckRule(
            floor=policy.check_floor, warmup=policy.check_warmup, new_rate=policy.validate_rate
        )
        why: dict[int, str] = {}
        answered: list[int] = []
        attested: set[int] = set()  # attested already, at the gate
        self._load_credit(state, rule)
        gate = state.vouches
        for pos, flight in enumerate(state.flights):
            holder = state.holder(pos)
            if flight.outcome.status != "ok" or holder.outcome.status != "ok":
                continue
            answered.append(pos)
            worker = holder.outcome.worker_id
            early = gate.early.get(pos, []) if gate is not None else []
            validator = next((c for c in early if c.kind == "validator" and c.judged), None)
            if gate is not None and validator is not None:
                # A dispute at the gate (vouching.Vouching) went to a validator: its signed
                # verdict is this answer's check.
                why[pos] = gate.why.get(pos, "gate")
                attested.add(pos)
                self._attest(flight, validator, why[pos])
                continue
            trusted = self._trusted_sample(worker)
            if trusted is not None:
                if trusted:
                    why[pos] = trusted
                continue
            reason = self._sample(worker, rule)
            if reason:
                why[pos] = reason
        self._save_credit()
        self._validate(state, sorted(set(why) - attested), venues_, why)
        again = [
            p for p in answered if p not in why and state.holder(p).outcome.worker_id in self.caught
        ]
        for pos in again:
            why[pos] = self._recheck_why(state.holder(pos).outcome.worker_id)
        self._validate(state, again, venues_, why)
        self._remember_unchecked(state, [p for p in answered if p not in why])

    def _validate(
        self, state: Batch, positions: list[int], venues_: frozenset[str], why: dict[int, str]
    ) -> None:
        copies: list[Flight] = []
        for pos in positions:
            holder = state.holder(pos)
            copy = self._copy(state, pos, "validator", {holder.outcome.worker_id})
            copy.venues, copy.judged = venues_, holder
            copies.append(copy)
        if not copies:
            return
        self.tally.add_extra("validator", len(copies))
        self.send(copies)
        for copy in copies:
            self._attest(state.flights[copy.replica_of], copy, why.get(copy.replica_of, ""))

    # --- how often a worker is checked, and what happens when one is caught ----------

    def _trusted_sample(self, worker: str) -> str | None:
        """For a trusted venue's worker, why this answer of it is checked ("" when it is
        not: policy.validate_trusted_rate of them are, on either checking tier); None for a
        worker nobody vouches for, which the floor and the gate are for. Sampled at the
        floor on the redundant tier, a trusted venue's answers cost an honest swarm 3-5
        copies per batch of 100 (bench/trust.py), more than the gate's."""
        if not self.roster.workers.get(worker, {}).get("trusted"):
            return None
        rate = self.scope.policy.validate_trusted_rate
        return f"trusted venue, sampled at {100 * rate:g}%" if self.rng.random() < rate else ""

    def _sample(self, worker: str, rule: verify.CheckRule) -> str:
        """Why this answer of `worker` is checked, or "" when it is not (verify.Sampler at
        the rate the rule gives its record)."""
        record = self.reputations.get(worker)
        suspect = worker in self.caught or record.suspect
        assert self.sampler is not None
        if self.sampler.take(worker, rule.rate(record.consecutive_valid, suspect=suspect)):
            return rule.why(record.consecutive_valid, suspect=suspect)
        return ""

    def _load_credit(self, state: Batch, rule: verify.CheckRule) -> None:
        """The sampler's credit of the batch's workers, as earlier runs left it, less the
        checks made of them in this batch: by the gate (vouching.Vouching), an untrusted
        worker's answer or a copy it answered for it, and a probe it passed. On the
        high-trust tier a gate's check counts only when a validator made it: a peer's
        agreement there leaves the floor's check owed (a probe's known answer is as good as
        a validator's). Nor do checks of a worker all of whose answers are checked
        anyway (verify.CheckRule.counts)."""
        assert self.sampler is not None
        gate = state.vouches
        checked = [
            f.outcome.worker_id
            for pos, copies in (gate.early.items() if gate is not None else ())
            if state.tier != "high_trust" or any(c.kind == "validator" for c in copies)
            for f in [state.holder(pos), *copies]
            if f.outcome.status == "ok"
            and not self.roster.workers.get(f.outcome.worker_id, {}).get("trusted")
        ] + state.probed
        try:
            self.sampler.load(
                [state.holder(p).outcome.worker_id for p in range(len(state.flights))] + checked
            )
        except redis.RedisError:
            pass  # a fresh phase for this batch: the checks still run at their rate
        for worker in checked:
            record = self.reputations.get(worker)
            suspect = worker in self.caught or record.suspect
            if rule.counts(record.consecutive_valid, suspect=suspect):
                self.sampler.spend(worker)

    def _save_credit(self) -> None:
        assert self.sampler is not None
        try:
            self.sampler.save()
        except redis.RedisError:
            pass  # the next run starts at a fresh phase

    def _cover(
        self, replies: dict[int, list[tuple[verify.Reply, Flight]]], why: dict[int, str]
    ) -> dict[int, str]:
        """Add checks so that every untrusted worker that answered in this batch takes part
        in one (policy.check_cover, runs.trust.verify.cover); returns the worker the first
        copy of each checked position goes to."""
        if self.scope.policy.check_cover != "batch":
            return {}
        owners = {pos: judged[0][0].worker_id for pos, judged in replies.items()}
        workers = self.roster.workers
        untrusted = {
            w
            for w in owners.values()
            if w and w not in self.caught and not workers.get(w, {}).get("trusted")
        }
        plan = verify.cover(owners, untrusted, sorted(why), self._askable(), self.rng)
        for pos in plan.extra:
            why[pos] = verify.COVER_WHY
        return plan.pins

    def _recheck_why(self, worker: str) -> str:
        return f"recheck: its worker was caught ({self.caught[worker]})"

    def _caught(self, worker: str, how: str) -> None:
        """A proven lie: the worker is checked on every answer for the rest of the run, and
        what it answered unchecked in earlier batches (already back in the REPL, so past
        correcting) is flagged in the trace."""
        first = worker not in self.caught
        self.caught.setdefault(worker, how)
        earlier = self.returned.pop(worker, [])
        if not (first or earlier):
            return
        self.emitter.instant(
            "Verify.Flag",
            parent=self.scope.parent,
            depth=self.scope.depth,
            status="rejected",
            worker_id=worker or None,
            caught_by=how,
            flagged=[span for span, _ in earlier],
            subqueries=[number for _, number in earlier],
            reason=(
                f"caught lying ({how}); {len(earlier)} earlier answer(s) of it were taken "
                "unchecked and have gone back to the program: treat them as suspect"
                if earlier
                else f"caught lying ({how}); it is checked on every answer from now on"
            ),
        )

    def _remember_unchecked(self, state: Batch, positions: list[int]) -> None:
        for pos in positions:
            holder, flight = state.holder(pos), state.flights[pos]
            if flight.span is not None and holder.outcome.worker_id:
                self.returned.setdefault(holder.outcome.worker_id, []).append(
                    (flight.span.span_id, flight.outcome.index)
                )

    # --- known-answer probes -----------------------------------------------------------

    def probes_for(self, state: Batch) -> list[Flight]:
        """Probes to mix into the batch (runs.trust.probes): one for each untrusted worker
        that has not yet passed policy.check_warmup checks, and policy.probe_rate of the
        batch for workers drawn at random. Each goes to its worker only; nothing in the job
        tells it from the batch's other work."""
        if state.tier not in ("redundant", "high_trust"):
            return []
        policy = self.scope.policy
        untrusted = {
            wid: w
            for wid, w in self.roster.workers.items()
            if not w.get("trusted") and w["venue"] in self.scope.answer_venues
        }
        if not untrusted:
            return []
        prompts = [f.prompt for f in state.flights]
        targets = [
            wid
            for wid in sorted(untrusted)
            if self.reputations.get(wid).consecutive_valid < policy.check_warmup
        ]
        warming = len(targets)
        targets += [
            self.rng.choice(sorted(untrusted))
            for _ in range(probes.probe_count(len(prompts), policy.probe_rate, self.rng))
        ]
        flights = []
        for n, wid in enumerate(targets):
            probe = dataclasses.replace(
                probes.make_probe(prompts, self.rng),
                why="new worker: answers probes before its work goes unchecked"
                if n < warming
                else f"sampled: {100 * policy.probe_rate:g}% of each batch are probes",
            )
            flight = Flight(
                Outcome(0),
                probe.prompt,
                venues=frozenset({untrusted[wid]["venue"]}),
                kind="probe",
                probe=probe,
            )
            flight.tried = self._only(wid)
            flights.append(flight)
        if flights:
            self.tally.add_extra("probe", len(flights))
        return flights

    def probe_round(self, state: Batch, sent: list[Flight]) -> None:
        """Each probe's reply against its known answer (Verify.Probe); a failed one is a
        proven lie."""
        for flight in sent:
            assert flight.probe is not None
            if flight.outcome.status != "ok":
                continue
            worker = flight.outcome.worker_id
            passed = probes.probe_passed(flight.probe, flight.outcome.text)
            self.emitter.instant(
                "Verify.Probe",
                parent=flight.span.span_id if flight.span else self.scope.parent,
                depth=self.scope.depth,
                status="ok" if passed else "rejected",
                links=[flight.span.span_id] if flight.span else [],
                worker_id=worker or None,
                venue=flight.outcome.venue or None,
                sq=flight.outcome.index,
                tier="probe",
                source=flight.probe.source,
                ok=passed,
                expected=flight.probe.answer[:QUOTE_CHARS],
                why=flight.probe.why,
            )
            flight.verdict = "accepted" if passed else "rejected"
            if worker and passed:
                state.probed.append(worker)  # a check of it: the floor's sample counts it
            if worker:
                self.reputations.observe(Observation(worker, validation=passed))
                if not passed:
                    self._caught(worker, f"failed probe sub-query {flight.outcome.index}")

    def _attest(self, flight: Flight, copy: Flight, why: str = "") -> None:
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
        signed, problem = sound_attestation(
            self.scope.run_id, flight, judged, copy, self.public_key
        )
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
            attrs={"tier": "high_trust", "why": why, **signed},
        )
        self.reputations.observe(Observation(worker, validation=agreed))
        if not agreed:
            self._caught(worker, f"a validator diverged on sub-query {flight.outcome.index}")
        judged.verdict = "accepted" if agreed else "rejected"
        copy.verdict = "validator"
        if not agreed:
            # The validator is trusted: its answer stands instead of the diverging one.
            _adopt(flight.outcome, copy.outcome)

    def _askable(self) -> set[str]:
        """The live workers a copy may go to: on the venues copies run on, and not caught
        lying in this run (their votes do not count)."""
        where = self.scope.verify_venues or self.scope.answer_venues
        return {
            wid
            for wid, w in self.roster.workers.items()
            if w["venue"] in where and wid not in self.caught
        }

    def trusted(self) -> frozenset[str]:
        """The workers of trusted venues: a tie they are on one side of is theirs
        (verify.redundant_decide)."""
        return frozenset(wid for wid, w in self.roster.workers.items() if w.get("trusted"))

    def _others(self, avoid: set[str]) -> int:
        """How many workers a replica may still go to, besides those in `avoid`."""
        return len(self._askable() - avoid)

    def _only(self, worker: str) -> set[str]:
        """Workers tried for a flight that must go to `worker` alone: every other one."""
        return set(self.roster.workers) - {worker}

    def _copy(self, state: Batch, pos: int, kind: str, tried: set[str]) -> Flight:
        """A copy of position `pos`'s sub-query, made to judge its reply; it runs on none
        of the workers in `tried`, which becomes its own set of workers tried: copies given
        one set share it (scheduler.Need.group keeps them on distinct workers)."""
        holder = state.holder(pos)
        copy = Flight(
            Outcome(0),
            holder.prompt,
            replica_of=pos,
            venues=self.scope.verify_venues,
            original=state.flights[pos].outcome.index,
            kind=kind,
        )
        copy.tried = tried
        return copy


def _adopt(outcome: Outcome, source: Outcome) -> None:
    """Make `source`'s reply the answer of `outcome`'s sub-query (a recheck or a validator
    replaced it)."""
    outcome.status = "ok"
    outcome.text = source.text
    outcome.error = ""
    outcome.venue = source.venue
    outcome.worker_id = source.worker_id
