"""What the parts of a fanout share: a sub-query's attempt (Flight), a REPL call's batch while
it is judged (Batch), a routing decision (Target), the jobs of one dispatch (Wave), the run and
the REPL call being served (Scope), the workers as last seen (Roster), the outcomes and totals
the conductor reads, and the exceptions that end a call or a run."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from frlm_web.money import ZERO
from runs.engine.fanout.book import Book
from runs.engine.policy import CHOICES, Policy
from runs.trust.budget import Reservation
from runs.trust.probes import Probe
from traces.emitter import Emitter, Span
from workers.backends import ModelSpec
from workers.jobs import Result
from workers.venues import LiveWorker

# Tiers a REPL call may name: the run's policy tiers, and "objective" (a call's own check).
CALL_TIERS = (*CHOICES["tier"], "objective")


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
    status: str = "pending"  # ok | error | timeout | cancelled | unresolved | rejected | budget
    text: str = ""
    error: str = ""
    venue: str = ""
    worker_id: str = ""
    said_by: str = ""  # the worker whose error it is (a failed attempt's)
    attempts: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = ZERO
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
    subqueries_cut: int = 0  # cancelled once the batch's quorum was met: by design, not failed
    subqueries_cancelled: int = 0  # not answered when the run was cancelled: not failed either
    settled: int = 0
    calls: int = 0  # sub-queries and child RLMs, counted against policy.max_subqueries
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = ZERO  # exact dollars (frlm_web.money)

    def add_tokens(self, tokens_in: int, tokens_out: int, cost: Decimal | None) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost or ZERO


@dataclass
class Flight:
    outcome: Outcome
    prompt: str
    span: Span | None = None
    sq_id: str = ""
    venue: str = ""
    task_id: str = ""
    # Its worker is of a trusted venue and consumes the broker itself (not through the
    # gateway): its job may travel in a bundle with others for that worker (workers/wire.py),
    # and then shares a task id. An untrusted worker holds no more jobs than it runs.
    may_bundle: bool = False
    bundled: bool = False
    deadline: float = 0.0
    sent_at: float = 0.0
    started_at: float = 0.0  # when its worker said it started (0: still queued)
    worker_id: str = ""  # who holds it: the assignee, or who took it from a shared queue
    assigned: str = ""  # the worker it was given to; "" when put on a venue's shared queue
    queue: str = ""
    slot: str = ""  # whose credit it uses: a worker id, or "venue:<name>"
    retry_reason: str = ""
    unserved: int = 0  # attempts refused by a worker that cannot call the run's endpoint
    started_attempt: int = 0  # the last attempt its worker said it started
    tried: set[str] = field(default_factory=set)  # worker ids and venue names
    replica_of: int = -1  # a copy's: the position in its batch of the sub-query it copies
    venues: frozenset[str] = frozenset()  # where it may run; empty: the run's answer venues
    original: int = 0  # a copy's: the number of the sub-query it copies
    kind: str = ""  # "" an answer; a copy made to judge one: replica, recheck, validator;
    # "probe": a known-answer question mixed into the batch (runs.trust.probes)
    probe: Probe | None = None
    judged: Flight | None = None  # a validator's: the reply it re-runs
    reservation: Reservation | None = None  # its budget reservation while it is out
    result: Result | None = None  # the signed reply, kept for its receipt
    verdict: str = "unverified"  # what its reply was judged (runs.trust.receipts verdicts)
    twin: Flight | None = None  # a hedge and the attempt it hedges, while both may answer
    hedge: bool = False  # this attempt is a hedge of its twin
    roll: float | None = None  # its exploration draw (scheduler.Need.roll), made once


@dataclass(frozen=True)
class Executing:
    span_id: str
    parent: str | None  # the attempt's Submit span
    venue: str
    depth: int

    def abandon(self, emitter: Emitter, worker_id: str, reason: str) -> None:
        """End the span as abandoned: its worker will never end it (lost, or it returned
        the job)."""
        emitter.emit(
            "SubQuery.Execute",
            "end",
            span_id=self.span_id,
            parent=self.parent,
            depth=self.depth,
            status="abandoned",
            venue=self.venue,
            worker_id=worker_id,
            error=reason,
        )


@dataclass
class Vouches:
    """The check gate of one batch on a checking tier (runs/engine/fanout/vouching.py): one
    answer of each untrusted worker in the batch is checked as soon as it arrives (a new or
    suspect worker's first; a settled worker's drawn at random among those it is expected
    to give, `due`), and until that check's verdict the worker is given at most `cap` work
    attempts of the batch (runs/engine/fanout/routing.py). A turncoat is so caught within
    a few answers, not after its share of the whole batch, and no answer of a batch is one
    a liar knows to be safe."""

    barred: dict[str, str]  # the run's workers caught lying (judging.Judge.caught): no work
    positions: dict[int, int]  # id() of each of the batch's flights -> its position
    open: bool = True  # while the batch's own dispatch runs; the judge's rounds are not gated
    sent: dict[str, int] = field(default_factory=dict)  # work attempts per worker
    due: dict[str, int] = field(default_factory=dict)  # worker -> its answer the gate checks
    answered: dict[str, int] = field(default_factory=dict)  # worker -> its answers so far
    vouched: set[str] = field(default_factory=set)  # an answer of it passed a check
    released: set[str] = field(default_factory=set)  # no check could settle: not held back
    pending: dict[str, int] = field(default_factory=dict)  # worker -> position under check
    checking: dict[str, int] = field(default_factory=dict)  # worker -> position it checks
    peering: dict[str, int] = field(default_factory=dict)  # high trust: peer -> position
    copies: dict[int, int] = field(default_factory=dict)  # id() of a check's copy -> position
    early: dict[int, list[Flight]] = field(default_factory=dict)  # position -> its copies
    why: dict[int, str] = field(default_factory=dict)  # position -> why it was checked
    nth: dict[int, int] = field(default_factory=dict)  # position -> its worker's answer number

    def cap(self, worker: str, concurrency: int) -> int:
        """Work attempts an unvouched worker of `concurrency` slots gets before its check's
        verdict: one slot is kept for the check of another worker's answer it may be given,
        and the answers before the one the gate checks are given on top."""
        return max(1, concurrency - 1) + self.due.get(worker, 1) - 1

    def holds(self, worker: str, trusted: bool) -> bool:
        """Whether the gate still holds `worker` back: an untrusted worker not yet vouched
        for in the batch, not released by a check that could not settle, not caught."""
        return not (
            trusted or worker in self.vouched or worker in self.released or worker in self.barred
        )


@dataclass
class Batch:
    """One REPL call's sub-queries while they are judged: who holds each position's reply
    now (the answer, or the recheck that replaced it), which workers failed its check, and
    every reply that came back, for its receipt once its verdict is known."""

    flights: list[Flight]
    tier: str
    depth: int
    parent: str | None
    judging: bool  # verdicts come after the replies: receipts wait for them
    holders: dict[int, Flight] = field(default_factory=dict)
    failed: dict[int, set[str]] = field(default_factory=dict)
    # Replies of each position that failed the call's own check: the retries' bound (the
    # workers above repeat where there is only one, and it was asked again without end).
    check_failures: dict[int, int] = field(default_factory=dict)
    replied: list[Flight] = field(default_factory=list)
    probed: list[str] = field(default_factory=list)  # workers that passed a probe in it
    vouches: Vouches | None = None  # its check gate, on a checking tier (vouching.Vouching)

    def holder(self, pos: int) -> Flight:
        return self.holders.get(pos, self.flights[pos])


@dataclass(frozen=True)
class Target:
    venue: str
    worker_id: str  # "" for a venue's shared queue
    queue: str
    how: str  # score | explore | shared | round_robin
    routing: dict[str, Any]  # the decision's inputs, recorded on the Submit span


@dataclass
class Wave:
    """One dispatch's jobs: those out, by attempt id (sq_id), and those waiting to be sent."""

    out: dict[str, Flight]
    backlog: deque[Flight]

    def holds(self, flight: Flight) -> bool:
        """Whether the attempt may still answer: it is out, or waits to be sent."""
        return self.out.get(flight.sq_id) is flight or any(f is flight for f in self.backlog)


