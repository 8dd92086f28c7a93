"""Hedging stragglers. When: the latency a venue's sub-queries have taken in this run, and
the quantile past which one still running counts as straggling (policy.hedge; LatencyWindows);
a job on a worker whose own replies in this run take longer than that straggles from its
start. How: a straggler gets a twin on another worker once no fresh work waits, the one
expected to end last first (LATE, Zaharia et al., OSDI 2008), whichever answers first wins
and the other is cancelled (Hedger)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from runs.engine.fanout.book import attempt_place
from runs.engine.fanout.state import Flight, Scope, Wave
from traces.emitter import Emitter
from workers.jobs import Result

# Replies per venue the quantile is taken over: recent enough to follow a venue that slows.
WINDOW = 256
# Fewer replies than this say too little about a venue to call anything a straggler.
MIN_SAMPLES = 8
QUANTILES = {"p90": 0.90, "p95": 0.95, "p99": 0.99}
# No sub-query straggles in less than this: a twin costs a dispatch and a reply read, and a
# venue answering in a few ms (a cassette replay, a cache) would otherwise hedge every
# scheduling hiccup of a loaded machine. A model's tail is far longer than this.
FLOOR_MS = 100.0
# A batch hedges at most this share of its sub-queries: hedges are for the tail.
HEDGE_SHARE = 0.1
# A straggler runs this much past the quantile: latencies with no spread do not hedge on jitter.
HEDGE_SLACK = 1.1
# Replies per worker its typical time is taken over (the median), and the fewest that count.
WORKER_WINDOW = 16
WORKER_MIN_SAMPLES = 2


class LatencyWindows:
    """The latest WINDOW reply times (start to reply, in ms) per venue, and the latest
    WORKER_WINDOW per worker."""

    def __init__(self, hedge: str) -> None:
        self.quantile = QUANTILES.get(hedge)  # None: hedging is off
        self._samples: dict[str, deque[float]] = {}
        self._cache: dict[str, float | None] = {}
        self._workers: dict[str, deque[float]] = {}

    def add(self, venue: str, ms: float, worker: str = "") -> None:
        self._samples.setdefault(venue, deque(maxlen=WINDOW)).append(ms)
        self._cache.pop(venue, None)
        if worker:
            self._workers.setdefault(worker, deque(maxlen=WORKER_WINDOW)).append(ms)

    def worker_ms(self, worker: str) -> float | None:
        """The worker's median reply time in this run, or None while it has few replies."""
        samples = sorted(self._workers.get(worker, ()))
        if len(samples) < WORKER_MIN_SAMPLES:
            return None
        return round(samples[(len(samples) - 1) // 2], 1)

    def threshold_ms(self, venue: str) -> float | None:
        """The venue's latency quantile (at least FLOOR_MS), or None while hedging is off or
        samples are few."""
        if self.quantile is None:
            return None
        if venue not in self._cache:
            samples = sorted(self._samples.get(venue, ()))
            if len(samples) < MIN_SAMPLES:
                return None
            # Nearest rank: the smallest sample at or above the quantile.
            rank = max(0, math.ceil(self.quantile * len(samples)) - 1)
            self._cache[venue] = max(samples[rank], FLOOR_MS)
        return self._cache[venue]


def time_to_end(ran_ms: float, usual_ms: float | None) -> float:
    """How much longer a running job is expected to take: what its worker usually takes,
    less what it has run; once past that (or with nothing known of the worker), as long
    again as it has run, the longer a job has straggled the longer it is likely to."""
    if usual_ms is not None and usual_ms > ran_ms:
        return usual_ms - ran_ms
    return ran_ms


@dataclass(kw_only=True, eq=False)
class Hedger:
    scope: Scope
    emitter: Emitter
    latency: LatencyWindows
    abandon: Callable[[Flight, Wave], None]  # gives up an attempt that is out (Attempts.abandon)
    release: Callable[[Flight, Wave], None]  # frees its credit, not revoking it (Attempts.release)
    # A replay's replies held back until the recorded hedge of their attempt has left.
    parked: list[Result] = field(default_factory=list, init=False)
    _hedges: int = field(default=0, init=False)  # hedges made in the current dispatch
    _limit: int = field(default=0, init=False)

    def start(self, size: int) -> None:
        """A dispatch of `size` sub-queries begins: it may hedge HEDGE_SHARE of them."""
        self._hedges = 0
        self._limit = max(1, math.floor(HEDGE_SHARE * size))

    def hedge_stragglers(self, wave: Wave) -> None:
        """Once no fresh work waits (a free slot is better spent on it), a sub-query that
        has run past its venue's latency quantile, or runs on a worker whose median in this
        run is past it, gets a twin on another worker: whichever answers first wins, the
        other is cancelled (drop_twin). Running time counts from the worker's start: a job
        waiting in a queue is not a straggler by itself, but one queued on a worker whose
        running job straggles waits on that straggler, and is hedged with it. The batch's
        few hedges go first to the stragglers expected to end last (time_to_end)."""
        if self.scope.book is not None:
            self.follow_book(wave)
            return
        if self.latency.quantile is None or self._hedges >= self._limit:
            return
        if any(not f.hedge for f in wave.backlog):
            return
        now = time.time()
        straggling: list[tuple[float, Flight]] = []
        slow_workers: set[str] = set()
        usual_of: dict[str, float | None] = {}  # each worker's median, once per call
        for flight in wave.out.values():
            threshold = self.latency.threshold_ms(flight.venue)
            if threshold is None or not flight.started_at:
                continue
            ran = (now - flight.started_at) * 1000
            if flight.worker_id not in usual_of:
                usual_of[flight.worker_id] = self.latency.worker_ms(flight.worker_id)
            usual = usual_of[flight.worker_id]
            if max(ran, usual or 0.0) > threshold * HEDGE_SLACK:
                straggling.append((time_to_end(ran, usual), flight))
                slow_workers.add(flight.worker_id)
        straggling.sort(key=lambda pair: -pair[0])
        behind = [f for f in wave.out.values() if not f.started_at and f.assigned in slow_workers]
        for flight in [f for _, f in straggling] + behind:
            if self._hedges >= self._limit:
                return
            if flight.twin is not None or flight.hedge or flight.outcome.status != "pending":
                continue
            self._twin(flight, wave)

    def follow_book(self, wave: Wave) -> bool:
        """A full replay hedges what the recording hedged, as soon as the hedged attempt is
        out (its replayed reply would come before any timer). True when it queued a hedge."""
        book = self.scope.book
        if book is None:
            return False
        queued = False
        for flight in list(wave.out.values()):
            if flight.twin is not None or flight.hedge or flight.outcome.status != "pending":
                continue
            place = (self.scope.depth, self.scope.batches, flight.outcome.index)
            if book.hedged(*place, flight.outcome.attempts + 1):
                self._twin(flight, wave)
                queued = True
        return queued

    def unpark(self, wave: Wave) -> list[Result]:
        """The parked replies whose attempt's hedge has left (or is gone)."""
        ready, self.parked = self.parked, []
        for result in ready:
            flight = wave.out.get(result.get("sq_id", ""))
            twin = flight.twin if flight is not None else None
            if twin is not None and any(f is twin for f in wave.backlog):
                self.parked.append(result)
        return [r for r in ready if not any(r is p for p in self.parked)]

    def _twin(self, flight: Flight, wave: Wave) -> None:
        """Queue a hedge of `flight` first in the backlog, bound to it as its twin."""
        hedge = Flight(
            flight.outcome,
            flight.prompt,
            span=flight.span,
            replica_of=flight.replica_of,
            venues=flight.venues,
            original=flight.original,
            kind=flight.kind,
            judged=flight.judged,
            tried=set(flight.tried),
            twin=flight,
            hedge=True,
        )
        flight.twin = hedge
        self._hedges += 1
        wave.backlog.appendleft(hedge)

    def drop_twin(self, flight: Flight, wave: Wave) -> None:
        """The sub-query is settled: its twin, if still out, is cancelled; if still queued
        here, forgotten."""
        twin, flight.twin = flight.twin, None
        if twin is None:
            return
        twin.twin = None
        if any(f is twin for f in wave.backlog):
            wave.backlog = deque(f for f in wave.backlog if f is not twin)
            return
        if wave.out.get(twin.sq_id) is not twin:
            return
        winner = "hedge" if flight.hedge else "original attempt"
        self.emitter.instant(
            "SubQuery.Cancel",
            parent=twin.span.span_id if twin.span else None,
            depth=self.scope.depth,
            status="cancelled",
            reason=f"hedged: the {winner} {flight.sq_id} answered first",
            sq_id=twin.sq_id,
            venue=twin.venue,
            worker_id=twin.worker_id or None,
        )
        book, scope = self.scope.book, self.scope
        place = attempt_place(
            scope.depth, scope.batches, twin.outcome.index, twin.sq_id, twin.outcome.attempts
        )
        if book is not None and book.ran(place):
            # The recording's loser had started: the replay's runs to its end too (from the
            # recording), not revoked, so the replay holds the same Execute spans.
            self.release(twin, wave)
            return
        self.abandon(twin, wave)
