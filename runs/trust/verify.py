"""Verification of sub-query replies from workers nobody vouches for (issue 6).

Plain functions and small value types that a fanout calls; nothing here dispatches, emits
or touches Redis. What is here:

- agreement between two replies under a rule: exact (whitespace and case folded), numeric
  (the one number in a short answer, within a tolerance), or text similarity (token-set
  Jaccard over a threshold), defined in workers.agreement and re-exported here;
- the redundant tier's decision over the replies of one sub-query: accept, wait, dispatch
  more replicas, or unresolved (BOINC's "never agreed" outcome: never a guess);
- (objective checks, a JSON schema, a regex or a function, are in runs.trust.objective;)
- the adaptive replication gate (BOINC's trust gate) and the per-run tally of extra
  sub-queries spent on verification.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, TypedDict

from frlm_web.money import ZERO, money_str

# Agreement lives with the workers (a validator worker judges with it too, and workers do
# not import runs); its names stay importable from here for the conductor and the fanout.
from workers.agreement import AgreementRule, agree

# --- the redundant tier --------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One worker's returned answer to a sub-query. span_id is the reply's span, so the
    Verify event can link the spans it judged."""

    worker_id: str
    venue: str
    text: str
    span_id: str = ""


@dataclass(frozen=True)
class Assignment:
    """A replica dispatched and not yet returned."""

    worker_id: str
    venue: str


@dataclass(frozen=True)
class RedundancyPolicy:
    """Send `replicas` (M) copies to distinct workers, accept when `agree` (N) of them give
    the same answer under `rule`, add replicas on disagreement up to `max_replicas` in all,
    then give up as unresolved."""

    replicas: int = 2
    agree: int = 2
    max_replicas: int = 5
    rule: AgreementRule = field(default_factory=AgreementRule)

    def __post_init__(self) -> None:
        if not 1 <= self.agree <= self.replicas <= self.max_replicas:
            raise ValueError(
                "redundancy policy: need 1 <= agree <= replicas <= max_replicas, got "
                f"agree={self.agree}, replicas={self.replicas}, max_replicas={self.max_replicas}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RedundancyPolicy:
        """From user input such as {"replicas": 3, "agree": 2, "mode": "numeric",
        "abs_tol": 0.5}; ValueError names what is wrong."""
        data = dict(data)
        rule_keys = {"mode", "rel_tol", "abs_tol", "threshold"}
        known = {"replicas", "agree", "max_replicas"} | rule_keys
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"redundancy policy: unknown setting(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        try:
            rule = AgreementRule(
                **{k: (v if k == "mode" else float(v)) for k, v in data.items() if k in rule_keys}
            )
            counts = {k: int(v) for k, v in data.items() if k not in rule_keys}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"redundancy policy: {exc}") from exc
        return cls(rule=rule, **counts)


class RedundantAttrs(TypedDict):
    """What a Verify.Redundant event carries (its links are Decision.links)."""

    tier: str
    outcome: str
    mode: str
    text: str | None
    agreed: list[str]
    disagreed: list[str]
    replies: int
    pending: int
    dispatch: int
    groups: list[list[str]]
    reason: str


@dataclass(frozen=True)
class Decision:
    """The redundant tier's verdict on one sub-query.

    outcome "accept": `text` is the answer (the first reply of the winning group, as the
    worker wrote it), `agreed` the workers who gave it, `disagreed` those who did not;
    "wait": replicas in flight can still settle it, dispatch nothing;
    "more": dispatch `dispatch` more replicas, to workers not in `avoid_workers`, preferring
    venues not in `avoid_venues` where the run has others;
    "unresolved": the replicas never agreed and the limit is reached (or agreement can no
    longer be reached within it). The sub-query has no answer; nothing is guessed.
    """

    outcome: Literal["accept", "wait", "more", "unresolved"]
    text: str | None = None
    agreed: tuple[str, ...] = ()
    disagreed: tuple[str, ...] = ()
    dispatch: int = 0
    avoid_workers: frozenset[str] = frozenset()
    avoid_venues: frozenset[str] = frozenset()
    groups: tuple[tuple[str, ...], ...] = ()
    links: tuple[str, ...] = ()
    replies: int = 0
    pending: int = 0
    mode: str = "exact"
    reason: str = ""

    def attrs(self) -> RedundantAttrs:
        return {
            "tier": "redundant",
            "outcome": self.outcome,
            "mode": self.mode,
            "text": self.text,
            "agreed": list(self.agreed),
            "disagreed": list(self.disagreed),
            "replies": self.replies,
            "pending": self.pending,
            "dispatch": self.dispatch,
            "groups": [list(g) for g in self.groups],
            "reason": self.reason,
        }


