"""A reply as it arrives. It is checked before it counts: it must come from the worker the job
was given to (or, for a shared queue, a live worker of that venue) and carry that worker's
signature; one that does not is rejected, and its sender struck. A sound one settles its
attempt, or sends it to be tried again, and what it says about the worker feeds the routing."""

from __future__ import annotations

import time
from dataclasses import dataclass

from runs.engine.fanout.attempts import Attempts
from runs.engine.fanout.hedging import Hedger
from runs.engine.fanout.routing import Router
from runs.engine.fanout.spending import fair_tokens
from runs.engine.fanout.state import Executing, Flight, Roster, Scope, Totals, Wave
from traces.emitter import Emitter
from workers.jobs import UNSERVED_ENDPOINT, Result
from workers.models import Worker
from workers.services import worker_strike
from workers.signing import result_verify

# Refusals of a run's endpoint one job may have for free: each refusing worker leaves the
# run's routing, but a swarm of fresh worker ids could otherwise pass a job round for good.
FREE_REFUSALS = 3

RETURNED = (
    "returned it: its link to the web server dropped before it answered, and the server "
    "it is connected to now cannot take that answer"
)


# How far from its deadline a job must be for a worker's `cancelled` of it, unasked, to
# count against the worker.
DROP_SLACK_S = 5.0


