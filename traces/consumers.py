"""The live socket of a run page: `ws/runs/<id>`.

1. connect: a signed-in user (else close 4401) who may see the run (else 4403) joins the
   run's group; `?after_seq=N` in the URL, or a first message `{"after_seq": N}`, asks for
   the events stored after N first (the catch-up), 2. then every live batch the publisher
   (traces.live) sends, without the ones the catch-up already carried. A batch that does
   not follow on from the last seq sent (a message the channel layer dropped) is filled
   from the store, so a page sees every event once, in seq order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from traces import live

CATCH_UP_CHUNK = 5000  # events per message of a catch-up

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


class RunConsumer(AsyncJsonWebsocketConsumer):
    def __init__(self, *args: Any, access: Callable[[Any, str], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access = access
        self.group: str | None = None
        # The last seq this socket has sent; None until a catch-up fixes the starting point
        # (before that, live batches pass as they come).
        self.last_seq: int | None = None

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
        self.group = live.group_name(run_id)
        # Join before reading the store: an event stored before the join is in the
        # catch-up, one published after it arrives live (and duplicates are dropped).
        await self.channel_layer.group_add(self.group, self.channel_name)
        query = parse_qs(self.scope.get("query_string", b"").decode())
        if "after_seq" in query:
            await self.catch_up(_seq(query["after_seq"][0]))

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.group is not None and isinstance(content, dict) and "after_seq" in content:
            await self.catch_up(_seq(content["after_seq"]))

    async def catch_up(self, after_seq: int) -> None:
        rows = await sync_to_async(live.stored_wire, thread_sensitive=False)(self.run_id, after_seq)
        for start in range(0, len(rows), CATCH_UP_CHUNK):
            chunk = rows[start : start + CATCH_UP_CHUNK]
            await self.send_json({"type": "events", "catch_up": True, "events": chunk})
        self.last_seq = max(after_seq, rows[-1][0] if rows else after_seq)
        await self.send_json({"type": "caught_up", "last_seq": self.last_seq})

    # --- from the publisher ---
    async def trace_events(self, message: dict[str, Any]) -> None:
        events = message["events"]
        if self.last_seq is not None:
            events = [e for e in events if e[0] > self.last_seq]
            if not events:
                return
            if events[0][0] > self.last_seq + 1:
                await self.catch_up(self.last_seq)
                return
            self.last_seq = events[-1][0]
        await self.send_json({"type": "events", "events": events})

    async def trace_more(self, message: dict[str, Any]) -> None:
        """A burst too big for the channel layer: it is in the store."""
        if self.last_seq is None:
            self.last_seq = 0
        if message["last_seq"] > self.last_seq:
            await self.catch_up(self.last_seq)


def _seq(raw: Any) -> int:
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0
