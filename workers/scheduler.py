"""Where each sub-query runs: the worker whose expected finish, weighed by reputation,
price and load, is soonest.

The backlog is planned as a whole, earliest-finish-time first: each job goes, in order, to
the worker that would finish it first given the jobs already ahead of it there. A job whose
best worker has no free credit waits at the conductor for it, instead of going to a slow
worker now; a slow worker gets work only when the fast ones are so far behind that it would
finish sooner. A little exploration keeps the estimates of unused workers honest: each job
is explored or not once, by its own draw, however many plans it waits through.

Where the fanout says which of its jobs already run on a worker and for how long, the
plan follows that worker's slots one by one (when each frees, which job it takes next)
instead of a fluid average. That matters at a batch's tail: a worker slightly ahead of
the others would otherwise be handed one more round than its share, and the batch would
wait a whole sub-query for its last slot while the others stand idle.

Pure functions over plain data: the fanout gathers the inputs, this decides, the trace
records the decision and its inputs."""

from __future__ import annotations

import dataclasses
import heapq
import random
from dataclasses import dataclass, field
from typing import TypedDict

# Planning deeper than a few rounds of every worker's credit changes no decision made now.
PLAN_ROUNDS = 4
DEFAULT_LATENCY_MS = 1000.0


@dataclass
class Candidate:
    worker_id: str
    venue: str
    queue: str
    concurrency: int
    credit: int  # jobs this fanout may have in flight there: slots plus a small margin
    inflight: int = 0  # this fanout's unsettled jobs there
    latency_ms: float | None = None  # expected latency (EWMA), None when never measured
    load: float = 0.0  # the worker's own load from its heartbeat, 0 (idle) to 1 (full)
    price: float = 0.0  # estimated cost of a typical sub-query there, in dollars
    reputation: float = 1.0  # workers.reputation.Reputation.score
    models: list[str] = field(default_factory=list)  # [] serves any
    context_tokens: int = 1 << 30
    allowed: bool = True  # its circuit breakers let work through
    # How long each of this fanout's jobs known to have started there has run, in ms;
    # the rest of `inflight` waits in its queue. None: unknown (planned as a fluid).
    running_ms: list[float] | None = None
    # Work jobs (Need.work) it may still be given, whatever its credit: a worker held back
    # until one of its answers is checked (runs/engine/fanout/vouching.py). None: no limit.
    work_room: int | None = None
    explorable: bool = True  # exploration may pick it (not a worker caught lying lately)
    trusted: bool = False  # of a trusted venue: its price is the operator's, never cut

    @property
    def free(self) -> int:
        return self.credit - self.inflight


@dataclass(frozen=True)
class Weights:
    latency: float = 1.0
    reputation: float = 2.0  # exponent on the reputation score
    price: float = 0.5
    load: float = 0.2
    explore: float = 0.05  # share of sub-queries sent to a random eligible worker
    min_reputation: float = 0.2  # below it a worker gets work only by exploration
    # A worker priced above this many times the cheapest priced worker that may take work
    # gets none, exploration included (0: no limit). Within it price only weighs: a
    # stranger naming a price a thousand times the others' was penalised 1.5x at most,
    # took half a run and was paid its price (a review: $87,041 for one run).
    max_price_ratio: float = 10.0


@dataclass(frozen=True)
class Need:
    """What one sub-query asks of a worker."""

    tokens: int = 0  # estimated prompt tokens
    model: str = ""
    avoid: frozenset[str] = frozenset()  # workers that already failed it
    venues: frozenset[str] = frozenset()  # where it may run; empty: anywhere
    # The job's own draw in [0, 1) for exploration, made once when it joined the backlog:
    # a job that waits for a busy worker is planned again after every reply, and a fresh
    # draw each time would explore nearly every waiting job. None: draw now.
    roll: float | None = None
    # Jobs with the same group (copies of one sub-query made to be judged against each
    # other) go to distinct workers, within a plan as across plans: a worker answering
    # twice would be one vote twice.
    group: int | None = None
    work: bool = False  # an answer, not a copy or probe: it counts against work_room


class Route(TypedDict, total=False):
    """The decision recorded on a SubQuery.Submit span."""

    worker: str
    venue: str
    how: str  # "score" | "explore"
    eta_ms: float
    score: float
    reputation: float
    load: float
    price: float
    inflight: int
    credit: int
    runner_up: str
    runner_up_score: float


class Assignment(TypedDict):
    index: int  # position in the backlog
    worker_id: str
    route: Route