def _support(replies: Sequence[Reply], rule: AgreementRule) -> list[set[int]]:
    """For each reply, the indices of the replies that agree with it (itself included).
    Similarity is not transitive, so each reply is the centre of its own group."""
    n = len(replies)
    support = [{i} for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if agree(replies[i].text, replies[j].text, rule):
                support[i].add(j)
                support[j].add(i)
    return support


def _groups(replies: Sequence[Reply], support: list[set[int]]) -> tuple[tuple[str, ...], ...]:
    """Replies grouped by answer for the trace: each reply joins the first earlier group
    whose centre it agrees with."""
    centres: list[int] = []
    members: list[list[str]] = []
    for i, reply in enumerate(replies):
        for g, centre in enumerate(centres):
            if i in support[centre]:
                members[g].append(reply.worker_id)
                break
        else:
            centres.append(i)
            members.append([reply.worker_id])
    return tuple(tuple(m) for m in members)


def _voters(replies: Sequence[Reply], barred: Collection[str]) -> set[int]:
    """The indices of the replies that vote: each worker's first, none of a barred one's."""
    seen: set[str] = set()
    voters: set[int] = set()
    for i, reply in enumerate(replies):
        if reply.worker_id not in seen and reply.worker_id not in barred:
            voters.add(i)
        seen.add(reply.worker_id)
    return voters


def redundant_decide(
    replies: Sequence[Reply],
    policy: RedundancyPolicy,
    pending: Sequence[Assignment] = (),
    barred: Collection[str] = frozenset(),
    trusted: Collection[str] = frozenset(),
) -> Decision:
    """Decide one sub-query of the redundant tier from the replies so far and the replicas
    still in flight. Call it after each reply (or each batch of them).

    A group wins when it has at least N votes and strictly more than any answer outside
    it: a tie between two answers is disagreement, settled by one more replica, not by a
    coin. A vote is a worker's first reply: a worker whose copy came back to it again (a
    swarm with fewer workers than replicas) does not vote twice, and a worker in `barred`
    (caught lying earlier in the run) does not vote at all, though it is still judged
    wrong when it disagrees with the accepted answer. A tie with a worker of `trusted` (a
    trusted venue's, vouched for by its operator) on one side and none on the other is
    that side's: with one stranger and one trusted worker there may be nobody else to ask,
    and the stranger's word must not stand level with the operator's. Replicas are counted
    against max_replicas whether returned or in flight."""
    rule = policy.rule
    dispatched = len(replies) + len(pending)
    used_workers = frozenset([r.worker_id for r in replies] + [p.worker_id for p in pending])
    used_venues = frozenset([r.venue for r in replies] + [p.venue for p in pending])
    room = policy.max_replicas - dispatched
    common: dict[str, Any] = {
        "avoid_workers": used_workers,
        "avoid_venues": used_venues,
        "links": tuple(r.span_id for r in replies if r.span_id),
        "replies": len(replies),
        "pending": len(pending),
        "mode": rule.mode,
    }
    if not replies:
        if pending:
            return Decision("wait", reason="no reply yet", **common)
        return Decision(
            "more",
            dispatch=min(policy.replicas, policy.max_replicas),
            reason="first replicas",
            **common,
        )

    support = _support(replies, rule)
    common["groups"] = _groups(replies, support)
    voters = _voters(replies, barred)
    votes = [support[i] & voters for i in range(len(replies))]
    # The best centre: most votes, then the earliest reply.
    best = max(voters, key=lambda i: (len(votes[i]), -i), default=None)
    winners = votes[best] if best is not None else set()
    rival = max((len(votes[j]) for j in voters if j not in winners), default=0)
    agreed = tuple(replies[i].worker_id for i in sorted(winners))
    disagreed = tuple(
        dict.fromkeys(
            r.worker_id
            for i, r in enumerate(replies)
            if r.worker_id not in agreed
            and (i in voters or r.worker_id in barred)
            and (best is None or i not in support[best])
        )
    )

    if len(winners) >= policy.agree and len(winners) > rival:
        return Decision(
            "accept",
            text=replies[min(winners)].text,
            agreed=agreed,
            disagreed=disagreed,
            reason=f"{len(winners)} of {len(replies)} agree",
            **common,
        )

    tie = _trusted_tie(replies, support, votes, voters, barred, trusted)
    if tie is not None:
        backed, against = tie
        return Decision(
            "accept",
            text=replies[backed].text,
            agreed=tuple(replies[i].worker_id for i in sorted(votes[backed])),
            disagreed=_dissent(replies, support[backed], voters, barred),
            reason=f"{len(votes[backed])} against {against}: a trusted worker's answer",
            **common,
        )

    # The fewest further agreeing replies that would make the best group win.
    shortfall = max(policy.agree - len(winners), rival + 1 - len(winners))
    if shortfall > len(pending) + room:
        return Decision(
            "unresolved",
            agreed=(),
            disagreed=tuple(r.worker_id for r in replies),
            reason=(
                f"no answer reached {policy.agree} agreeing replies out of "
                f"{policy.max_replicas} at most ({len(common['groups'])} different answers in "
                f"{len(replies)} replies)"
            ),
            **common,
        )
    want = max(shortfall - len(pending), policy.replicas - dispatched)
    if want <= 0:
        return Decision("wait", reason=f"{len(pending)} replicas in flight may settle it", **common)
    return Decision(
        "more",
        dispatch=min(want, room),
        reason=(
            f"best answer has {len(winners)} of {policy.agree} needed"
            + (f", {rival} for a different one" if rival else "")
        ),
        **common,
    )


def trusted_alone(
    replies: Sequence[Reply],
    rule: AgreementRule,
    barred: Collection[str] = frozenset(),
    trusted: Collection[str] = frozenset(),
) -> Decision | None:
    """With no other worker left to ask (the caller knows), a trusted worker's answer that
    no vote disagrees with stands unchecked: its operator vouches for it, and a sampled
    check of it that cannot be made must not cost the run its answer. None otherwise."""
    voters = _voters(replies, barred)
    if not voters or any(replies[i].worker_id not in trusted for i in voters):
        return None
    support = _support(replies, rule)
    centre = min(voters)
    if not voters <= support[centre]:
        return None
    return Decision(
        "accept",
        text=replies[centre].text,
        agreed=(),  # unchecked: no one is credited with agreement, the answer stays unverified
        disagreed=_dissent(replies, support[centre], voters, barred),
        links=tuple(r.span_id for r in replies if r.span_id),
        replies=len(replies),
        mode=rule.mode,
        groups=_groups(replies, support),
        reason="a trusted worker's answer, unchecked: no other live worker to ask",
    )


def _dissent(
    replies: Sequence[Reply], group: set[int], voters: set[int], barred: Collection[str]
) -> tuple[str, ...]:
    """The workers judged wrong when the answer of `group` (reply indices) is accepted:
    each voter outside it, and each worker caught lying earlier whose reply is outside it."""
    return tuple(
        dict.fromkeys(
            r.worker_id
            for i, r in enumerate(replies)
            if (i in voters or r.worker_id in barred) and i not in group
        )
    )


def _trusted_tie(
    replies: Sequence[Reply],
    support: list[set[int]],
    votes: list[set[int]],
    voters: set[int],
    barred: Collection[str],
    trusted: Collection[str],
) -> tuple[int, str] | None:
    """The centre of the group a trusted worker's reply holds, when the votes tie with it
    on one side: every trusted voter is in it, and no other answer has more votes (a worker
    caught lying, who has none, opposes it with one); and who is against it, said."""
    mine = [i for i in sorted(voters) if replies[i].worker_id in trusted]
    if not mine:
        return None
    centre = mine[0]
    group = votes[centre]
    if not set(mine) <= group:
        return None  # trusted workers disagree among themselves: votes (or more) decide
    others = max((len(votes[j]) for j in voters if j not in group), default=0)
    if others:
        return (centre, str(others)) if len(group) >= others else None
    if any(r.worker_id in barred and i not in support[centre] for i, r in enumerate(replies)):
        return centre, "a worker caught lying"
    return None


def judgements(decision: Decision) -> dict[str, bool]:
    """Whose result was valid, for reputation and the consecutive-valid count: on accept,
    the workers who agreed were right and the others wrong. Waiting, dispatching more and
    unresolved judge nobody: with no accepted answer there is nothing to be right against."""
    if decision.outcome != "accept":
        return {}
    return {**{w: False for w in decision.disagreed}, **{w: True for w in decision.agreed}}


# --- adaptive replication ------------------------------------------------------------------

# Consecutive valid results a worker needs before it may go unreplicated (BOINC's gate).
TRUST_AFTER = 10


def should_replicate(consecutive_valid: int, rng: random.Random) -> bool:
    """Whether to replicate a sub-query sent to a worker with this consecutive-valid count:
    always below TRUST_AFTER, then with probability 1/count (slow to earn: a worker at 10 is
    still checked one time in ten, at 100 one in a hundred)."""
    if consecutive_valid < TRUST_AFTER:
        return True
    return rng.random() < 1.0 / consecutive_valid


@dataclass(frozen=True)
class CheckRule:
    """How often a worker nobody vouches for is checked (issue 23). Below `warmup` passed
    checks it is new: every answer is checked (and it is sent probes), so a cold swarm
    starts with evidence. Past it, at `floor`, however long its record: a worker that
    turns liar after a long good record is caught within 1/floor answers. (BOINC's 1/count
    decline from the warm-up to the floor cost an honest swarm 10% in checks for no
    safety the floor does not give.)"""

    floor: float = 0.03  # policy.check_floor's default
    warmup: int = TRUST_AFTER
    new_rate: float = 1.0  # the rate below warmup (the high-trust tier's validate_rate)

    def rate(self, consecutive_valid: int, *, suspect: bool = False) -> float:
        if suspect:
            return 1.0
        if consecutive_valid < self.warmup:
            return self.new_rate
        return self.floor

    def counts(self, consecutive_valid: int, *, suspect: bool = False) -> bool:
        """Whether a check made outside the sample (the gate's, a passed probe) counts
        toward the worker's floor (Sampler.spend): only once it is sampled at a rate under
        1. While every answer of it is checked anyway (new, suspect), spending would leave
        its credit at -1 and the worker 2/floor answers without a floor check after its
        warm-up, not 1/floor."""
        return self.rate(consecutive_valid, suspect=suspect) < 1.0

    def why(self, consecutive_valid: int, *, suspect: bool = False) -> str:
        """The reason recorded on the span for checking an answer at this rate."""
        if suspect:
            return "suspect: the worker was caught lying recently"
        if consecutive_valid < self.warmup:
            return f"new worker: {consecutive_valid} of {self.warmup} checks passed"
        return f"sampled at the floor of {100 * self.floor:g}%"


class Sampler:
    """Which answers of each worker are checked, at the rate CheckRule gives: systematic
    sampling per worker, not a coin per answer. Each worker's credit grows by its rate per
    answer and an answer is checked when it reaches 1, so a worker at 5% is never more than
    20 answers without a check; the credit starts at a random phase the worker cannot
    know, so it cannot tell which of its answers will be checked.

    The credit outlives the run when `client` is given: `load` reads it from the worker's
    reputation hash before a batch is judged and `save` writes it back, so the bound holds
    across runs. With a fresh phase per run, a worker with a few answers in each of many
    small runs went unchecked for a geometric number of runs (a turncoat got 16 lies in
    past a 5% floor)."""

    FIELD = "check_credit"  # in the worker's reputation hash (workers.reputation.rep_key)

    def __init__(self, rng: random.Random, client: Any = None) -> None:
        self._rng = rng
        self._client = client
        self._credit: dict[str, float] = {}

    def load(self, worker_ids: Sequence[str]) -> None:
        """Each worker's credit as the fleet last left it (one round trip)."""
        from workers.reputation import rep_key

        ids = sorted({w for w in worker_ids if w})
        if self._client is None or not ids:
            return
        pipe = self._client.pipeline(transaction=False)
        for wid in ids:
            pipe.hget(rep_key(wid), self.FIELD)
        for wid, raw in zip(ids, pipe.execute(), strict=True):
            try:
                credit = float(raw) if raw is not None else None
            except ValueError:
                credit = None
            if credit is not None and -1.0 <= credit < 1.0:
                self._credit[wid] = credit

    def save(self) -> None:
        """Write every worker's credit back (one round trip)."""
        from workers.reputation import rep_key

        if self._client is None or not self._credit:
            return
        pipe = self._client.pipeline(transaction=False)
        for wid, credit in self._credit.items():
            pipe.hset(rep_key(wid), self.FIELD, repr(credit))
        pipe.execute()

    def spend(self, worker_id: str) -> None:
        """A check of the worker made outside the sample (the check gate's,
        runs/engine/fanout/vouching.py) counts toward its rate: its credit falls by one,
        to no less than -1, so the sample passes over it that much longer. A worker with a
        few answers per batch is then checked once per batch, not once more at the floor."""
        self._credit[worker_id] = max(-1.0, self._credit_of(worker_id) - 1.0)

    def due(self, worker_id: str, rate: float, answers: float) -> bool:
        """Whether `worker_id`'s sampled check falls among its next `answers` answers at
        `rate`, as its credit stands (a peek: nothing is spent). The high-trust gate
        (runs/engine/fanout/vouching.py) makes that check a validator's; a worker whose
        check is not due is checked by a peer instead."""
        if rate >= 1.0 or rate <= 0.0:
            return rate >= 1.0
        return self._credit_of(worker_id) + rate * answers >= 1.0

    def take(self, worker_id: str, rate: float) -> bool:
        if rate >= 1.0 or rate <= 0.0:
            return rate >= 1.0
        credit = self._credit_of(worker_id) + rate
        checked = credit >= 1.0
        self._credit[worker_id] = credit - 1.0 if checked else credit
        return checked

    def _credit_of(self, worker_id: str) -> float:
        """The worker's credit; a worker not seen before starts at a random phase."""
        credit = self._credit.get(worker_id)
        if credit is None:
            credit = self._credit[worker_id] = self._rng.random()
        return credit


COVER_WHY = "cover: every untrusted worker takes part in a check of each batch"


@dataclass(frozen=True)
class Cover:
    """What `cover` adds to a batch's checks: positions to check besides the sampled ones,
    and the worker the first copy of a checked position goes to."""

    extra: list[int]
    pins: dict[int, str]


def cover(
    owners: dict[int, str],
    untrusted: Collection[str],
    checked: Sequence[int],
    checkers: Collection[str],
    rng: random.Random,
) -> Cover:
    """Every untrusted worker that answered in a batch takes part in at least one check of
    it: one of its answers is copied, or the copy of another worker's answer goes to it.
    Either way a worker that has turned liar is caught in the first batch it lies in (it
    cannot tell a copy from work), and its other answers of the batch are corrected before
    they go back, instead of waiting up to 1/check_floor answers for the sampler.

    A copy checks both workers at once, so the sampled checks (`checked`, positions of
    `owners`) are sent first to workers not yet covered, then the workers left are paired:
    one's answer goes to the other. With 4% sampled, a batch of 64 over 8 workers is
    covered by the sampled checks alone most of the time; at most one copy per two
    workers is added. `checkers` are the workers a copy may go to."""
    by_worker: dict[str, list[int]] = {}
    for pos, worker in sorted(owners.items()):
        if worker in untrusted:
            by_worker.setdefault(worker, []).append(pos)
    covered = {owners[pos] for pos in checked if pos in owners}
    left = [w for w in sorted(by_worker) if w not in covered]
    rng.shuffle(left)
    pins: dict[int, str] = {}

    def checker(owner: str) -> str | None:
        for worker in left:
            if worker != owner and worker in checkers:
                left.remove(worker)
                return worker
        return None

    for pos in checked:
        target = checker(owners.get(pos, ""))
        if target is not None:
            pins[pos] = target
    extra: list[int] = []
    while left:
        worker = left.pop()
        pos = rng.choice(by_worker[worker])
        extra.append(pos)
        target = checker(worker)
        if target is not None:
            pins[pos] = target
    return Cover(sorted(extra), pins)


def should_validate(
    agreeing_counts: Sequence[int],
    rng: random.Random,
    *,
    untrusted_rate: float = 0.5,
    trusted_rate: float = 0.02,
    suspect: bool = False,
) -> bool:
    """Whether a validator should re-run an accepted answer (the high-trust tier's sample),
    given the consecutive-valid counts of the workers whose word it rests on. Colluding
    liars agree with each other, so an answer vouched for only by workers that have not
    passed the trust gate is sampled often; one a trusted worker vouches for, rarely.
    A `suspect` answer (a validator has recently caught one of its workers) is always
    re-run: a caught liar's word is worth nothing until its record mends."""
    if not (0.0 <= untrusted_rate <= 1.0 and 0.0 <= trusted_rate <= 1.0):
        raise ValueError("sampling rates are fractions between 0 and 1")
    if suspect:
        return True
    trusted = any(count >= TRUST_AFTER for count in agreeing_counts)
    return rng.random() < (trusted_rate if trusted else untrusted_rate)


def consecutive_valid_after(count: int, valid: bool) -> int:
    """The count after one judged result: one more when valid, back to 0 when not (fast to
    lose). The fleet's live count is kept in Redis by workers.reputation (an Observation
    with agreement or validation set); this is the same rule for in-process use (tests,
    simulations)."""
    return count + 1 if valid else 0


# --- verification overhead per run ---------------------------------------------------------


class OverheadFigures(TypedDict):
    primary: int
    extra: int
    by_kind: dict[str, int]
    overhead: float  # extra / primary: plain two-fold replication is 1.0
    share: float  # extra / (primary + extra): the part of all sub-queries spent verifying
    cost: str  # dollars the extra sub-queries cost, as their workers reported it (money_str)
    cost_by_kind: dict[str, str]


class VerificationTally:
    """Counts a run's sub-queries: the primary ones (one per question the program asked)
    and the extra ones spent on verification, by kind (replica, validator, recheck, probe),
    and what the extra ones cost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._primary = 0
        self._extra: dict[str, int] = {}
        self._cost: dict[str, Decimal] = {}

    def add_cost(self, kind: str, dollars: Decimal) -> None:
        with self._lock:
            self._cost[kind] = self._cost.get(kind, ZERO) + dollars

    def add_primary(self, n: int = 1) -> None:
        with self._lock:
            self._primary += n

    def add_extra(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._extra[kind] = self._extra.get(kind, 0) + n

    def figures(self) -> OverheadFigures:
        with self._lock:
            extra = sum(self._extra.values())
            total = self._primary + extra
            return {
                "primary": self._primary,
                "extra": extra,
                "by_kind": dict(self._extra),
                "overhead": extra / self._primary if self._primary else 0.0,
                "share": extra / total if total else 0.0,
                "cost": money_str(sum(self._cost.values(), ZERO)),
                "cost_by_kind": {k: money_str(v) for k, v in self._cost.items()},
            }
