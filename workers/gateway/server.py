"""The gateway's server side: a Channels consumer, one per connected worker.

1. challenge: the worker proves it holds its registered key by signing a fresh nonce
   (no strike when it cannot: an unauthenticated caller is nobody's fault but its own);
2. pump: while the worker has a free slot, take the next job of its own queue or its
   venue's (the same Redis lists Celery workers consume, so the conductor cannot tell the
   two kinds apart), tell the conductor who holds it, open its Execute span, read its
   fragments here (byte range, sha256) and send it;
3. relay: the worker's results and span events go to the run's result stream and the event
   stream, stamped with the identity it proved; a result for a job it does not hold, or an
   event of another kind or another run, is dropped;
4. watch: a ping each heartbeat measures the round trip; a worker silent past three
   heartbeats, or whose connection drops, leaves presence at once, and each run it held
   work of is told to look (a `lost` hint), so the conductor re-dispatches within one read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff

from frlm_web import presence
from frlm_web.redis_client import OUTAGE_ERRORS, RETRY_ATTEMPTS, RETRY_BACKOFF, get_redis
from traces.emitter import APPEND_LUA, append_args
from workers import fragments, keys, services
from workers.gateway.protocol import (
    MAX_EVENTS,
    VERSION,
    WORKER_EVENTS,
    ProtocolError,
    celery_job,
    decode,
    encode,
    hello_claim,
)
from workers.jobs import Job, cancelled_key, encode_result, results_stream
from workers.models import Worker
from workers.venues import Link, presence_group

log = logging.getLogger(__name__)

SUBQUERY_TASK = "workers.subquery_execute"
RunContext = Callable[[str], "str | None"]
HELLO_TIMEOUT_S = 10.0
# Seconds a pump waits on the queues before it looks again whether it should stop.
POP_WAIT_S = 1
EVENT_KEYS = ("ms", "bytes", "tokens_in", "tokens_out", "cost", "payload_ref")


@functools.cache
def _async_redis(loop_id: int) -> aioredis.Redis:
    # A Redis restart or a network blip is ridden out command by command, as by the
    # process's other client (frlm_web.redis_client.get_redis); a pump whose pop still
    # fails closes its worker's socket, and the worker connects again.
    base, cap = RETRY_BACKOFF
    return aioredis.Redis.from_url(
        settings.REDIS_URL,
        retry=AsyncRetry(ExponentialBackoff(cap=cap, base=base), RETRY_ATTEMPTS),
        retry_on_error=list(OUTAGE_ERRORS),
    )


def async_redis() -> aioredis.Redis:
    """One asyncio client (and pool) per event loop: daphne runs one."""
    return _async_redis(id(asyncio.get_running_loop()))


@dataclasses.dataclass
class Held:
    """A job the worker holds: given to it and not yet answered, and its Execute span."""

    run_id: str
    sq_id: str
    submit_span: str
    execute_span: str
    depth: int
    model: str  # the model the job asks for


class GatewayConsumer(AsyncWebsocketConsumer):
    """One worker's connection. Nothing but the challenge is answered before `hello`.
    `run_context` (given by the URL routing: workers import nothing of runs) names a run's
    context file."""

    # No channel layer: nothing is sent to a worker through groups, and a layer would hold
    # a Redis connection and a blocking pop per connected worker. (Channels gives a
    # consumer no layer when its alias names none.)
    channel_layer_alias = "no-channel-layer"

    def __init__(self, *args: Any, run_context: RunContext, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_context = run_context

    async def dispatch(self, message: dict[str, Any]) -> None:
        """As Channels dispatches, without closing stale database connections in the sync
        thread before every message (a thread hop per result): the handlers here reach the
        database only through database_sync_to_async, which does that itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.link: WorkerLink | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self.nonce = secrets.token_urlsafe(24)
        client = self.scope.get("client") or ["", 0]
        self.address = str(client[0] or "")
        await self.accept()
        retry = await sync_to_async(services.auth_throttle, thread_sensitive=False)(self.address)
        if retry is not None:
            await self.refuse(
                4429, services.throttled_error(self.address), services.throttled_fix(retry)
            )
            return
        await self.send(encode({"type": "challenge", "nonce": self.nonce, "version": VERSION}))
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, lambda: asyncio.ensure_future(self._no_hello())
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = decode(text_data)
            if self.link is None:
                await self._hello(message)
            else:
                await self.link.on_message(message)
        except ProtocolError as exc:
            await self.refuse(4400, str(exc), "follow workers/gateway/protocol.py")

    async def disconnect(self, code: int) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self.link is not None:
            await self.link.lost(f"its connection closed (code {code})")

    async def refuse(self, code: int, error: str, fix: str) -> None:
        log.warning("gateway: refused %s (%s): %s", self.address, self._who(), error)
        await self.send(encode({"type": "error", "error": error, "fix": fix}))
        await self.close(code=code)

    async def unauthenticated(self, code: int, error: str, fix: str) -> None:
        """A hello that proves nothing: counted against the address (as the worker API
        counts its failures, workers.services.auth_failed), never against a worker."""
        await sync_to_async(services.auth_failed, thread_sensitive=False)(self.address)
        await self.refuse(code, error, fix)

    def _who(self) -> str:
        return self.link.worker.id if self.link else "before hello"

    async def _no_hello(self) -> None:
        if self.link is None:
            await self.refuse(4408, f"no hello within {HELLO_TIMEOUT_S:g} s", "sign the nonce")

    async def _hello(self, message: dict[str, Any]) -> None:
        """The worker names itself and signs the nonce; the server checks it against the
        key the worker registered, then starts serving it."""
        if message.get("type") != "hello":
            raise ProtocolError("the first message must be hello {worker_id, nonce, sig}")
        worker_id, sig, slots = message.get("worker_id"), message.get("sig"), message.get("slots")
        if not isinstance(worker_id, str) or not isinstance(sig, str):
            raise ProtocolError("hello needs worker_id and sig, strings")
        worker = await database_sync_to_async(_load_worker)(worker_id[:64])
        fix = "register with an enrolment token (POST /api/workers/register), then say hello"
        if worker is None:
            await self.unauthenticated(4404, f"no worker {worker_id[:64]!r}", fix)
            return
        if worker.status == Worker.Status.DEREGISTERED:
            await self.unauthenticated(4410, f"worker {worker.id} was deregistered", fix)
            return
        if not keys.verify(worker.public_key, hello_claim(worker.id, self.nonce), sig):
            await self.unauthenticated(
                4401,
                "the signature does not match this worker's registered key",
                "sign workers.gateway.protocol.hello_claim(worker_id, nonce) with the key "
                "the worker registered",
            )
            return
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            slots = worker.concurrency
        self.link = WorkerLink(self, worker, min(slots, worker.concurrency))
        await self.link.start()