@dataclass
class Scope:
    """What every part of a run's fanout reads: the run, its policy and venues, the worker
    model (the conductor may swap it between turns), and the REPL call being served: its
    parent span, its depth, and its batch while that is dispatched and judged."""

    run_id: str
    policy: Policy
    worker_model: ModelSpec
    venue_names: list[str]  # every venue watched: the answer venues and the checking ones
    answer_venues: frozenset[str]
    verify_venues: frozenset[str]
    premium_venues: frozenset[str] = frozenset()  # the premium lane (policy.premium_venues)
    parent: str | None = None
    depth: int = 0
    batches: int = 0  # batches numbered so far; Submit spans name the latest
    batch: Batch | None = None
    # A full replay's recorded decisions (book.Book), followed instead of timers and counts.
    book: Book | None = None

    def premium_for(self, step: str) -> bool:
        """Whether `step` ("single" or "retries") runs on the premium lane."""
        return bool(self.premium_venues) and self.policy.premium_steps in (step, "both")


@dataclass
class Roster:
    """The run's workers as the router last read them (routing.Router.refresh), and this run's
    jobs on each: the routing writes it, the other parts read it."""

    workers: dict[str, LiveWorker] = field(default_factory=dict)  # registered live ones by id
    live: dict[str, set[str]] = field(default_factory=dict)  # presence names per venue
    limit: dict[str, int] = field(default_factory=dict)  # slots plus margin, per live venue
    inflight: dict[str, int] = field(default_factory=dict)  # unsettled jobs per credit slot
    keys: dict[str, str] = field(default_factory=dict)  # public keys by worker id
    # Workers that hold an alive line (workers/alive.py): their death is read from it.
    watched: set[str] = field(default_factory=set)
    # Workers whose alive line dropped, and when (monotonic): gone, whatever presence says,
    # until their presence has had time to lapse (a worker started again is back then).
    gone: dict[str, float] = field(default_factory=dict)
    # Execute spans broker workers said they opened and have not ended yet, per worker, by
    # sub-query id: what to end as abandoned if the worker is lost (settled attempts too).
    executing: dict[str, dict[str, Executing]] = field(default_factory=dict)