@dataclass(kw_only=True, eq=False)
class Intake:
    scope: Scope
    roster: Roster
    emitter: Emitter
    totals: Totals
    router: Router
    attempts: Attempts
    hedger: Hedger

    def on_result(self, result: Result, wave: Wave) -> Flight | None:
        """Take one reply; returns the attempt it ended, if it ended one (settled, or sent
        to be tried again)."""
        status = result.get("status")
        wid = result.get("worker_id", "")
        running = None
        if status in ("ok", "error", "cancelled", "lost", "refused", "returned"):
            # The worker ended its Execute span with this result, late or not (or, for
            # `lost` and `refused`, the gateway that held the job did; a `returned` job's
            # span is ended here).
            running = self.roster.executing.get(wid, {}).pop(result.get("sq_id", ""), None)
        flight = wave.out.get(result.get("sq_id", ""))
        if status == "returned" and running is not None:
            running.abandon(self.emitter, wid, f"worker {wid} {RETURNED}")
        if flight is None:
            return None  # a late reply to an attempt that was already settled or replaced
        if self.scope.book is not None and self._held_by_book(result, flight, wave):
            return None
        if status == "returned":
            return self._returned(flight, wave, wid)
        if status == "lost":
            # Only a hint (the gateway's, that the holder's connection dropped): presence is
            # read again now, and liveness re-dispatches what a departed worker held.
            self.router.look_again()
            return None
        problem = self._check_sender(flight, wid)
        if status == "refused":
            # The gateway refused its holder's result (workers/gateway/relay.py): that
            # worker will not answer it, so it is tried again now, not at its timeout.
            if problem is None:
                reason = f"the gateway refused worker {wid}'s result: {result.get('error', '')}"
                return self._again_now(flight, wave, reason)
            return None
        if problem is None and status in ("ok", "error") and result.get("malformed"):
            # Its assignee's reply with figures no reply can have: refused and struck, and
            # the job tried again now, not at its timeout (workers.jobs.decode_result).
            reason = f"worker {wid} sent a malformed result: {result['malformed']}"
            self._reject(flight, wid, reason)
            return self._again_now(flight, wave, reason)
        if problem is None and status in ("ok", "error"):
            problem = self._check_signature(result, wid)
        if problem is not None:
            self._reject(flight, wid, problem)
            if status in ("started", "queued") and not flight.assigned and not flight.worker_id:
                # A shared queue's job, claimed first by a worker that may not hold it
                # (one deregistered a moment before its session's pump took the job): it
                # is off the queue, and no other worker can take it or answer for it.
                # Tried again now, not at its timeout; the venue is not at fault.
                return self._again_now(flight, wave, problem, observed=False)
            # Not counted, and not the job's end: the assignee may still answer.
            return None
        if status == "queued":
            # A gateway worker holds it in its buffer, not started yet (workers/gateway/
            # protocol.py): liveness knows whom to watch; hedging sees it waiting.
            flight.worker_id = wid
            return None
        if status == "started":
            flight.worker_id = wid
            flight.started_at = result.get("at") or time.time()
            flight.started_attempt = flight.outcome.attempts
            if result.get("span"):
                self.roster.executing.setdefault(wid, {})[flight.sq_id] = Executing(
                    span_id=result["span"],
                    parent=flight.span.span_id if flight.span else None,
                    venue=flight.venue,
                    depth=self.scope.depth,
                )
            if result.get("alive") == "1":
                self.roster.watched.add(wid)
            return None
        if status == "ok":
            result["counted"] = fair_tokens(result, flight.prompt)
            result["cost"] = self.attempts.spending.fair_cost(result, flight.prompt)
        self.attempts.release(flight, wave, spent=result if status == "ok" else None)
        # How long it ran, not how long it queued: the scheduler adds the queue itself.
        end = result.get("at") or time.time()
        ms = (end - max(flight.sent_at, flight.started_at)) * 1000
        if status == "ok":
            self.router.observe(flight, True, latency_ms=ms)
            if flight.started_at:
                self.hedger.latency.add(
                    flight.venue, (end - flight.started_at) * 1000, flight.worker_id
                )
            self.totals.add_tokens(*result["counted"], result.get("cost"))
            self.attempts.settle(flight, "ok", result=result)
            self.hedger.drop_twin(flight, wave)
        elif status == "error" and self._unserved(flight, result):
            # The worker cannot call the endpoint the run names: the run's routing sent it
            # a job it must refuse. Counted against it, such refusals used up the jobs'
            # retries and opened a healthy worker's breaker, which then failed other runs
            # on its venue (a review). It gets none of this run's work; the job goes again.
            self.router.unserving.add(wid)
            if self.scope.policy.routing != "shared" and flight.unserved < FREE_REFUSALS:
                flight.unserved += 1  # a venue's shared queue may bring it back to it
            self.attempts.retry_or_settle(flight, "error", result["error"], wave)
        elif status == "error":
            self.router.observe(flight, False)
            # Which worker said it: "the model endpoint http://127.0.0.1:33853/v1 answered
            # HTTP 500" was a remote worker's own endpoint, and nothing said whose (a review).
            # Beside the error, not in it: the program reads the error in its marker, and a
            # replay's worker is another than the recording's.
            flight.outcome.said_by = wid
            self.attempts.retry_or_settle(flight, "error", result.get("error", "failed"), wave)
        else:
            if self._dropped_unasked(flight):
                # A failure, as an error is: a worker that dropped every job it took so kept
                # a spotless record and breaker, and its share of every run (a review).
                self.router.observe(flight, False)
            self.attempts.retry_or_settle(
                flight, "error", "the worker dropped the job as expired or cancelled", wave
            )
        return flight

    @staticmethod
    def _unserved(flight: Flight, result: Result) -> bool:
        """A refusal of the endpoint comes as the job opens, before any `started`: one
        after it is a failure like any other, or a worker could sit on its jobs to their
        timeout and give them back with no strike (a review)."""
        refused = str(result.get("error", "")).startswith(UNSERVED_ENDPOINT)
        return refused and flight.started_attempt != flight.outcome.attempts

    def _dropped_unasked(self, flight: Flight) -> bool:
        """A worker said `cancelled` of a job nobody cancelled, well before its deadline
        (a worker's clock may be a little off the conductor's)."""
        revoked = flight.sq_id in self.attempts.transport.revoked
        return not revoked and time.time() < flight.deadline - DROP_SLACK_S

    def _held_by_book(self, result: Result, flight: Flight, wave: Wave) -> bool:
        """Whether a full replay's reply waits or goes unheard, as the recording's did
        (book.Book): it waits while its attempt's recorded hedge has not left yet
        (hedging.Hedger.parked); it does not settle an attempt the batch cut off (the cut
        does, core.Fanout._settle_rest), nor one that timed out (it is due now instead:
        liveness.check_deadlines), nor one cancelled as it left whose twin answers."""
        book = self.scope.book
        status = result.get("status")
        if book is None or status not in ("ok", "error", "cancelled"):
            return False
        twin = flight.twin
        if status != "cancelled" and twin is not None and any(f is twin for f in wave.backlog):
            self.hedger.parked.append(result)
            return True
        place = self.attempts.place(flight)
        if book.held(place):
            self.attempts.unburden(flight)
            return True
        if book.timed_out(place):
            flight.deadline = 0.0
            return True
        return status == "cancelled" and twin is not None

    def public_key(self, wid: str) -> str | None:
        """The worker's registered public key (read once per run), or None when it is not
        registered."""
        keys = self.roster.keys
        if wid not in keys:
            key = Worker.objects.filter(id=wid).values_list("public_key", flat=True).first()
            if key is None:
                return None
            keys[wid] = key
        return keys[wid]

    def _check_sender(self, flight: Flight, wid: str) -> str | None:
        """A worker answers only for work it was given: the assignee, or for a shared queue
        a live worker of that venue."""
        if flight.assigned:
            if wid != flight.assigned:
                return f"{wid or 'an unnamed worker'} answered for {flight.assigned}"
        elif not self._live(flight.venue, wid) and not (
            # One that joined since presence was read claims a queued job at once: it was
            # refused and struck for that (a review). Presence is read again first.
            self.router.read_again() and self._live(flight.venue, wid)
        ):
            return f"{wid or 'an unnamed worker'} is not a live worker of venue {flight.venue}"
        return None

    def _live(self, venue: str, wid: str) -> bool:
        return wid in self.roster.live.get(venue, set()) or wid in self.roster.workers

    def _check_signature(self, result: Result, wid: str) -> str | None:
        key = self.public_key(wid)
        if key is None:
            return f"worker {wid} is not registered, so its result cannot be checked"
        if not result_verify({**result, "run_id": self.scope.run_id}, key):
            return f"the result's signature is not worker {wid}'s"
        return None

    def _returned(self, flight: Flight, wave: Wave, wid: str) -> Flight | None:
        """A gateway worker gives back a job of a session that dropped (the web server was
        killed and came back, or the path was cut) before it could answer: the server it
        is connected to now never gave it the job and would refuse its result, and while
        the worker stays present nothing else would send the job again before its
        timeout. Tried again now, the way a lost worker's jobs are: neither its breakers
        nor its reputation count it, since the link broke, not the worker. Only its holder
        can give a job back: its assignee, or, on a shared queue, the worker whose claim
        (queued or started) was taken; any live worker of the venue could (a review)."""
        if not wid or wid != (flight.assigned or flight.worker_id):
            return None
        self.attempts.abandon(flight, wave)
        self.attempts.retry_or_settle(flight, "error", f"worker {wid} {RETURNED}", wave)
        return flight

    def _again_now(
        self, flight: Flight, wave: Wave, reason: str, *, observed: bool = True
    ) -> Flight:
        """Its holder will not answer it: the attempt is given up and the job tried again
        now, not at its timeout (`observed`: counted against the holder and its venue)."""
        self.attempts.abandon(flight, wave)
        if observed:
            self.router.observe(flight, False)
        self.attempts.retry_or_settle(flight, "error", reason, wave)
        return flight

    def _reject(self, flight: Flight, wid: str, problem: str) -> None:
        self.emitter.instant(
            "SubQuery.Return",
            parent=flight.span.span_id,
            depth=self.scope.depth,
            status="rejected",
            sq=flight.outcome.index,
            sq_id=flight.sq_id,
            venue=flight.venue,
            worker_id=wid or None,
            reason=problem,
        )
        if wid:
            worker_strike(wid, problem)
            self.router.reputations.known.pop(wid, None)  # the strike counts at the next refresh