def _load_worker(worker_id: str) -> Worker | None:
    return Worker.objects.select_related("venue").filter(id=worker_id).first()


class WorkerLink:
    """An authenticated worker's session: its pump, its watch, the jobs it holds."""

    def __init__(self, consumer: GatewayConsumer, worker: Worker, slots: int) -> None:
        self.consumer = consumer
        self.worker = worker
        self.slots = slots
        self.venue = worker.venue.name
        self.queues = [worker.queue, worker.venue.queue]
        self.held: dict[str, Held] = {}
        self.room = asyncio.Event()
        self.draining = False
        self.heard = time.monotonic()
        self.rtt_ms: float | None = None
        self.heartbeat_s = float(settings.FRLM_WORKER_HEARTBEAT_S)
        self.tasks: list[asyncio.Task] = []
        self.closed = False
        self.redis = async_redis()
        self.contexts: dict[str, str | None] = {}  # run id -> its context file (cached)

    # --- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.consumer.send(
            encode(
                {
                    "type": "welcome",
                    "worker_id": self.worker.id,
                    "venue": self.venue,
                    "heartbeat_s": self.heartbeat_s,
                    "slots": self.slots,
                }
            )
        )
        # In presence at once, not a heartbeat later: the conductor may route to it now.
        await self._announce({"inflight": 0, "memory_mb": 0.0, "latency_ms": None})
        self._update_room()
        self.tasks = [asyncio.ensure_future(self._pump()), asyncio.ensure_future(self._watch())]
        log.info(
            "gateway: worker %s of %s connected from %s",
            self.worker.id,
            self.venue,
            self.consumer.address,
        )

    async def lost(self, why: str) -> None:
        """Out of presence now; every run it held work of told to look; and the Execute
        spans the server opened for that work ended as `abandoned`, so the trace has no
        span left open by a worker that is gone."""
        if self.closed:
            return
        self.closed = True
        for task in self.tasks:
            task.cancel()
        await sync_to_async(_withdraw, thread_sensitive=False)(self.venue, self.worker.id)
        if self.held:
            pipe = self.redis.pipeline(transaction=False)
            ends = []
            for sq_id, held in self.held.items():
                hint = {"run_id": held.run_id, "sq_id": sq_id, "status": "lost"}
                pipe.xadd(results_stream(held.run_id), {**hint, "worker_id": self.worker.id})
                ends.append(
                    self._execute_event(held, "end", "abandoned", error=f"worker lost: {why}")
                )
            pipe.eval(APPEND_LUA, 0, *append_args(ends))  # type: ignore[arg-type]
            await pipe.execute()
        log.warning(
            "gateway: worker %s left: %s; it held %d job(s)", self.worker.id, why, len(self.held)
        )

    # --- jobs out -----------------------------------------------------------------------
    def _update_room(self) -> None:
        if len(self.held) < self.slots and not self.draining:
            self.room.set()
        else:
            self.room.clear()

    async def _pump(self) -> None:
        try:
            while True:
                await self.room.wait()
                popped = await self.redis.brpop(self.queues, timeout=POP_WAIT_S)
                if popped is None:
                    continue
                await self._take(popped[1])
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gateway: the pump of worker %s failed", self.worker.id)
            await self.consumer.close(code=1011)

    async def _take(self, raw: bytes) -> None:
        """One message off a queue: claimed for this worker, filled, sent."""
        try:
            task, job = celery_job(raw)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            log.error("gateway: a message on %s is not a Celery task: %s", self.queues, exc)
            return
        if task != SUBQUERY_TASK:
            log.error("gateway: %s is not a sub-query task; dropped", task[:80])
            return
        run_id, sq_id = job["run_id"], job["sq_id"]
        if job["deadline"] < time.time():
            return  # nobody wants it any more (the conductor has moved on)
        held = self.held[sq_id] = Held(
            run_id,
            sq_id,
            job["submit_span"],
            secrets.token_hex(8),
            job["depth"],
            str(job["model"].get("model", "")),
        )
        self._update_room()
        # In one round trip: who holds it, before anything else can go wrong (if this
        # worker vanishes now, the conductor knows which job to send elsewhere); the start
        # of its Execute span, which the server opens as it hands the job over (the worker
        # ends it: one message a job from the worker, not two); and whether it was
        # cancelled meanwhile (then the claim is a late reply the conductor ignores).
        claim = {
            "run_id": run_id,
            "sq_id": sq_id,
            "venue": self.venue,
            "worker_id": self.worker.id,
            "status": "started",
        }
        start = self._execute_event(held, "start", "ok")
        pipe = self.redis.pipeline(transaction=False)
        pipe.sismember(cancelled_key(run_id), sq_id)
        pipe.xadd(results_stream(run_id), encode_result(claim))  # type: ignore[arg-type]
        pipe.eval(APPEND_LUA, 0, *append_args([start]))  # type: ignore[list-item]
        cancelled, _, _ = await pipe.execute()
        if cancelled:
            del self.held[sq_id]
            self._update_room()
            end = self._execute_event(held, "end", "cancelled", ms=0.0)
            await self._append([end])
            return
        if fragments.MARKER_OPEN in job["prompt"]:
            outgoing = await database_sync_to_async(_filled, thread_sensitive=False)(
                job, self.run_context
            )
        else:
            outgoing = dict(job)
        outgoing["execute_span"] = held.execute_span
        await self.consumer.send(encode({"type": "job", "job": outgoing}))

    def _execute_event(self, held: Held, phase: str, status: str, **fields: Any) -> dict[str, Any]:
        """An event of the job's Execute span, in this worker's name."""
        event: dict[str, Any] = {
            "run_id": held.run_id,
            "event_id": secrets.token_hex(8),
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
        self.heard = time.monotonic()
        kind = message["type"]
        if kind == "done":
            await self._done(message)
        elif kind == "beat":
            await self._beat(message.get("figures"))
        elif kind == "pong":
            sent = message.get("t")
            if isinstance(sent, int | float) and not isinstance(sent, bool):
                self.rtt_ms = round(max(0.0, time.monotonic() - float(sent)) * 1000, 2)
        else:
            raise ProtocolError(f"unknown message type {kind[:40]!r}")

    async def _done(self, message: dict[str, Any]) -> None:
        held = self._held(message)
        result = message.get("result")
        if held is None:
            return
        if not isinstance(result, dict) or result.get("status") not in ("ok", "error", "cancelled"):
            raise ProtocolError("done needs a result with status ok, error or cancelled")
        events = self._events(message, held)
        sq_id = str(message["sq_id"])
        # The server's word on who, which run and which venue; the worker's signature
        # covers them, so a worker that signed for another identity fails at the conductor.
        stamped = {
            **{k: v for k, v in result.items() if isinstance(v, str | int | float)},
            "run_id": held.run_id,
            "sq_id": sq_id,
            "venue": self.venue,
            "worker_id": self.worker.id,
        }
        pipe = self.redis.pipeline(transaction=False)
        if events:
            pipe.eval(APPEND_LUA, 0, *append_args(events))
        pipe.xadd(results_stream(held.run_id), encode_result(stamped))  # type: ignore[arg-type]
        await pipe.execute()
        del self.held[sq_id]
        self._update_room()

    def _held(self, message: dict[str, Any]) -> Held | None:
        sq_id = message.get("sq_id")
        held = self.held.get(sq_id) if isinstance(sq_id, str) else None
        if held is None:
            log.warning(
                "gateway: worker %s spoke of a job it does not hold (%r); dropped",
                self.worker.id,
                str(sq_id)[:40],
            )
        return held

    def _events(self, message: dict[str, Any], held: Held) -> list[dict[str, Any]]:
        """The worker's span events of this job, rebuilt from known fields only, with the
        run, venue and worker set by the server."""
        raw = message.get("events") or []
        if not isinstance(raw, list) or len(raw) > MAX_EVENTS:
            raise ProtocolError(f"events must be a list of at most {MAX_EVENTS}")
        events = []
        for item in raw:
            if not isinstance(item, dict) or item.get("name") not in WORKER_EVENTS:
                raise ProtocolError("a worker reports only " + ", ".join(sorted(WORKER_EVENTS)))
            # The worker ends the Execute span the server opened, and hangs its instants
            # under it; nothing else.
            if item["name"] == "SubQuery.Execute":
                if item.get("span_id") != held.execute_span or item.get("phase") != "end":
                    raise ProtocolError("a worker only ends the Execute span it was given")
                parent = held.submit_span
            else:
                parent = held.execute_span
            if item.get("parent_id") != parent:
                raise ProtocolError(f"a {item['name']} event hangs under the wrong span")
            attrs = item.get("attrs") if isinstance(item.get("attrs"), dict) else {}
            event = {
                "run_id": held.run_id,
                "event_id": str(item.get("event_id", ""))[:32] or secrets.token_hex(8),
                "span_id": str(item.get("span_id", ""))[:32] or secrets.token_hex(8),
                "parent_id": parent,
                "links": [],
                "name": item["name"],
                "phase": item.get("phase")
                if item.get("phase") in ("start", "end", "instant")
                else "instant",
                "ts": item["ts"] if isinstance(item.get("ts"), int) else time.time_ns(),
                "status": str(item.get("status", "ok"))[:16],
                "venue": self.venue,
                "worker_id": self.worker.id,
                "depth": item["depth"] if isinstance(item.get("depth"), int) else 0,
                "attrs": attrs,
            }
            for key in EVENT_KEYS:
                if isinstance(item.get(key), int | float | str) and not isinstance(item[key], bool):
                    event[key] = item[key]
            events.append(event)
        return events

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
        if self.rtt_ms is not None:
            link["rtt_ms"] = self.rtt_ms
        try:
            await database_sync_to_async(services.worker_heartbeat, thread_sensitive=False)(
                self.worker, figures, link
            )
        except services.WorkerError as exc:
            await self.consumer.refuse(4410, str(exc), exc.fix)

    async def _watch(self) -> None:
        """A ping each heartbeat; silence past FRLM_GATEWAY_SILENCE_S is a loss."""
        limit = float(settings.FRLM_GATEWAY_SILENCE_S)
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if time.monotonic() - self.heard > limit:
                await self.lost(f"it was silent for more than {limit:g} s")
                await self.consumer.close(code=4408)
                return
            await self.consumer.send(encode({"type": "ping", "t": time.monotonic()}))


def _withdraw(venue: str, worker_id: str) -> None:
    presence.withdraw(get_redis(), presence_group(venue), worker_id)


def _filled(job: Job, run_context: RunContext) -> dict[str, Any]:
    """The job with its fragments' text in `text` (the prompt stays as the conductor wrote
    it: that is what an attestation covers), or the reason they cannot be read in `error`.
    Only fragments of context files are read: the run's own, or the context store's."""
    try:
        for ref in fragments.refs(job["prompt"]):
            _check_context_path(job["run_id"], ref["path"], run_context)
        text, loaded = fragments.fill(job["prompt"])
    except fragments.FragmentError as exc:
        return {**job, "error": str(exc)}
    return {**job, "text": text, "loaded": loaded}


def _check_context_path(run_id: str, raw: str, run_context: RunContext) -> None:
    path = Path(os.path.realpath(raw))
    store = Path(os.path.realpath(settings.FRLM_CONTEXT_DIR))
    if path.is_relative_to(store):
        return
    own = run_context(run_id)
    if own and path == Path(os.path.realpath(own)):
        return
    raise fragments.FragmentError(
        f"the fragment's file {raw[:200]} is not a context of run {run_id}; the gateway "
        "serves only the run's context and the context store"
    )
