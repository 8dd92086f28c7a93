"""The live forwarder: events to the run pages as soon as they are emitted (ARCHITECTURE.md §7).

It reads the event stream through its own consumer group (`live`), apart from the recorder,
so a page does not wait for a batch to be made durable: storing is the recorder's job, and
a page that misses a live event (the forwarder was down, the channel layer dropped a
message) fills the gap from the store (traces.consumers). Events that do not fit the schema
are not forwarded: the recorder dead-letters them.

The group reads with NOACK (nothing to acknowledge: a lost live message is filled from the
store) and starts at the stream's end on each start: a page asks the store for the past.
The recorder deletes stream entries only once this group has read them too (unless the
forwarder is not running or far behind: see Recorder.trim).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from frlm_web import jsontext
from frlm_web.redis_client import OUTAGE_ERRORS, Outage
from traces import live
from traces.emitter import EVENTS_STREAM
from traces.recorder import LIVE_GROUP, LIVE_HEARTBEAT_KEY
from traces.schema import problems

log = logging.getLogger(__name__)

HEARTBEAT_KEY = LIVE_HEARTBEAT_KEY  # the recorder keeps entries for a forwarder that beats
IDLE_POLL_S = 0.05  # how soon a page that starts watching gets live events again


class Forwarder:
    def __init__(
        self,
        client: redis.Redis,
        *,
        publisher: live.Publisher | None = None,
        consumer: str = "forwarder",
        batch_max: int = 5000,
        block_ms: int = 200,
    ) -> None:
        self.client = client
        self.publisher = publisher or live.Publisher()
        self.consumer = consumer
        self.batch_max = batch_max
        self.block_ms = block_ms
        self.forwarded = 0

    def start_at_end(self) -> None:
        """Create the group at the stream's end, or move it there: what happened while no
        forwarder ran is in the store, and pages read it from there."""
        try:
            self.client.xgroup_create(EVENTS_STREAM, LIVE_GROUP, id="$", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            self.client.xgroup_setid(EVENTS_STREAM, LIVE_GROUP, id="$")

    def heartbeat(self, ttl_s: int = 10) -> None:
        self.client.set(HEARTBEAT_KEY, "1", ex=ttl_s)

    def run(self, stop: threading.Event) -> None:
        """1. start at the stream's end, 2. forward each new entry until told to stop,
        riding out Redis going away: each attempt waits longer (Outage), and once Redis
        answers the group goes on from where it was (a Redis that forgot the group, having
        no persistence, gets it again at the stream's end)."""
        self.start_at_end()
        self.heartbeat()
        last_beat = time.monotonic()
        outage = Outage(log, "forwarder")
        try:
            while not stop.is_set():
                try:
                    if outage.away:
                        self._resume()
                        outage.back()
                    self.step()
                    if time.monotonic() - last_beat > 2:
                        self.heartbeat()
                        last_beat = time.monotonic()
                except OUTAGE_ERRORS as exc:
                    stop.wait(outage.lost(exc))
        finally:
            try:
                self.client.delete(HEARTBEAT_KEY)
            except OUTAGE_ERRORS:
                pass  # it lapses by itself

    def _resume(self) -> None:
        try:
            groups = {_text(g["name"]) for g in self.client.xinfo_groups(EVENTS_STREAM)}
        except redis.ResponseError:  # no stream at all
            groups = set()
        if LIVE_GROUP not in groups:
            self.start_at_end()
        self.heartbeat()

    def step(self) -> int:
        """Forward what came since the last step for the runs pages watch. With no page
        watching, pass over it unread (the group moves to the stream's end): reading
        every event of a busy fanout only to drop it cost as much CPU as recording it.
        What a page misses while it starts watching, it reads from the store."""
        if not live.watched(self.client):
            self.client.xgroup_setid(EVENTS_STREAM, LIVE_GROUP, id="$")
            time.sleep(min(IDLE_POLL_S, self.block_ms / 1000))
            return 0
        reply = self.client.xreadgroup(
            LIVE_GROUP,
            self.consumer,
            {EVENTS_STREAM: ">"},
            count=self.batch_max,
            block=self.block_ms,
            noack=True,
        )
        entries = reply[0][1] if reply else []
        if entries:
            # Only runs a page watches: parsing and publishing the rest would be work for
            # nobody, and a page that comes later reads what it missed from the store.
            # Asked again after the read: a page that started watching while it blocked
            # must get what came meanwhile.
            keep = live.watched(self.client) | {None}  # None: not the emitter's layout
            entries = [(i, f) for i, f in entries if _run_of(f.get(b"e")) in keep]
        events = [e for e in (_event(fields) for _, fields in entries) if e is not None]
        if events:
            self.publisher.forward(events)
            self.forwarded += len(events)
        return len(events)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_RUN_PREFIX = b'{"run_id":"'


def _run_of(raw: Any) -> bytes | None:
    """The run id of an event's JSON, read off its first bytes without parsing it (the
    emitter writes run_id first); None when it is not there (then the event is parsed)."""
    if isinstance(raw, bytes) and raw.startswith(_RUN_PREFIX):
        end = raw.find(b'"', len(_RUN_PREFIX))
        if end > 0:
            return raw[len(_RUN_PREFIX) : end]
    return None


def _event(fields: dict[bytes, Any]) -> dict[str, Any] | None:
    raw = fields.get(b"e")
    try:
        event = jsontext.loads(raw) if raw is not None else None
        if isinstance(event, dict):
            event["seq"] = int(fields.get(b"seq", b""))
    except (ValueError, UnicodeDecodeError):
        return None
    return event if isinstance(event, dict) and not problems(event) else None
