"""The live socket of a run page: `ws/runs/<id>`.

1. connect: a signed-in user (else close 4401) who may see the run (else 4403) joins the
   run's group, and its session's: signing out closes the socket (4401) at once, and a
   session that ends otherwise (expired, its password changed, the user deactivated) is
   found within SESSION_CHECK_S; `?after_seq=N` in the URL, or a first message
   `{"after_seq": N}`, asks for the events stored after N first (the catch-up),
2. then every live batch the publisher (traces.live, in the forwarder) sends, without the
   ones the catch-up already carried.

Live events come as they are emitted, before the recorder stores them. An event that does
not follow on from the last seq sent (a message the channel layer dropped, a forwarder that
restarted, a reconnect whose catch-up the store could not yet answer in full) is held back,
and the gap is filled from the store as soon as the recorder has stored it: a page sees
every event once, in seq order. A seq the store skips for good (an event the recorder
dead-lettered: the store already holds later ones) is passed over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from frlm_web import jsontext
from frlm_web.redis_client import get_redis
from traces import live
from traces.sessions import session_group

CATCH_UP_CHUNK = 5000  # events per message of a catch-up
GAP_POLL_S = 0.05  # how often the store is read while a gap waits for the recorder
SETTLE_S = (0.25, 1.0, 3.0)  # store reads after connecting (see _settle)

SESSION_CHECK_S = 10.0  # how often an open socket's session is read again (sessions.py)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


async def signed_in_still(session_key: str, user_pk: Any) -> bool:
    """Whether this session still signs in this user, read afresh as Channels' own check
    reads a socket's session at connect (the session exists, names the user, carries the
    hash of the user's current password, and the user may still sign in)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = await get_user({"session": store})
    return bool(user.is_authenticated and user.pk == user_pk)