def _eta(c: Candidate, ahead: int, latency: float) -> float:
    """When a job finishes there if `ahead` jobs are ahead of it: each slot runs one at a time."""
    waiting = max(0, ahead - c.concurrency + 1)
    return latency * (1 + waiting / max(1, c.concurrency))


class _Queue:
    """A candidate's queue as the plan fills it: when the next job sent there would end."""

    def __init__(self, c: Candidate, latency: float, factor: float) -> None:
        self.c = c
        self.latency = latency  # expected ms of one job there
        self.factor = factor  # the same, weighed by load, price and reputation
        self.ahead = c.inflight
        self.sending = 0
        self.slots: list[float] | None = None  # ms from now until each slot is free
        if c.running_ms is not None:
            running = sorted(max(0.0, latency - ran) for ran in c.running_ms)
            self.slots = running[: c.concurrency] + [0.0] * max(0, c.concurrency - len(running))
            heapq.heapify(self.slots)
            for _ in range(max(0, c.inflight - len(running))):  # queued: they start first
                heapq.heapreplace(self.slots, self.slots[0] + latency)

    def eta_ms(self) -> float:
        if self.slots is None:
            return _eta(self.c, self.ahead, self.latency)
        return self.slots[0] + self.latency

    def score(self) -> float:
        if self.slots is None:
            return _eta(self.c, self.ahead, self.factor)
        return self.eta_ms() * self.factor / self.latency

    def add(self) -> None:
        """One more job queued there (planned, sent or waiting for its credit)."""
        self.ahead += 1
        if self.slots is not None:
            heapq.heapreplace(self.slots, self.slots[0] + self.latency)

    @property
    def open(self) -> bool:
        return self.c.free - self.sending > 0


def free_credit(candidates: list[Candidate]) -> int:
    """Jobs the workers allowed work may still be sent now: a plan places no more."""
    return sum(max(0, c.free) for c in candidates if c.allowed)


def priced_within(candidates: list[Candidate], ratio: float) -> list[Candidate]:
    """The candidates but the untrusted ones priced above `ratio` times the cheapest
    priced one (a free worker, price 0, sets no bar: its hardware is its own; a trusted
    venue's price is the operator's own). `ratio` 0: all of them."""
    priced = [c.price for c in candidates if c.price > 0]
    if not ratio or not priced:
        return candidates
    bar = ratio * min(priced)
    return [c for c in candidates if c.trusted or c.price <= bar]


