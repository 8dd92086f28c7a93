"""Jobs that will not answer. One past its deadline, or held by a worker that left (or queued on
a venue whose workers all left), is given up and tried again elsewhere while attempts remain.
A broker worker has left the moment its alive line drops (workers/alive.py, read every
ALIVE_EVERY_S), any worker when its presence lapses or the gateway says its connection
dropped. When no venue has a live worker at all, the batch waits for one to come back as long
as one attempt may take (policy.subquery_timeout_s): devices of a swarm come and go."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runs.engine.fanout.attempts import Attempts
from runs.engine.fanout.routing import Router
from runs.engine.fanout.state import Roster, Scope, Wave
from runs.trust.accounts import LostWorker
from traces.emitter import Emitter
from workers.alive import connected
from workers.reputation import Observation
from workers.services import worker_mark_lost

NO_VENUE = "no live worker on any of the run's venues"
# How often the alive lines of the workers holding this batch's work are read: one PUBSUB
# NUMSUB round trip for all of them.
ALIVE_EVERY_S = 0.1


@dataclass(kw_only=True, eq=False)
class Liveness:
    scope: Scope
    roster: Roster
    emitter: Emitter
    router: Router
    attempts: Attempts
    # The workers lost while they held this run's work, in the order they were noticed, with
    # their venue and how many attempts they held: the run's summary names them.
    lost: dict[str, LostWorker] = field(default_factory=dict, init=False)
    _empty_since: float = field(default=0.0, init=False)
    _alive_read: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        # How long a batch waits for a worker to come back when every one has left: as long
        # as one attempt may take. 15 s failed a run whose one remote worker's link was down
        # for 20 s, most of its batch "no live worker", and the run "succeeded" on the rest
        # (a review).
        self._grace_s = self.scope.policy.subquery_timeout_s

    def check_deadlines(self, wave: Wave) -> None:
        now = time.time()
        for flight in [f for f in wave.out.values() if f.deadline <= now]:
            self.attempts.abandon(flight, wave)
            self.router.observe(flight, False)
            self.emitter.instant(
                "SubQuery.Timeout",
                parent=flight.span.span_id,
                depth=self.scope.depth,
                status="timeout",
                sq_id=flight.sq_id,
                venue=flight.venue,
                worker_id=flight.worker_id or None,
            )
            timeout_s = self.scope.policy.subquery_timeout_s
            self.attempts.retry_or_settle(
                flight,
                "timeout",
                f"no reply within {timeout_s} s (policy.subquery_timeout_s)",
                wave,
            )

    def check_lost_workers(self, wave: Wave) -> None:
        if not wave.out and not wave.backlog:
            return
        self.router.refresh()
        self._read_alive_lines(wave)
        for flight in list(wave.out.values()):
            live = self.roster.live.get(flight.venue, set()) - self.roster.gone.keys()
            if flight.worker_id and flight.worker_id not in live:
                self._worker_lost(flight.worker_id, flight.venue)
                self.lost[flight.worker_id]["held"] += 1
                reason = f"worker {flight.worker_id} was lost while it held it"
            elif not flight.worker_id and not live:
                # Queued on a venue whose workers are all gone.
                reason = f"venue {flight.venue} has no live worker left to run it"
            else:
                continue
            if flight.worker_id:
                self._abandon_executing(flight.worker_id, reason)
            self.attempts.abandon(flight, wave)
            # A departure is not a failure of the venue, nor of the work: its breakers
            # are left alone, and reputation learns of it as an unfinished job.
            if flight.worker_id:
                self.router.reputations.observe(Observation(flight.worker_id, completion=False))
            self.attempts.retry_or_settle(flight, "error", reason, wave)

    def _read_alive_lines(self, wave: Wave | None, *, every_s: float = ALIVE_EVERY_S) -> None:
        """The watched workers holding work of this wave, or running an Execute span of this
        run, whose alive line dropped are gone from now on: out of the roster (no new work
        goes to them), and the spans they left open ended as abandoned."""
        now = time.monotonic()
        if now - self._alive_read < every_s:
            return
        holders = {f.worker_id for f in wave.out.values()} if wave is not None else set()
        holders |= {wid for wid, spans in self.roster.executing.items() if spans}
        holders &= self.roster.watched
        holders -= self.roster.gone.keys()
        if not holders:
            return
        self._alive_read = now
        for wid in holders - connected(self.router.client, sorted(holders)):
            self.roster.gone[wid] = now
            self.roster.workers.pop(wid, None)
            for names in self.roster.live.values():
                names.discard(wid)
            self._abandon_executing(wid, f"worker {wid} was lost while it held it")

    def settle_executing(self) -> None:
        """At the run's end: the Execute spans of attempts settled meanwhile (cancelled, or
        beaten by a hedge) whose worker has died since are ended as abandoned. Those of live
        workers end by themselves."""
        self._read_alive_lines(None, every_s=0.0)

    def _abandon_executing(self, wid: str, reason: str) -> None:
        """End the Execute spans a lost worker opened and will never end: a broker worker's,
        and a gateway worker's whose server died with them (the server ends them itself
        when only the worker is lost, and says so: intake drops them then)."""
        for running in self.roster.executing.pop(wid, {}).values():
            running.abandon(self.emitter, wid, reason)

    def await_workers(self, wave: Wave) -> None:
        """While work waits and no venue has a live worker, wait a while for one to come back
        (devices of a swarm come and go); past the grace, the waiting work fails."""
        if wave.backlog and not self.router.any_credit():
            self._empty_since = self._empty_since or time.monotonic()
            if time.monotonic() - self._empty_since > self._grace_s:
                self.attempts.settle_backlog(wave, "error", NO_VENUE)
        else:
            self._empty_since = 0.0

    def _worker_lost(self, wid: str, venue: str) -> None:
        """Say once per run that a worker holding its work left without a word."""
        if wid in self.lost:
            return
        self.lost[wid] = {"worker_id": wid, "venue": venue, "held": 0}
        self.emitter.instant(
            "Worker.Lost",
            parent=self.scope.parent,
            depth=self.scope.depth,
            status="error",
            venue=venue,
            worker_id=wid,
            marked=worker_mark_lost(wid),
        )