class RunConsumer(AsyncJsonWebsocketConsumer):
    def __init__(self, *args: Any, access: Callable[[Any, str], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access = access
        self.group: str | None = None
        # The last seq this socket has sent; None until a catch-up fixes the starting point
        # (before that, live batches pass as they come).
        self.last_seq: int | None = None
        self.held: dict[int, list[Any]] = {}  # live events past a gap, by seq
        self.wanted = 0  # a burst announced up to this seq (trace.more): read from the store
        self.lock = asyncio.Lock()
        self.filler: asyncio.Task[None] | None = None
        self.settler: asyncio.Task[None] | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.guard: asyncio.Task[None] | None = None
        self.session_group: str | None = None

    async def connect(self) -> None:
        # Accept first so the page learns why it is closed (a refused handshake is 1006).
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if not await database_sync_to_async(self.access)(user, run_id):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.run_id = run_id
        session_key = self.scope["session"].session_key
        self.session_group = session_group(session_key)
        await self.channel_layer.group_add(self.session_group, self.channel_name)
        self.guard = asyncio.create_task(self._guard_session(session_key, user.pk))
        self.group = live.group_name(run_id)
        # Watched before joining: the forwarder publishes only runs some page watches.
        await self._watch()
        self.watcher = asyncio.create_task(self._keep_watching())
        # Join before reading the store: an event stored before the join is in the
        # catch-up, one published after it arrives live (and duplicates are dropped). One
        # published before the join but stored after the catch-up is read by _settle.
        await self.channel_layer.group_add(self.group, self.channel_name)
        query = parse_qs(self.scope.get("query_string", b"").decode())
        if "after_seq" in query:
            await self.catch_up(_seq(query["after_seq"][0]))
            self.settler = asyncio.create_task(self._settle())

    async def disconnect(self, code: int) -> None:
        for task in (self.filler, self.settler, self.watcher, self.guard):
            if task is not None:
                task.cancel()
        await self._leave_groups()

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        """What the page sent, or None when it cannot be read (not JSON, or nested too
        deeply): the page sends only {"after_seq": N}, and nothing else may take the socket
        down."""
        try:
            return jsontext.loads(text_data)
        except ValueError:
            return None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.group is not None and isinstance(content, dict) and "after_seq" in content:
            async with self.lock:
                await self.catch_up(_seq(content["after_seq"]))

    async def catch_up(self, after_seq: int) -> None:
        rows = await self._stored_after(after_seq)
        for start in range(0, len(rows), CATCH_UP_CHUNK):
            chunk = rows[start : start + CATCH_UP_CHUNK]
            await self.send_json({"type": "events", "catch_up": True, "events": chunk})
        self.last_seq = max(after_seq, rows[-1][0] if rows else after_seq)
        await self.send_json({"type": "caught_up", "last_seq": self.last_seq})
        await self._send_held(catch_up=False)
        self._watch_gap()

    # --- from the publisher ---
    async def trace_events(self, message: dict[str, Any]) -> None:
        events = message["events"]
        async with self.lock:
            if self.last_seq is None:  # no catch-up asked for: pass batches as they come
                await self.send_json({"type": "events", "events": events})
                return
            for event in events:
                if event[0] > self.last_seq:
                    self.held[event[0]] = event
            await self._send_held(catch_up=False)
            self._watch_gap()

    async def trace_more(self, message: dict[str, Any]) -> None:
        """A burst too big for the channel layer: it is (or soon will be) in the store."""
        async with self.lock:
            if self.last_seq is None:
                self.last_seq = 0
            self.wanted = max(self.wanted, message["last_seq"])
            self._watch_gap()

    # --- the session ---
    async def session_ended(self, message: dict[str, Any]) -> None:
        """Its session signed out (close_sessions_sockets)."""
        await self._close_signed_out()

    async def _guard_session(self, session_key: str, user_pk: Any) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_S)
            if not await signed_in_still(session_key, user_pk):
                await self._close_signed_out()
                return

    async def _close_signed_out(self) -> None:
        """Nothing more is sent: the groups are left before the close."""
        await self._leave_groups()
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def _leave_groups(self) -> None:
        for group in (self.group, self.session_group):
            if group is not None:
                await self.channel_layer.group_discard(group, self.channel_name)
        self.group = self.session_group = None

    # --- gaps ---
    async def _send_held(self, *, catch_up: bool) -> None:
        """Send the held events that follow on from the last seq sent."""
        assert self.last_seq is not None
        for seq in [s for s in self.held if s <= self.last_seq]:
            del self.held[seq]
        out: list[list[Any]] = []
        while self.last_seq + 1 in self.held:
            self.last_seq += 1
            out.append(self.held.pop(self.last_seq))
        for start in range(0, len(out), CATCH_UP_CHUNK):
            chunk = out[start : start + CATCH_UP_CHUNK]
            message: dict[str, Any] = {"type": "events", "events": chunk}
            if catch_up:
                message["catch_up"] = True
            await self.send_json(message)

    def _missing(self) -> bool:
        return self.last_seq is not None and (bool(self.held) or self.wanted > self.last_seq)

    def _watch_gap(self) -> None:
        if self._missing() and (self.filler is None or self.filler.done()):
            self.filler = asyncio.create_task(self._fill_gap())

    async def _fill_gap(self) -> None:
        """Read the store after the last seq sent until the gap is filled: the recorder
        stores what the forwarder sent ahead a moment later."""
        while True:
            async with self.lock:
                if not self._missing():
                    return
                await self._merge_stored()
                if not self._missing():
                    return
            await asyncio.sleep(GAP_POLL_S)

    async def _settle(self) -> None:
        """Look at the store a few times after connecting: an event the forwarder published
        just before this socket joined the group reaches it only from there."""
        for delay in SETTLE_S:
            await asyncio.sleep(delay)
            async with self.lock:
                await self._merge_stored()

    async def _merge_stored(self) -> None:
        assert self.last_seq is not None
        rows = await self._stored_after(self.last_seq)
        for row in rows:
            self.held.setdefault(row[0], row)
        await self._send_held(catch_up=True)
        # The recorder stores a run's events in seq order: a seq below the newest stored
        # one that the store lacks was dead-lettered, and never comes.
        newest = rows[-1][0] if rows else 0
        while self.held and self.last_seq + 1 < newest:
            self.last_seq += 1
            await self._send_held(catch_up=True)

    async def _watch(self) -> None:
        await sync_to_async(live.watch, thread_sensitive=False)(get_redis(), self.run_id)

    async def _keep_watching(self) -> None:
        """Renew this page's watch of its run while the socket is open."""
        while True:
            await asyncio.sleep(live.WATCH_TTL_S / 3)
            await self._watch()

    async def _stored_after(self, after_seq: int) -> list[list[Any]]:
        return await sync_to_async(live.stored_wire, thread_sensitive=False)(self.run_id, after_seq)


SEQ_MAX = 2**62  # as the HTTP side takes (traces/views.py, _int)


def _seq(raw: Any) -> int:
    """A seq the page sent: 0 for what is not one, never past SEQ_MAX (1e999 raised
    OverflowError, and a 61-digit number DuckDB's refusal, out of the consumer)."""
    try:
        return max(0, min(SEQ_MAX, int(raw)))
    except (TypeError, ValueError, OverflowError):
        return 0