def plan(
    candidates: list[Candidate],
    needs: list[Need],
    weights: Weights,
    rng: random.Random,
) -> list[Assignment]:
    """The jobs of the backlog (`needs`, in order) that should be sent now, and where."""
    eligible = priced_within([c for c in candidates if c.allowed], weights.max_price_ratio)
    # Every reply frees a credit and asks for a plan: most plans have one or two jobs to
    # place, so planning stops as soon as no credit is left.
    credits = free_credit(eligible)
    if not credits or not needs:
        return []
    known = sorted(c.latency_ms for c in eligible if c.latency_ms)
    prior = known[len(known) // 2] if known else DEFAULT_LATENCY_MS
    top_price = max((c.price for c in eligible), default=0.0) or 1.0

    def factor(c: Candidate) -> float:
        """Everything but the queue: latency estimate, load, price, reputation."""
        base = (c.latency_ms or prior) * weights.latency
        base *= 1 + weights.load * min(max(c.load, 0.0), 1.0) + weights.price * c.price / top_price
        return base / max(c.reputation, 1e-3) ** weights.reputation

    good = [c for c in eligible if c.reputation >= weights.min_reputation]
    queues = {c.worker_id: _Queue(c, c.latency_ms or prior, factor(c)) for c in eligible}
    # Ties go to the worker with the fewest jobs ahead: alike workers take a batch's first
    # jobs in turn, so each starts its first wave as soon as the batch is sent.
    heap = [(queues[c.worker_id].score(), c.inflight, i) for i, c in enumerate(good)]
    heapq.heapify(heap)
    depth = PLAN_ROUNDS * sum(c.credit for c in eligible)
    out: list[Assignment] = []
    taken: dict[int, set[str]] = {}  # group -> workers its jobs went to in this plan
    room = {c.worker_id: c.work_room for c in eligible if c.work_room is not None}
    full = frozenset(w for w, left in room.items() if left <= 0)  # no more work there
    for index, need in enumerate(needs[:depth]):
        if len(out) >= credits:
            break
        if need.group is not None and need.group in taken:
            need = dataclasses.replace(need, avoid=need.avoid | taken[need.group])
        unheld = need
        if need.work and full:
            need = dataclasses.replace(need, avoid=need.avoid | full)
        roll = rng.random() if need.roll is None else need.roll
        if weights.explore and roll < weights.explore:
            # The job's own draw names the worker it explores, among every one it fits,
            # busy or not: each gets explore/N of the work. Choosing among the open ones
            # only gave nearly all exploration to the one worker the others leave idle, a
            # liar kept off by its reputation (5% of the traffic, its share never fell).
            fits = sorted(
                (c for c in eligible if c.explorable and _fits(c, need)),
                key=lambda c: c.worker_id,
            )
            if fits:
                pick = queues[
                    fits[min(len(fits) - 1, int(roll / weights.explore * len(fits)))].worker_id
                ]
                if pick.open:
                    out.append(_assign(index, pick, "explore", None))
                    _take(taken, need, pick.c.worker_id)
                    full = _room_taken(room, full, need, pick.c.worker_id)
                    pick.add()
                    pick.sending += 1
                    continue
        at, runner_up = _pop_best(heap, good, need)
        if at is None:
            if unheld is not need and any(_fits(c, unheld) for c in good):
                continue  # a good worker held back for now takes it once it is vouched for
            # Only workers below the reputation gate (or that failed it) can take it.
            fits = sorted((c for c in eligible if _fits(c, need)), key=lambda c: factor(c))
            if not fits:
                continue
            chosen = queues[fits[0].worker_id]
            if not chosen.open:
                continue
            assignment = _assign(index, chosen, "score", runner_up)
            chosen.add()
        else:
            chosen = queues[good[at].worker_id]
            assignment = _assign(index, chosen, "score", runner_up)
            chosen.add()
            heapq.heappush(heap, (chosen.score(), chosen.ahead, at))
            if not chosen.open:
                continue  # its best worker is busy: the job waits for it at the conductor
        chosen.sending += 1
        out.append(assignment)
        _take(taken, need, chosen.c.worker_id)
        full = _room_taken(room, full, need, chosen.c.worker_id)
    return out


def _take(taken: dict[int, set[str]], need: Need, worker_id: str) -> None:
    if need.group is not None:
        taken.setdefault(need.group, set()).add(worker_id)


def _room_taken(
    room: dict[str, int], full: frozenset[str], need: Need, worker: str
) -> frozenset[str]:
    """One work job fewer for `worker` where its work is limited; the workers full now."""
    if not need.work or worker not in room:
        return full
    room[worker] -= 1
    return full | {worker} if room[worker] <= 0 else full


def _fits(c: Candidate, need: Need) -> bool:
    if c.worker_id in need.avoid or (need.venues and c.venue not in need.venues):
        return False
    if c.models and need.model and need.model not in c.models:
        return False
    return need.tokens <= c.context_tokens


def _pop_best(
    heap: list[tuple[float, int, int]], good: list[Candidate], need: Need
) -> tuple[int | None, tuple[str, float] | None]:
    """The best worker the job fits (its index in `good`), taken off the heap; and the next
    best, for the record."""
    skipped: list[tuple[float, int, int]] = []
    chosen: int | None = None
    while heap:
        entry = heapq.heappop(heap)
        if _fits(good[entry[-1]], need):
            chosen = entry[-1]
            break
        skipped.append(entry)
    nxt = heap[0] if heap else (skipped[0] if skipped else None)
    runner_up = (good[nxt[-1]].worker_id, nxt[0]) if nxt else None
    for entry in skipped:
        heapq.heappush(heap, entry)
    return chosen, runner_up


def _assign(index: int, q: _Queue, how: str, runner_up: tuple[str, float] | None) -> Assignment:
    """The decision for the job about to be queued on `q`, with the inputs behind it."""
    c = q.c
    route: Route = {
        "worker": c.worker_id,
        "venue": c.venue,
        "how": how,
        "eta_ms": round(q.eta_ms(), 1),
        "score": round(q.score(), 1),
        "reputation": round(c.reputation, 3),
        "load": round(c.load, 3),
        "price": c.price,
        "inflight": c.inflight,
        "credit": c.credit,
    }
    if runner_up is not None:
        route["runner_up"] = runner_up[0]
        route["runner_up_score"] = round(runner_up[1], 1)
    return {"index": index, "worker_id": c.worker_id, "route": route}
