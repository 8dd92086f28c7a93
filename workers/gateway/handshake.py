"""The gateway's door: a Channels consumer per connection. Nothing but the challenge is
answered before a hello signed with the worker's registered key; then the connection is
the worker's session (workers/gateway/server.py, `WorkerLink`), and every message goes to
it. A message that breaks the protocol closes the connection (4400) with what is wrong."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from workers import keys, services
from workers.gateway.fill import RunContext
from workers.gateway.protocol import (
    VERSION,
    ProtocolError,
    decode,
    encode,
    hello_claim,
    speaks_batches,
    speaks_buffer,
)
from workers.gateway.server import WorkerLink
from workers.models import Worker

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
# The most a message may be before its sender has proved who it is: a hello is a few hundred
# bytes. Parsed first, a 39 MB list from a stranger took the web server to 1.1 GB and held
# its event loop for 3 s (a review).
HELLO_MAX_CHARS = 4096
REPLACED_FIX = (
    "nothing, if this worker connected again after its connection dropped: the newer "
    "connection serves it. Otherwise another process holds this worker's key: run one "
    "frlm_worker per worker"
)

# The connection serving each worker in this process: one a worker. Two would each take
# its slots' worth of jobs, and a new one's first step (returning what its sessions before
# popped and never claimed, workers/gateway/pump.py) would take the other's in hand.
_SERVING: dict[str, GatewayConsumer] = {}


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
        self.gone = False  # its connection closed
        self.serves: str | None = None  # the worker it is, or was, _SERVING's entry for
        self.ending: asyncio.Future[None] | None = None  # the end of the one it replaces
        self._hello_timer: asyncio.TimerHandle | None = None
        self.nonce = secrets.token_urlsafe(24)
        client = self.scope.get("client") or ["", 0]
        self.address = str(client[0] or "")
        await self.accept()
        retry = await sync_to_async(services.auth_throttle, thread_sensitive=False)(self.address)
        if retry is not None:
            await self.refuse(
                4429,
                services.throttled_error(self.address),
                services.throttled_fix(retry),
                retry_after=retry,  # a worker waits it out and connects again
            )
            return
        await self.send(encode({"type": "challenge", "nonce": self.nonce, "version": VERSION}))
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, lambda: asyncio.ensure_future(self._no_hello())
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.link is None:
            await self._before_hello(text_data)
            return
        try:
            await self.link.on_message(decode(text_data))
        except ProtocolError as exc:
            await self.refuse(4400, str(exc), "follow workers/gateway/protocol.py")

    async def _before_hello(self, text_data: str | None) -> None:
        """A stranger's message: read only if it is small enough to be a hello, and a broken
        one counts against its address, as a failed signature does."""
        fix = "follow workers/gateway/protocol.py: the first message is hello"
        if text_data is None or len(text_data) > HELLO_MAX_CHARS:
            size = "a binary message" if text_data is None else f"{len(text_data):,} characters"
            await self.unauthenticated(
                4400, f"before hello a message is at most {HELLO_MAX_CHARS:,} characters, "
                f"not {size}", fix)  # fmt: skip
            return
        try:
            await self._hello(decode(text_data))
        except ProtocolError as exc:
            await self.unauthenticated(4400, str(exc), fix)

    async def disconnect(self, code: int) -> None:
        self.gone = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self.link is not None:
            # Serving still until its session has ended: a newer connection of the
            # worker waits for that (replaced) before it starts.
            await self.link.lost(f"its connection closed (code {code})")
        if self.serves is not None and _SERVING.get(self.serves) is self:
            del _SERVING[self.serves]

    async def replaced(self) -> None:
        """A newer connection of this worker said hello: this one's session ends, to its
        end (out of presence, its hand emptied: the newer one then announces the worker
        and takes what the hand kept for it), and it is closed."""
        if self.link is not None:
            await self.link.lost("a newer connection of this worker took its place")
        elif self.ending is not None:  # it was itself waiting for an older one to end
            await _ended(self.ending)
        if not self.gone:
            try:
                await self.refuse(4409, "a newer connection of this worker took this one's "
                                  "place", REPLACED_FIX)  # fmt: skip
            except Exception:  # noqa: BLE001 - its socket went meanwhile: nothing to tell
                log.info("gateway: %s was gone before it could be told it was replaced",
                         self.address)  # fmt: skip

    async def refuse(self, code: int, error: str, fix: str, **extra: Any) -> None:
        log.warning("gateway: refused %s (%s): %s", self.address, self._who(), error)
        await self.send(encode({"type": "error", "error": error, "fix": fix, **extra}))
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
        earlier = _SERVING.get(worker.id)
        _SERVING[worker.id] = self
        self.serves = worker.id
        if earlier is not None and earlier is not self:
            # Shielded, and kept: a newer hello that replaces this one before it starts
            # waits for the same end (replaced), not only for this one's.
            self.ending = asyncio.ensure_future(earlier.replaced())
            await _ended(self.ending)
        if _SERVING.get(worker.id) is not self or self.gone:
            return  # a newer hello of the worker came meanwhile, or this one closed
        self.link = WorkerLink(
            self,
            worker,
            min(slots, worker.concurrency),
            batched=speaks_batches(message.get("version")),
            buffered=speaks_buffer(message.get("version")),
        )
        try:
            await self.link.start()
        except BaseException:
            # Announced before its welcome: a start that failed after that leaves no
            # worker in presence with no session, and its hand emptied (a review).
            try:
                await self.link.lost("its session failed to start")
            finally:
                if _SERVING.get(worker.id) is self:
                    del _SERVING[worker.id]
            raise


async def _ended(ending: asyncio.Future[None]) -> None:
    """Wait for an older connection's end. One that failed is ended all the same: its
    error, raised here, would stop this connection and every newer one that waits for the
    same end (a review)."""
    try:
        await asyncio.shield(ending)
    except Exception:  # noqa: BLE001 - logged; the older session's end already is
        log.exception("gateway: replacing an older connection failed; this one goes on")


def _load_worker(worker_id: str) -> Worker | None:
    return Worker.objects.select_related("venue").filter(id=worker_id).first()
