"""The check gate of a batch on a checking tier (policy.check_cover "gate", issue 23): one
answer of each untrusted worker in the batch is checked the moment it arrives, and the
worker is given no more of the batch's work than its slots less one, past the answers
before that one, until the check's verdict. A new or suspect worker's first answer is
checked; a settled worker's is drawn at random among the answers it is expected to give
(Vouching._draw_due), so that a liar cannot tell which answer of a batch is safe to lie
on: when it was always the first, a liar that answered its first job of each batch
honestly and lied on the rest was vouched for every batch (check_cover "first" keeps
that gate).

On the redundant tier a check copies the answer to another worker, preferably another
untrusted one that has not been vouched for yet: its answer to the copy checks both of them,
so an honest swarm pays one copy per two workers, and the slot each keeps free runs the copy
at once. Agreement vouches for both, and they get work again; a disagreement goes to a third
worker's vote. Either way the check counts as the worker's sampled one
(judging.Judge._load_credit).

On the high-trust tier two untrusted workers agreeing proves nothing against colluders, so
a trusted validator checks the answer of a worker that is new (fewer than check_warmup
checks passed), suspect, or whose floor check is due in this batch (verify.Sampler.due):
the validator's checks of a settled worker stay at check_floor of its answers, as without
the gate. The other settled workers check each other in pairs, as on the redundant tier
(one copy per two workers; a worker with no unchecked peer left gets a validator's check
for its one copy, which counts toward its floor), and a disagreement goes to a validator,
whose answer decides for both. A validator per worker per batch cost an honest swarm of 10
workers 10% of a batch of 100 (bench/trust.py); now about half a copy per worker, plus
the floor's share. Colluders that turn together are caught by the floor's validator
checks, within 1/check_floor answers, if they happen to check each other. Whatever
checked it, the worker found lying is caught (judging.Judge.caught: it gets no more work
in the run, its answers of the batch are checked again when the batch is judged and
corrected, its earlier ones flagged).

A worker that turns liar before the answer drawn for it in a batch is so caught there,
its lies of the batch corrected; one that turns after it takes the rest of its share of
that batch unchecked but for the floor, and is caught at the next batch's draw.
The copies made here are judged again with the batch (judging.Judge takes them as the
first replicas of their sub-query), so the trace's Verify.Redundant or Verify.Attest
is the verdict of record; Verify.Gate says what the gate decided and when, and which of
the worker's answers it took (`answer`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from runs.engine.fanout.judging import Judge
from runs.engine.fanout.state import Batch, Flight, Roster, Scope, Vouches, Wave
from runs.trust import verify
from traces.emitter import Emitter
from workers.agreement import AgreementRule, agree

GATED_TIERS = ("redundant", "high_trust")


@dataclass(kw_only=True, eq=False)
class Vouching:
    scope: Scope
    roster: Roster
    emitter: Emitter
    judge: Judge
    tally: verify.VerificationTally
    enqueue: Callable[[list[Flight], Wave], None]  # sends copies with the batch's own work
    # The answers each worker is expected to give in the batch (Vouching._expect): among
    # which the gate's check of it is drawn, and, on the high-trust tier, whether its floor
    # check falls in the batch (Vouching._validator_due).
    _expected: dict[str, float] = field(default_factory=dict)

    def begin(self, state: Batch) -> None:
        """Gate the batch's dispatch when its tier checks untrusted workers."""
        cover = self.scope.policy.check_cover
        if state.tier in GATED_TIERS and cover in ("gate", "first"):
            self._expected = self._expect(state)
            if state.tier == "high_trust":
                self._read_credit(state)
            state.vouches = Vouches(
                barred=self.judge.caught,
                positions={id(f): pos for pos, f in enumerate(state.flights)},
                due=self._draw_due(state) if cover == "gate" else {},
            )

    def _expect(self, state: Batch) -> dict[str, float]:
        """The answers each live worker of the answer venues (not caught) is expected to
        give in the batch: its share by slots over latency, as the scheduler shares it out.
        An even split among the untrusted workers, which the floor's peek used, counted
        the trusted workers' share to them too."""
        speed = {
            wid: int(w.get("concurrency", 1)) / max(1.0, float(w.get("latency_ms") or 1.0))
            for wid, w in self.roster.workers.items()
            if w["venue"] in self.scope.answer_venues and wid not in self.judge.caught
        }
        total = sum(speed.values()) or 1.0
        return {wid: len(state.flights) * v / total for wid, v in speed.items()}

    def _draw_due(self, state: Batch) -> dict[str, int]:
        """Which answer of the batch the gate checks, for each settled untrusted worker:
        one drawn at random among the answers it is expected to give (Vouching._expect).
        The first answer,
        always taken, was one a liar knew to be safe: it answered it honestly and lied on
        the rest (test_trust_checks' gate-aware liar). A new or suspect worker (not in the
        map) has its first answer checked; a worker whose draw its answers fall short of,
        its next answer once the batch's work is all out (Vouching._start)."""
        due: dict[str, int] = {}
        for wid, share in sorted(self._expected.items()):
            if self.roster.workers[wid].get("trusted") or not self._settled(wid):
                continue
            due[wid] = self.judge.rng.randint(1, max(1, round(share)))
        return due

    def _read_credit(self, state: Batch) -> None:
        """The untrusted workers' sampler credit as earlier runs left it (one round trip;
        read again each batch, since other runs move it too)."""
        untrusted = [
            wid
            for wid, w in self.roster.workers.items()
            if not w.get("trusted") and w["venue"] in self.scope.answer_venues
        ]
        assert self.judge.sampler is not None
        try:
            self.judge.sampler.load(untrusted)
        except redis.RedisError:
            pass  # a fresh phase: the peek is as good as the judge's

    def end(self, state: Batch) -> None:
        """The batch's own dispatch is over: the judge's rounds are not gated."""
        if state.vouches is not None:
            state.vouches.open = False

    def on_settled(self, flight: Flight, wave: Wave) -> None:
        """An attempt of the batch has ended: a first answer starts its worker's check, a
        check's copy moves it on."""
        state = self.scope.batch
        gate = state.vouches if state is not None else None
        if state is None or gate is None or not gate.open:
            return
        owner = flight.twin if flight.hedge and flight.twin is not None else flight
        if id(owner) in gate.copies:
            self._advance(state, gate, gate.copies[id(owner)], wave)
        elif id(owner) in gate.positions and owner.outcome.status == "ok":
            self._start(state, gate, gate.positions[id(owner)], wave)

    # --- a check's life ----------------------------------------------------------------
    def _start(self, state: Batch, gate: Vouches, pos: int, wave: Wave) -> None:
        worker = state.holder(pos).outcome.worker_id
        number = gate.answered[worker] = gate.answered.get(worker, 0) + 1
        if not self._unvouched(gate, worker) or worker in gate.checking or worker in gate.pending:
            return  # trusted, settled or under check already, or its answer to one will say
        short = number < gate.due.get(worker, 1)
        if short and not self._all_out(gate, wave):
            return  # the answer the gate checks is a later one
        gate.pending[worker] = pos
        gate.nth[pos] = number
        if worker not in gate.due:  # new or suspect, or check_cover=first
            which = (
                f"the first answer of worker {worker[:12]} in this batch"
                if number == 1
                else f"answer {number} of worker {worker[:12]} in this batch, its first not "
                "given while it checked another's"
            )
        elif short:
            which = (
                f"answer {number} of worker {worker[:12]} in this batch, one of its last: it "
                f"got fewer answers than the {gate.due[worker]} drawn"
            )
        else:
            which = (
                f"answer {number} of worker {worker[:12]} in this batch (drawn at random among "
                "the answers it is expected to give, so that none is safe to lie on)"
            )
        gate.why[pos] = (
            f"gate: {which}; it gets no more work of the batch until this check's verdict"
        )
        if state.tier == "high_trust":
            due = self._validator_due(worker)
            partner = None if due else self._peer(gate, worker)
            if partner is None:
                # A validator's verdict; it is the worker's sampled check for the batch too
                # (judging.Judge._load_credit).
                gate.why[pos] += "; a validator checks it: " + (
                    due or "no settled peer unchecked in the batch is free"
                )
                self._validate(state, gate, pos, wave)
                return
            gate.why[pos] += "; a settled peer checks it (no validator's check is due)"
            gate.peering[partner] = pos
        else:
            partner = self._partner(gate, worker)
            if partner is None:
                self._release(state, gate, pos, "no other live worker to check it with")
                return
        if self._unvouched(gate, partner) and partner not in gate.pending:
            gate.checking[partner] = pos
        copy = self._send(state, gate, pos, "replica", self.judge._only(partner), wave)
        if state.tier == "high_trust":  # a peer of the swarm, not a validator's venue
            copy.venues = frozenset({self.roster.workers[partner]["venue"]})

    def _advance(self, state: Batch, gate: Vouches, pos: int, wave: Wave) -> None:
        copies = gate.early[pos]
        if any(c.outcome.status == "pending" for c in copies):
            return  # a retry or another copy is still out
        holder = state.holder(pos)
        answered = [c for c in copies if c.outcome.status == "ok"]
        validator = next((c for c in answered if c.kind == "validator"), None)
        if validator is not None:
            self._arbitrate(state, gate, pos, validator)
            return
        if state.tier == "high_trust" and not any(c.kind == "validator" for c in copies):
            self._peer_verdict(state, gate, pos, answered, wave)
            return
        if len(answered) < len(copies):
            self._release(state, gate, pos, "a check's copy got no reply")
            return
        agree_n = max(2, self.scope.policy.agree)
        policy = verify.RedundancyPolicy(
            replicas=agree_n,
            agree=agree_n,
            max_replicas=max(agree_n, self.scope.policy.max_replicas),
            rule=AgreementRule(mode=self.scope.policy.agree_mode),
        )
        replies = [self.judge._reply(f) for f in [holder, *answered]]
        decision = verify.redundant_decide(
            replies, policy, barred=gate.barred, trusted=self.judge.trusted()
        )
        if decision.outcome == "accept":
            right = verify.judgements(decision)
            self._settle(
                state,
                gate,
                pos,
                vouched=[w for w, ok in right.items() if ok],
                caught=[w for w, ok in right.items() if not ok],
                how="outvoted",
            )
            return
        involved = {r.worker_id for r in replies}
        for worker in involved:  # held until the dispute is settled, checkers too
            if self._unvouched(gate, worker):
                gate.checking.pop(worker, None)
                gate.pending[worker] = pos
        asked = len(replies) + len(copies) - len(answered)
        askable = self.judge._askable() - involved
        if decision.outcome == "more" and askable and asked < policy.max_replicas:
            self._send(state, gate, pos, "replica", involved | set(gate.barred), wave)
            return
        self._release(state, gate, pos, decision.reason or "the check did not settle")

    def _peer_verdict(
        self, state: Batch, gate: Vouches, pos: int, answered: list[Flight], wave: Wave
    ) -> None:
        """The high-trust tier's check by a peer: agreement vouches for both workers; a
        disagreement, or no reply from the peer, goes to a validator."""
        holder = state.holder(pos)
        rule = AgreementRule(mode=self.scope.policy.agree_mode)
        if answered and agree(holder.outcome.text, answered[0].outcome.text, rule):
            # Paid as checked (a validator's sample, if the judge takes one, has the last word).
            holder.verdict = answered[0].verdict = "accepted"
            self._settle(
                state,
                gate,
                pos,
                vouched=[holder.outcome.worker_id, answered[0].outcome.worker_id],
                caught=[],
                how="",
            )
            return
        for worker in {holder.outcome.worker_id} | {c.outcome.worker_id for c in answered}:
            if self._unvouched(gate, worker):  # held until the validator has spoken
                gate.checking.pop(worker, None)
                gate.pending[worker] = pos
        gate.why[pos] += (
            "; the peer disagreed: a validator decides"
            if answered
            else "; the peer gave no answer: a validator checks it"
        )
        self._validate(state, gate, pos, wave)

    def _arbitrate(self, state: Batch, gate: Vouches, pos: int, validator: Flight) -> None:
        """The high-trust tier's check: the answer, and a peer's if one checked it, against
        the validator's (its signed verdict on the answer is checked when the batch is
        judged, judging.Judge.high_trust)."""
        rule = AgreementRule(mode=self.scope.policy.agree_mode)
        vouched: list[str] = []
        caught: list[str] = []
        peers = [
            c for c in gate.early.get(pos, []) if c.kind == "replica" and c.outcome.status == "ok"
        ]
        for flight in [state.holder(pos), *peers]:
            ok = agree(flight.outcome.text, validator.outcome.text, rule)
            (vouched if ok else caught).append(flight.outcome.worker_id)
            if flight.kind == "replica":
                flight.verdict = "accepted" if ok else "rejected"
        self._settle(
            state, gate, pos, vouched=vouched, caught=caught, how="diverged from a validator"
        )

    def _settle(
        self,
        state: Batch,
        gate: Vouches,
        pos: int,
        *,
        vouched: list[str],
        caught: list[str],
        how: str,
    ) -> None:
        number = state.flights[pos].outcome.index
        for worker in caught:
            self.judge._caught(worker, f"{how} at the gate on sub-query {number}")
        gate.vouched.update(w for w in vouched if w not in gate.barred)
        self._close(gate, pos)
        self._record(state, pos, "rejected" if caught else "ok", vouched, caught, "")

    def _release(self, state: Batch, gate: Vouches, pos: int, reason: str) -> None:
        """The check cannot settle: its workers are not held back any longer, unvouched (the
        batch's judging still checks them as the tier asks)."""
        involved = self._close(gate, pos)
        gate.released.update(involved)
        self._record(state, pos, "error", [], [], reason)

    def _close(self, gate: Vouches, pos: int) -> set[str]:
        involved = {w for w, p in gate.pending.items() if p == pos}
        involved |= {w for w, p in gate.checking.items() if p == pos}
        for worker in involved:
            gate.pending.pop(worker, None)
            gate.checking.pop(worker, None)
        for worker in [w for w, p in gate.peering.items() if p == pos]:
            del gate.peering[worker]
        return involved

    def _record(
        self,
        state: Batch,
        pos: int,
        status: str,
        vouched: list[str],
        caught: list[str],
        reason: str,
    ) -> None:
        flight = state.flights[pos]
        gate = state.vouches
        assert gate is not None
        copies = gate.early.get(pos, [])
        self.emitter.instant(
            "Verify.Gate",
            parent=flight.span.span_id if flight.span else self.scope.parent,
            depth=self.scope.depth,
            status=status,
            links=[f.span.span_id for f in [state.holder(pos), *copies] if f.span],
            worker_id=state.holder(pos).outcome.worker_id or None,
            sq=flight.outcome.index,
            tier="gate",
            answer=gate.nth.get(pos),
            checkers=[c.outcome.worker_id for c in copies if c.outcome.worker_id],
            vouched=sorted(vouched),
            caught=sorted(caught),
            why=gate.why.get(pos, ""),
            reason=reason
            or (
                f"caught lying: {', '.join(w[:12] for w in sorted(caught))}"
                if caught
                else "the answers agreed: their workers get work again"
            ),
        )

    # --- helpers -----------------------------------------------------------------------
    def _send(
        self, state: Batch, gate: Vouches, pos: int, kind: str, tried: set[str], wave: Wave
    ) -> Flight:
        copy = self.judge._copy(state, pos, kind, tried)
        gate.early.setdefault(pos, []).append(copy)
        gate.copies[id(copy)] = pos
        self.tally.add_extra(kind)
        self.enqueue([copy], wave)
        return copy

    def _validate(self, state: Batch, gate: Vouches, pos: int, wave: Wave) -> None:
        """A trusted validator re-runs the sub-query; its signed verdict on the answer is
        checked with the batch (judging.Judge.high_trust)."""
        holder = state.holder(pos)
        copy = self._send(state, gate, pos, "validator", {holder.outcome.worker_id}, wave)
        copy.venues, copy.judged = self.judge.validator_venues(), holder

    @staticmethod
    def _all_out(gate: Vouches, wave: Wave) -> bool:
        """Whether every answer of the batch has been sent: a worker's answers still to come
        are its last of the batch."""
        return not any(id(f) in gate.positions for f in wave.backlog)

    def _unvouched(self, gate: Vouches, worker: str) -> bool:
        w = self.roster.workers.get(worker)
        return bool(worker and w is not None and gate.holds(worker, bool(w.get("trusted"))))

    def _settled(self, worker: str) -> bool:
        """Past its warm-up (check_warmup checks passed in a row), not suspect, not caught in
        the run: a worker the gate may check at a drawn answer, and a peer on high trust."""
        record = self.judge.reputations.get(worker)
        return (
            worker not in self.judge.caught
            and not record.suspect
            and record.consecutive_valid >= self.scope.policy.check_warmup
        )

    def _validator_due(self, worker: str) -> str:
        """Why `worker`'s answer must have a validator's check at the high-trust gate, or
        "" when a settled peer's will do: it is new, suspect, or its floor check falls in
        this batch (its sampler credit as read when the batch began, Vouching._read_credit)."""
        policy = self.scope.policy
        record = self.judge.reputations.get(worker)
        if worker in self.judge.caught or record.suspect:
            return "suspect: the worker was caught lying recently"
        if record.consecutive_valid < policy.check_warmup:
            return f"new worker: {record.consecutive_valid} of {policy.check_warmup} checks passed"
        assert self.judge.sampler is not None
        if self.judge.sampler.due(worker, policy.check_floor, self._expected.get(worker, 0.0)):
            return f"its floor check ({100 * policy.check_floor:g}% of its answers) is due"
        return ""

    def _peer(self, gate: Vouches, worker: str) -> str | None:
        """A settled untrusted worker to check `worker`'s answer on the high-trust tier:
        past its warm-up, not suspect, not caught, checking no other answer already (a liar
        picked for several at once answers each before its first lie is found), and
        itself unchecked in the batch so far, so that its answer to the copy checks it too,
        and with no validator's check due (that check would be made of it anyway).
        None when there is no such worker: then a validator checks the answer, for the same
        one copy, and its check counts toward the worker's floor, where a copy to a worker
        checked already would check one worker only, and not for the floor."""
        peers = sorted(
            wid
            for wid, w in self.roster.workers.items()
            if wid != worker
            and not w.get("trusted")
            and w["venue"] in self.scope.answer_venues
            and wid not in gate.barred
            and wid not in gate.peering
            and self._settled(wid)
        )
        fresh = [
            w
            for w in peers
            if self._unvouched(gate, w)
            and w not in gate.pending
            and w not in gate.checking
            and not self._validator_due(w)
        ]
        return self.judge.rng.choice(fresh) if fresh else None

    def _partner(self, gate: Vouches, worker: str) -> str | None:
        """Who checks `worker`'s answer: an untrusted worker not vouched for yet and not in
        a check already (its answer checks it too), else another worker not in a check,
        else any other worker a copy may go to."""
        everyone = sorted(self.judge._askable() - {worker})
        # Not a worker caught lying lately (in an earlier run): its answer vouches for no
        # one, and a turncoat kept off work took a check in most runs after its turn.
        reputations = self.judge.reputations
        askable = [w for w in everyone if not reputations.get(w).suspect] or everyone
        # One check at a time each: a liar picked for several at once answered each of
        # them before its first lie was found (bench/trust.py's turncoat: 4 copies).
        free = [w for w in askable if w not in gate.pending and w not in gate.checking]
        fresh = [w for w in free if self._unvouched(gate, w)]
        pool = fresh or free or askable
        return self.judge.rng.choice(pool) if pool else None
