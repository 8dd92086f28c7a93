"""The gateway's server side: a worker's session (`WorkerLink`), one per connected worker.

1. challenge (workers/gateway/handshake.py): the worker proves it holds its registered key
   by signing a fresh nonce (no strike when it cannot: an unauthenticated caller is
   nobody's fault but its own);
2. pump: while the worker has room (free slots and work buffer, within the credit its answers
   earned if its venue is untrusted: workers/gateway/credit.py), take as many jobs as
   it has room for from its own queue, then its venue's (the same Redis lists Celery
   workers consume, so the conductor cannot tell the two kinds apart), into the session's
   hand (workers/gateway/pump.py); tell the conductor who holds each and open their
   Execute spans in one transaction that also lets them go from the hand; read their
   fragments here (byte range, sha256, workers/gateway/fill.py) and send them, together
   to a worker that speaks version 2;
3. relay: the worker's results and span events go to the run's result stream and the event
   stream, stamped with the identity it proved (a batch of results in one round trip); a
   result for a job it does not hold, or an event of another kind or another run, is
   dropped (workers/gateway/relay.py);
4. watch: a ping each heartbeat measures the round trip; a worker silent past three
   heartbeats, or whose connection drops, leaves presence at once, and each run it held
   work of is told to look (a `lost` hint), so the conductor re-dispatches within one read;
5. returns: a worker whose last session dropped gives back the jobs it held then (this
   server never gave them, and would refuse their results), and each run is told
   (`returned`), so its conductor sends them again now, not at their timeout.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from frlm_web import presence
from traces.emitter import APPEND_LUA, append_args
from workers import fragments, services, wire
from workers.gateway import pump
from workers.gateway.aredis import async_redis
from workers.gateway.credit import Credit
from workers.gateway.fill import all_filled, check_job
from workers.gateway.protocol import (
    MAX_RESULTS,
    ProtocolError,
    batches,
    buffer_for,
    encode,
)
from workers.gateway.relay import (
    Held,
    NotHeld,
    Relayed,
    checked,
    grant_for,
    granted_returns,
    named,
    new_ids,
    slots_freed,
    started,
)
from workers.jobs import Job, cancelled_key, encode_result, results_stream
from workers.models import Worker
from workers.venues import Link, presence_group
from workers.wire import jobs_of

if TYPE_CHECKING:
    from workers.gateway.handshake import GatewayConsumer

log = logging.getLogger(__name__)

PONG_WITHIN_S = 600.0  # a pong echoes a ping of this server: no older, never from the future
# Seconds a pump waits on the queues before it looks again whether it should stop.
POP_WAIT_S = 1
REFUSED_FIX = (
    "send each result as workers/gateway/protocol.py says: for a job this worker holds, "
    "with status ok, error or cancelled, ending only the Execute span it was given"
)


class WorkerLink:
    """An authenticated worker's session: its pump, its watch, the jobs it holds."""

    def __init__(
        self,
        consumer: GatewayConsumer,
        worker: Worker,
        slots: int,
        *,
        batched: bool = False,
        buffered: bool = False,
    ) -> None:
        self.consumer = consumer
        self.worker = worker
        self.slots = slots
        self.batched = batched  # it speaks protocol version 2: `jobs`, `results`, `refused`
        # Version 3: jobs it may hold beyond its slots, queued on it (protocol.py).
        self.buffer = buffer_for(slots, settings.FRLM_GATEWAY_BUFFER) if buffered else 0
        self.venue = worker.venue.name
        self.queues = [worker.queue, worker.venue.queue]
        # Keyed by run and sub-query: two runs' sub-queries may share an sq_id.
        self.held: dict[tuple[str, str], Held] = {}
        self.room = asyncio.Event()
        self.draining = False
        self.heard = time.monotonic()
        self.beaten = time.monotonic()  # its last beat: its presence lives on them
        self.rtt_ms: float | None = None
        self.heartbeat_s = float(settings.FRLM_WORKER_HEARTBEAT_S)
        self.tasks: list[asyncio.Task] = []
        self.closed = False
        self.redis = async_redis()
        # What its pump pops is held in Redis until claimed (workers/gateway/pump.py): the
        # session's hand. Its pops run once: not ridden out.
        self.session = secrets.token_hex(8)
        self.hand = pump.Hand(worker.id, self.session, self.queues)
        self.credit = Credit(worker.id, trusted=worker.venue.trusted)
        self.pop_redis = async_redis(ride_out=False)
        self.pops = pump.Pops(
            self.hand,
            lambda: pump.return_hand(
                self.redis, worker.id, self.session, self.queues, own_too=False
            ),
        )
        self.leaving: asyncio.Future[None] | None = None  # lost()'s work, run once
        # The pump and the result relay pop in turn, each from its pop to its claims
        # (workers/gateway/pump.py: the hand holds only what the one popping took).
        self.popping = asyncio.Lock()
        # Taken before `popping` is let go: jobs reach the worker in the order they were
        # held, which their `queued` marks assume (_take), though filling one is a thread hop.
        self.sending = asyncio.Lock()
        self.contexts: dict[str, str | None] = {}  # run id -> its context file (cached)
        self.returned = 0  # jobs of a dropped session it gave back on this one (protocol.py)

    # --- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Announce it, welcome it, start its pump and watch. A session ended meanwhile (a
        newer one of the worker took its place) goes no further: announced, it put back a
        worker just withdrawn, and its pump ran on with no one to stop it."""
        # What its sessions before popped and never claimed (their server was killed in
        # between), and the jobs of its own queue they kept for it, go back on its queues
        # before this one pops.
        await pump.recover(self.redis, self.worker.id, self.session, self.queues)
        await self.credit.load(self.redis)
        if self.closed:
            return
        # In presence at once, not a heartbeat later: the conductor may route to it now.
        # Before the welcome, so a welcomed worker is one routing can see (a test that
        # looked for it right after its welcome once found it missing).
        await self._announce({"inflight": 0, "memory_mb": 0.0, "latency_ms": None})
        if self.closed:
            return
        await self.consumer.send(
            encode(
                {
                    "type": "welcome",
                    "worker_id": self.worker.id,
                    "venue": self.venue,
                    "heartbeat_s": self.heartbeat_s,
                    "slots": self.slots,
                    "buffer": self.buffer,
                }
            )
        )
        if self.closed:
            return
        self._update_room()
        self.tasks = [asyncio.ensure_future(self._pump()), asyncio.ensure_future(self._watch())]
        log.info(
            "gateway: worker %s of %s connected from %s",
            self.worker.id,
            self.venue,
            self.consumer.address,
        )

    async def lost(self, why: str) -> None:
        """Out of presence now; every run it held work of told to look; the Execute
        spans the server opened for that work ended as `abandoned`, so the trace has no
        span left open by a worker that is gone (a queued job's span was never opened);
        and what its hand holds put back (pump.Pops.close). It runs once, as a task of
        its own: every call waits for it, and a caller cancelled (daphne gives a closing
        socket's handler 10 s) does not cut it short; it never fails (a Redis outage past
        its ride-out is logged), so a newer session waiting for it goes on."""
        if self.leaving is None:
            self.closed = True
            self.leaving = asyncio.ensure_future(self._leave(why, asyncio.current_task()))
        await asyncio.shield(self.leaving)

    async def _leave(self, why: str, caller: asyncio.Task | None) -> None:
        # Not the task that called lost() (the watch, finding it silent, which then
        # closes the socket): cancelled, it broke off at the next await, and the worker
        # stayed connected and announced, with no pump taking its jobs and the spans of
        # those it held left open.
        for task in self.tasks:
            if task is not caller:
                task.cancel()
        try:
            await self._tell_and_withdraw(why)
        except Exception:  # noqa: BLE001 - logged; its conductors find it gone by presence
            log.exception("gateway: worker %s's session could not end cleanly", self.worker.id)
        finally:
            await self.pops.close()

    async def _tell_and_withdraw(self, why: str) -> None:
        # Its claims under way land first: told `lost` before a claim, a conductor read the
        # job as started again by a worker that never got it.
        await self.pops.settle()
        # The runs are told, and the spans ended, before the worker leaves presence: a
        # conductor that saw it gone first ended those spans itself, with its own reason,
        # and the trace had each twice (seen in CI).
        held = list(self.held.values())
        self.credit.left_holding(held, time.monotonic())
        await self._let_go(held, f"worker lost: {why}")
        await self.credit.save(self.redis)
        await sync_to_async(services.presence_withdraw, thread_sensitive=False)(self.worker)
        log.warning("gateway: worker %s left: %s; it held %d jobs", self.worker.id, why, len(held))

    async def _let_go(self, jobs: list[Held], why: str) -> None:
        """Jobs it will not answer: each run told (`lost`), their Execute spans ended."""
        pipe = self.redis.pipeline(transaction=False)
        for held in jobs:
            self.held.pop(held.key, None)
            hint = {"run_id": held.run_id, "sq_id": held.sq_id, "status": "lost"}
            # nomkstream: one taken back late may have outlived its stream (RESULTS_KEEP_S).
            hint["worker_id"] = self.worker.id
            pipe.xadd(results_stream(held.run_id), hint, nomkstream=True)
        ends = [self._execute_event(h, "end", "abandoned", error=why) for h in jobs if not h.queued]
        if ends:
            pipe.eval(APPEND_LUA, 0, *append_args(ends))  # type: ignore[arg-type]
        await pipe.execute()

    # --- jobs out -----------------------------------------------------------------------
    def _free(self, answered: int = 0) -> int:  # `answered` of those it holds about to go
        room = self.credit.room(self.slots + self.buffer) - (len(self.held) - answered)
        return 0 if self.draining or self.closed else max(0, room)

    def _update_room(self) -> None:
        if self._free():
            self.room.set()
        else:
            self.room.clear()
            if self.draining:  # no job moved into the hand of a worker that takes none
                pump.stop_waiting(self.hand)

    async def _pump(self) -> None:
        """Its pops run to their end if the session ends meanwhile, and a failed one is
        tried again after a pause (workers/gateway/pump.py): what the hand holds and its
        queues have, up to its room; with nothing queued, the first job to come."""
        hand = self.hand
        try:
            while not self.closed:
                await self.room.wait()
                async with self.popping:
                    popped = await self.pops.next(
                        lambda: pump.take(self.pop_redis, hand, self._free())
                    )
                    going = await self._take(popped, hand) if popped else []
                    if going:
                        await self.sending.acquire()  # sent in the order they were held
                if going:
                    await self._send_in_turn(going)
                elif not popped and self._free():
                    await self.pops.next(lambda: pump.wait(self.pop_redis, hand, POP_WAIT_S))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gateway: the pump of worker %s failed", self.worker.id)
            await self.consumer.close(code=1011)

    def _parse(self, raw: bytes) -> list[Job]:
        """The sub-query jobs in a queue's message (a bundle has several, should one come
        here) that someone still wants (the conductor moves on from one past its deadline)."""
        try:
            jobs = jobs_of(raw)
            for job in jobs:
                check_job(job)
        except ValueError as exc:
            # Dropped, not put back: it would end every session that took it in turn.
            log.error("gateway: a message on %s dropped: %s", self.queues, exc)
            return []
        return [job for job in jobs if job["deadline"] >= time.time()]

    async def _take(self, popped: list[pump.Popped], hand: pump.Hand) -> list[tuple[Job, Held]]:
        """Messages off a queue, held in `hand`: claimed for this worker and let go from
        the hand in one transaction; the jobs to send it (_send_jobs: filled, sent). For a
        session that has ended, left in the hand, which its end empties (pump.Pops.close,
        after every pop and claim under way)."""
        if self.closed:
            return []
        jobs = [job for _, raw in popped for job in self._parse(raw)]
        if not jobs:
            pipe = self.redis.pipeline(transaction=False)
            hand.release(pipe, popped)
            await self.pops.guard(pipe.execute())
            return []
        ids = new_ids(2 * len(jobs))  # an Execute span and its start event's id for each
        helds = []
        # Those beyond its free slots wait in its work buffer (protocol.py, version 3).
        # The worker runs what it holds in the order it got it, so a job waits when as
        # many as its slots came before it: jobs queued earlier take the slots that free
        # first, whether or not the worker's word that it started them has come yet.
        ahead = len(self.held)
        for i, job in enumerate(jobs):
            held = Held(
                job["run_id"],
                job["sq_id"],
                job["submit_span"],
                ids[2 * i],
                job["depth"],
                str(job["model"].get("model", "")),
                queued=ahead + i >= self.slots,
                timeout_s=float(job["timeout_s"]),
            )
            self.held[held.key] = held
            helds.append(held)
        self._update_room()
        # In one round trip: who holds each, before anything else can go wrong (if this
        # worker vanishes now, the conductor knows which job to send elsewhere); the start
        # of its Execute span, which the server opens as it hands the job over (the worker
        # ends it: one message a job from the worker, not two), or for a queued one when
        # the worker says it started (_results); and whether it was cancelled meanwhile
        # (then the claim is a late reply the conductor ignores). A transaction, which also
        # lets go of the jobs from the hand: the session's end, emptying the hand, comes
        # wholly before or after it (pump.py), and is held until it has run.
        pipe = self.redis.pipeline(transaction=True)
        starts = []
        for i, held in enumerate(helds):
            pipe.sismember(cancelled_key(held.run_id), held.sq_id)
            claim = self._claim(held, "queued" if held.queued else "started")
            pipe.xadd(results_stream(held.run_id), claim)  # type: ignore[arg-type]
            if not held.queued:
                starts.append(self._execute_event(held, "start", "ok", event_id=ids[2 * i + 1]))
        if starts:
            pipe.eval(APPEND_LUA, 0, *append_args(starts))  # type: ignore[arg-type]
        hand.release(pipe, popped)
        replies = await self.pops.guard(pipe.execute())
        ends, going = [], []
        for job, held, cancelled in zip(jobs, helds, replies[0 : 2 * len(helds) : 2], strict=True):
            if cancelled:
                del self.held[held.key]
                if not held.queued:
                    ends.append(self._execute_event(held, "end", "cancelled", ms=0.0))
            else:
                going.append((job, held))
        if ends:
            self._update_room()
            await self._append(ends)
        return going

    async def _send_in_turn(self, going: list[tuple[Job, Held]]) -> None:
        """_send_jobs, by the holder of `sending`, which it lets go; not for a session
        that ended meanwhile (its runs were told the jobs are lost)."""
        try:
            if not self.closed:
                await self._send_jobs(going)
        finally:
            self.sending.release()

    async def _send_jobs(self, going: list[tuple[Job, Held]]) -> None:
        """The jobs with their fragments' text (read in one worker thread for all of them)
        and their Execute spans' ids: in `jobs` messages to a worker of version 2, each
        job's text encoded once; one `job` a message to an older one."""
        if any(fragments.MARKER_OPEN in job["prompt"] for job, _ in going):
            outgoing = await database_sync_to_async(all_filled, thread_sensitive=False)(
                [job for job, _ in going], self.run_context
            )
        else:
            outgoing = [dict(job) for job, _ in going]
        for job, (_, held) in zip(outgoing, going, strict=True):
            job["execute_span"] = held.execute_span
            job["grant"] = grant_for(self.worker.id, held.run_id, held.sq_id)
            if held.queued:
                job["queued"] = True
        if not self.batched:
            for job in outgoing:
                await self.consumer.send(encode({"type": "job", "job": job}))
            return
        for text in batches([encode(job) for job in outgoing], '"type":"jobs","jobs":'):
            await self.consumer.send(text)

    def _claim(self, held: Held, status: str) -> dict[str, Any]:
        """What the conductor is told of a job this worker holds: `queued` in its buffer,
        or `started`."""
        claim = {
            "run_id": held.run_id,
            "sq_id": held.sq_id,
            "venue": self.venue,
            "worker_id": self.worker.id,
            "status": status,
        }
        if status == "started":
            # The conductor keeps it: should this server die with the job, the conductor
            # ends the span as abandoned when it finds the worker gone (liveness), as it
            # does a broker worker's. It stayed open for good (a review).
            claim["span"] = held.execute_span
        return encode_result(claim)  # type: ignore[arg-type]

    def _execute_event(
        self, held: Held, phase: str, status: str, *, event_id: str = "", **fields: Any
    ) -> dict[str, Any]:
        """An event of the job's Execute span, in this worker's name."""
        event: dict[str, Any] = {
            "run_id": held.run_id,
            "event_id": event_id or secrets.token_hex(8),
            "span_id": held.execute_span,
            "parent_id": held.submit_span,
            "links": [],
            "name": "SubQuery.Execute",
            "phase": phase,
            "ts": time.time_ns(),
            "status": status,
            "venue": self.venue,
            "worker_id": self.worker.id,
            "depth": held.depth,
            # The model asked for; the worker's end event says which served it.
            "attrs": {"sq_id": held.sq_id, "model": held.model},
        }
        if "ms" in fields:
            event["ms"] = fields.pop("ms")
        event["attrs"].update(fields)
        return event

    def run_context(self, run_id: str) -> str | None:
        """The run's context file, asked of the database once per run (in a worker thread)."""
        if run_id not in self.contexts:
            self.contexts[run_id] = self.consumer.run_context(run_id)
        return self.contexts[run_id]

    # --- messages in --------------------------------------------------------------------
    async def on_message(self, message: dict[str, Any]) -> None:
        if self.closed:
            return  # lost, its socket closing: a late beat must not announce it again
        self.heard = time.monotonic()
        kind = message["type"]
        if kind == "results":
            await self._results(message)
        elif kind == "done":
            await self._done(message)
        elif kind == "returned":
            await self._returned(message)
        elif kind == "beat":
            self.beaten = time.monotonic()
            await self._beat(message.get("figures"))
        elif kind == "pong":
            sent = message.get("t")
            if isinstance(sent, int | float) and not isinstance(sent, bool):
                rtt_s = time.monotonic() - float(sent)
                # Only the echo of a ping of ours: -1e308 made the round trip infinite.
                if 0 <= rtt_s <= PONG_WITHIN_S:
                    self.rtt_ms = round(rtt_s * 1000, 2)
        else:
            raise ProtocolError(f"unknown message type {kind[:40]!r}")

    async def _done(self, message: dict[str, Any]) -> None:
        """One result (version 1): a malformed one breaks the protocol and closes the
        connection; one for a job the worker does not hold is dropped."""
        try:
            relayed = checked(message, self.held, self.venue, self.worker.id)
        except NotHeld as exc:
            log.warning("gateway: worker %s: %s; dropped", self.worker.id, exc)
            return
        await self._relay([relayed], [], [])

    async def _results(self, message: dict[str, Any]) -> None:
        """Several results (version 2), each checked alone: one that cannot be relayed
        loses only itself, and the worker is told which and why (`refused`); one for a job
        it holds ends that job, its Execute span closed as an error."""
        items = message.get("results")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_RESULTS:
            raise ProtocolError(f"results must be a list of 1 to {MAX_RESULTS} results")
        relayed: list[Relayed] = []
        refused: list[dict[str, str]] = []
        dropped: list[tuple[Held, str]] = []  # held jobs whose result was refused
        seen: set[tuple[str, str]] = set()
        begun: list[Held] = []  # queued jobs the worker says it has started
        for item in items:
            if isinstance(item, dict) and "started" in item:
                held = started(item, self.held)
                if held is not None:
                    held.queued = False
                    begun.append(held)
                continue
            try:
                one = checked(item, self.held, self.venue, self.worker.id, seen=seen)
            except ProtocolError as exc:
                sq_id = item.get("sq_id") if isinstance(item, dict) else None
                refused.append({"sq_id": str(sq_id)[:40], "error": str(exc)})
                held = None if isinstance(exc, NotHeld) else named(item, self.held)
                if held is not None and held.key not in seen:
                    seen.add(held.key)
                    dropped.append((held, str(exc)))
                continue
            seen.add(one.held.key)
            relayed.append(one)
        await self._relay(relayed, dropped, begun)
        if refused:
            log.warning(
                "gateway: worker %s: %d result(s) refused: %s",
                self.worker.id,
                len(refused),
                refused[0]["error"],
            )
            await self.consumer.send(
                encode({"type": "refused", "results": refused, "fix": REFUSED_FIX})
            )

    async def _returned(self, message: dict[str, Any]) -> None:
        """Jobs of a session that dropped, given back (version 5): each job's run is told
        (status `returned`), so its conductor tries the job again now instead of at its
        timeout. Only a job named with its grant (a MAC this server's secret made for this
        worker when a server gave it the job, grant_for) is, and only where the run's
        result stream exists; the conductor takes a return only from the job's holder. A
        job this session holds is not given back."""
        items = message.get("jobs")
        keys, forged = granted_returns(items, self.worker.id, self.returned)
        self.returned += len(items)
        if forged:
            log.warning(
                "gateway: worker %s gave back %d job(s) it was not given; ignored",
                self.worker.id,
                forged,
            )
        keys = [key for key in dict.fromkeys(keys) if key not in self.held]
        if not keys:
            return
        pipe = self.redis.pipeline(transaction=False)
        for run_id, _ in keys:
            pipe.exists(results_stream(run_id))
        there = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        for (run_id, sq_id), exists in zip(keys, there, strict=True):
            if exists:
                given = {"run_id": run_id, "sq_id": sq_id, "status": "returned"}
                pipe.xadd(results_stream(run_id), {**given, "worker_id": self.worker.id})
        await pipe.execute()
        log.warning(
            "gateway: worker %s gave back %d job(s) of a session that dropped",
            self.worker.id,
            len(keys),
        )

    async def _relay(
        self, relayed: list[Relayed], dropped: list[tuple[Held, str]], begun: list[Held]
    ) -> None:
        """The results and their events on the runs' streams, with the ends of the Execute
        spans of jobs whose result was refused, the starts of queued jobs the worker began
        (`begun`), and the next jobs for the slots they free: one round trip. The conductor
        is told of each refused one (status `refused`, the worker stamped here, the
        reason), so it sends that job elsewhere at once instead of waiting for its
        sub-query timeout."""
        # A queued job answered (or refused) without its start said opens its span now:
        # no span of the trace is left without its start.
        answered = [*(one.held for one in relayed), *(held for held, _ in dropped)]
        begun = [*begun, *slots_freed(self.held, answered, begun)]
        unsaid = [held for held in answered if held.queued]
        for held in unsaid:
            held.queued = False
        opened = [self._execute_event(held, "start", "ok") for held in [*begun, *unsaid]]
        ends = [
            self._execute_event(held, "end", "error", error=f"refused: {why}")
            for held, why in dropped
        ]
        events = [*opened, *ends, *(event for one in relayed for event in one.events)]
        if not events and not relayed:
            return
        pipe = self.redis.pipeline(transaction=False)
        if events:
            pipe.eval(APPEND_LUA, 0, *append_args(events))  # type: ignore[arg-type]
        for held in begun:
            pipe.xadd(results_stream(held.run_id), self._claim(held, "started"))  # type: ignore[arg-type]
        for one in relayed:
            stream = results_stream(one.held.run_id)
            pipe.xadd(stream, encode_result(one.result))  # type: ignore[arg-type]
        for held, why in dropped:
            refusal = {"run_id": held.run_id, "sq_id": held.sq_id, "status": "refused"}
            refusal |= {"worker_id": self.worker.id, "error": why[:300]}
            pipe.xadd(results_stream(held.run_id), refusal)  # type: ignore[arg-type]
        waiting = self._ask_cancelled(pipe)
        # Only the slots these results free: the pump fills the others.
        going: list[tuple[Job, Held]] = []
        self.credit.answered(
            sum(one.result.get("status") == "ok" for one in relayed), self.slots + self.buffer
        )
        async with self.popping:
            freed = min(len(answered), self._free(len(answered)))
            if freed:
                pipe.eval(pump.TAKE_LUA, *self.hand.take_args(freed))
            # Guarded: a session that ends meanwhile empties its hand only after it.
            replies = await self.pops.guard(pipe.execute())
            for held in answered:
                self.held.pop(held.key, None)
            end = len(replies) - (1 if freed else 0)
            gone = self._take_back(waiting, replies[end - len(waiting) : end])
            # Under the lock, the pump never sees the freed slots before they are filled.
            if freed and replies[-1][1]:
                going = await self._take(wire.popped(self.queues, replies[-1]), self.hand)
            if going:
                await self.sending.acquire()
        if going:
            await self._send_in_turn(going)
        await self._cancel(gone)
        self._update_room()

    def _ask_cancelled(self, pipe: Any) -> list[Held]:
        """Ask on `pipe` whether each job still waiting in its buffer was cancelled
        meanwhile (_take_back reads the answers); the jobs asked about, in order."""
        waiting = [held for held in self.held.values() if held.queued]
        for held in waiting:
            pipe.sismember(cancelled_key(held.run_id), held.sq_id)
        return waiting

    def _take_back(self, waiting: list[Held], cancelled: list[Any]) -> list[Held]:
        """The queued jobs among `waiting` that were cancelled (`cancelled`: SISMEMBER's
        answers), no longer held: the worker is told to skip them (_cancel), so a hedge's
        loser or a job the batch cut off is not run from the buffer, and the pump fills
        their places. A broker worker skips such a job as it starts it."""
        gone = [
            held
            for held, flag in zip(waiting, cancelled, strict=True)
            if flag and held.queued and self.held.get(held.key) is held
        ]
        for held in gone:
            del self.held[held.key]
        return gone

    async def _cancel(self, gone: list[Held]) -> None:
        if gone and self.buffer:  # a worker of version 3 and up skips them
            jobs = [{"run_id": held.run_id, "sq_id": held.sq_id} for held in gone]
            await self.consumer.send(encode({"type": "cancel", "jobs": jobs}))

    async def _check_waiting(self) -> None:
        """Each heartbeat: whether any job waiting in its buffer was cancelled."""
        pipe = self.redis.pipeline(transaction=False)
        if waiting := self._ask_cancelled(pipe):
            await self._cancel(self._take_back(waiting, await pipe.execute()))
            self._update_room()

    async def _append(self, events: list[dict[str, Any]]) -> None:
        if events:
            await self.redis.eval(APPEND_LUA, 0, *append_args(events))  # type: ignore[arg-type]

    # --- presence -----------------------------------------------------------------------
    async def _beat(self, raw: Any) -> None:
        try:
            figures = services.figures_clean(raw)
        except services.WorkerError as exc:
            raise ProtocolError(str(exc)) from exc
        self.draining = bool(figures.get("draining"))
        self._update_room()
        await self._announce(figures)

    async def _announce(self, figures: Any) -> None:
        link: Link = {"connection": "gateway", "address": self.consumer.address}
        link["concurrency"] = max(1, min(self.slots, self.credit.room(self.slots)))
        if self.rtt_ms is not None:
            link["rtt_ms"] = self.rtt_ms
        try:
            await database_sync_to_async(services.worker_heartbeat, thread_sensitive=False)(
                self.worker, figures, link
            )
        except services.WorkerError as exc:
            await self.consumer.refuse(4410, str(exc), exc.fix)

    async def _watch(self) -> None:
        """A ping each heartbeat; silence past FRLM_GATEWAY_SILENCE_S is a loss, and so is
        a worker that sends no beat for its presence's life (answering pings keeps a socket,
        not a presence), or that was deregistered meanwhile: one that beat no more kept its
        session and its pump took jobs the conductor then refused to hear of, which waited
        out their timeout (a review)."""
        limit = float(settings.FRLM_GATEWAY_SILENCE_S)
        beat_limit = float(settings.FRLM_VENUE_HEARTBEAT_TTL_S)
        group = presence_group(self.venue)
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if time.monotonic() - self.heard > limit:
                await self.lost(f"it was silent for more than {limit:g} s")
                await self.consumer.close(code=4408)
                return
            if time.monotonic() - self.beaten > beat_limit:
                await self.lost(f"it sent no heartbeat for more than {beat_limit:g} s")
                await self.consumer.close(code=4408)
                return
            if await self.redis.exists(presence.barred_key(group, self.worker.id)):
                # Its pump stops now, not when the socket's close is done: until then it
                # took jobs off the venue's queue in a name the conductor refuses.
                await self.lost(f"worker {self.worker.id} was deregistered")
                await self.consumer.refuse(
                    4410,
                    f"worker {self.worker.id} was deregistered",
                    "stop this worker, or register again with an enrolment token",
                )
                return
            await self.consumer.send(encode({"type": "ping", "t": time.monotonic()}))
            await self._check_waiting()
            late = self.credit.overdue(self.held.values(), time.monotonic())
            await self._let_go(late, "held far past its timeout: taken back by the gateway")
            await self._cancel(late)  # else the worker's next jobs wait behind them
            await self.credit.save(self.redis)
            self._update_room()
