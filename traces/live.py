"""The one publisher of live trace events (ARCHITECTURE.md §7): the live forwarder
(traces.forwarder) hands it events as they are emitted, it groups them by run, strips their
payload texts, and sends them to the run's channel group `run-<id>` every FLUSH_S, so
thousands of events a second reach a page as a few messages a second.

The wire form of an event is a short list in WIRE_FIELDS order (field names repeated
50,000 times would be most of a big trace's bytes); the WebSocket consumer and this
publisher use `wire()` (`stored_wire` for stored events), and the HTTP catch-up endpoint
the same rows rendered as JSON text by the store's database (`stored_wire_json`), so a
page sees one shape."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypedDict

from frlm_web.redis_client import OUTAGE_ERRORS, Outage

log = logging.getLogger(__name__)

FLUSH_S = 0.015
# A run's events per channel message. Past BURST events in one flush, consumers are told
# to read the store instead: a channel holds at most ~100 messages, and the store is
# where a burst already is.
CHUNK = 1000
BURST = 5000
ATTR_CHARS = 500  # attribute strings are clipped on the wire; the span endpoint has all

WIRE_FIELDS = (
    "seq",
    "span_id",
    "parent_id",
    "name",
    "phase",
    "t_ms",  # epoch milliseconds (nanoseconds do not fit a JavaScript number)
    "status",
    "venue",
    "worker_id",
    "depth",
    "ms",
    "tokens_in",
    "tokens_out",
    "cost",
    "payload_ref",
    "attrs",
    "links",
)


# Runs some page is watching: a sorted set of run ids scored by when the watch lapses.
# A run page's socket announces its run (watch) and renews it while open; the forwarder
# passes over events of runs nobody watches (a page that joins later reads the store).
WATCHED_KEY = "frlm:live:watched"
WATCH_TTL_S = 30.0


def watch(client: Any, run_id: str, now: float | None = None) -> None:
    """Announce (or renew) that a page watches `run_id`, and forget lapsed watches."""
    now = time.time() if now is None else now
    pipe = client.pipeline(transaction=False)
    pipe.zadd(WATCHED_KEY, {run_id: now + WATCH_TTL_S})
    pipe.zremrangebyscore(WATCHED_KEY, "-inf", now)
    pipe.execute()


def watched(client: Any, now: float | None = None) -> set[bytes]:
    """The run ids (as bytes, like stream fields) some page watches now."""
    now = time.time() if now is None else now
    return set(client.zrangebyscore(WATCHED_KEY, now, "+inf"))


class EventsMessage(TypedDict):
    type: str  # "trace.events"
    run_id: str
    events: list[list[Any]]


class MoreMessage(TypedDict):
    type: str  # "trace.more": read the store after your last seq
    run_id: str
    last_seq: int


def group_name(run_id: str) -> str:
    return f"run-{run_id}"


def _public_attrs(attrs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Attributes without private keys (`_payload` is the payload text itself), nulls or
    long texts; None when nothing is left."""
    if not attrs:
        return None
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if value is None or key.startswith("_"):
            continue
        if isinstance(value, str) and len(value) > ATTR_CHARS:
            value = value[:ATTR_CHARS] + "…"
        out[key] = value
    return out or None


def wire(event: dict[str, Any]) -> list[Any]:
    """An event as the browser receives it (payload text never included)."""
    ts = event.get("ts") or 0
    return [
        event.get("seq"),
        event.get("span_id"),
        event.get("parent_id"),
        event.get("name"),
        event.get("phase"),
        ts / 1e6,
        event.get("status"),
        event.get("venue"),
        event.get("worker_id"),
        event.get("depth") or 0,
        event.get("ms"),
        event.get("tokens_in"),
        event.get("tokens_out"),
        event.get("cost"),
        event.get("payload_ref"),
        _public_attrs(event.get("attrs")),
        event.get("links") or None,
    ]


_WIRE_SQL = """SELECT seq, span_id, parent_id, name, phase, epoch_ns(ts) / 1e6 AS t_ms, status,
       venue, worker_id, coalesce(depth, 0) AS depth, ms, tokens_in, tokens_out, cost,
       payload_ref, attrs, links
FROM ev WHERE seq > ? ORDER BY seq"""


def stored_wire(run_id: str, after_seq: int = 0) -> list[list[Any]]:
    """The run's stored events after `after_seq`, in wire form: the catch-up of the page
    (HTTP) and of the socket. Read column by column, as `wire` would shape them from
    store.read_events but about three times faster (a big trace is 50,000 events)."""
    from traces import store

    c = store._columns(run_id, _WIRE_SQL, [after_seq])
    if not c:
        return []
    attrs = [
        None if not text or text == "{}" else _public_attrs(json.loads(text)) for text in c["attrs"]
    ]
    links = [value or None for value in c["links"]]
    columns = [c[name] for name in list(c)[:15]] + [attrs, links]
    return [list(row) for row in zip(*columns, strict=True)]


# The same wire rows rendered as JSON text by DuckDB, in C++: for the page's first read of a
# big run (20,000 events: ~60 ms instead of ~300 ms for rows made in Python and encoded).
# Attributes go in as stored when they cannot hold anything _public_attrs would change; the
# others (a key or a value that might be private, null or long, any escape, anything but an
# object) are made public in Python and joined in from the table `public`.
_ATTRS_IN_PYTHON_SQL = """SELECT seq, attrs FROM ev
WHERE seq > ? AND attrs IS NOT NULL AND attrs <> '{}' AND (
    NOT json_valid(attrs) OR json_type(attrs) <> 'OBJECT' OR length(attrs) > ?
    OR contains(attrs, '"_') OR contains(attrs, 'null') OR contains(attrs, '\\'))"""
_WIRE_JSON_SQL = """SELECT count(*), max(ev.seq), '[' || coalesce(string_agg(json_array(
    ev.seq, span_id, parent_id, name, phase, epoch_ns(ts) / 1e6, status, venue, worker_id,
    coalesce(depth, 0), ms, tokens_in, tokens_out, cost, payload_ref,
    CASE WHEN public.seq IS NOT NULL THEN json(public.attrs)
         WHEN ev.attrs IS NULL OR ev.attrs = '{}' THEN NULL ELSE json(ev.attrs) END,
    CASE WHEN len(links) > 0 THEN links END)::VARCHAR, ',' ORDER BY ev.seq), '') || ']'
FROM ev LEFT JOIN public ON public.seq = ev.seq WHERE ev.seq > ?"""


class WireText(TypedDict):
    events: str  # a JSON array of wire rows
    count: int
    last_seq: int | None


def stored_wire_json(run_id: str, after_seq: int = 0) -> WireText:
    """`stored_wire` as JSON text: the same rows once parsed, made by the database."""
    import pyarrow as pa

    from traces import store

    con = store.run_view(run_id)
    if con is None:
        return {"events": "[]", "count": 0, "last_seq": None}
    odd = con.execute(_ATTRS_IN_PYTHON_SQL, [after_seq, ATTR_CHARS]).fetchall()
    public = [_public_attrs(json.loads(text)) for _, text in odd]
    con.register(
        "public",
        pa.table(
            {
                "seq": pa.array([seq for seq, _ in odd], pa.int64()),
                "attrs": pa.array([json.dumps(a) if a else None for a in public], pa.string()),
            }
        ),
    )
    try:
        ((count, last, text),) = con.execute(_WIRE_JSON_SQL, [after_seq]).fetchall()
    finally:
        con.unregister("public")
    return {"events": text, "count": count, "last_seq": last}


class Publisher:
    """Collects events from the forwarder's thread; a publisher thread with its own
    event loop sends them. One long-lived loop keeps the channel layer's Redis
    connections open (async_to_sync from a plain thread would open a loop, and so new
    connections, per call)."""

    def __init__(self, flush_s: float = FLUSH_S) -> None:
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        # The publisher thread's loop and the event that wakes it, once it runs.
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.sent_messages = 0

    def forward(self, events: Iterable[dict[str, Any]]) -> None:
        """Called by the forwarder with each batch it reads; returns at once."""
        with self._lock:
            self._pending.extend(events)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="frlm-live-publisher", daemon=True
                )
                self._thread.start()
            loop, wake = self._loop_ref, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop is closing: the process is exiting
                pass

    def _take(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            pending, self._pending = self._pending, []
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in pending:
            by_run[event["run_id"]].append(event)
        return by_run

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        """1. sleep until the forwarder hands over events, 2. send what is pending, 3. wait
        FLUSH_S before sending again, so that under load a page gets a message per run every
        FLUSH_S while a lone event goes out at once."""
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        wake = asyncio.Event()
        with self._lock:
            self._loop_ref, self._wake = asyncio.get_running_loop(), wake
        # Redis away: said once, and what comes meanwhile is dropped (pages fill the gap
        # from the store); the channel layer reconnects by itself when it is back.
        outage = Outage(log, "live publisher")
        while True:
            with self._lock:
                idle = not self._pending
            if idle:
                await wake.wait()
            wake.clear()
            for run_id, events in self._take().items():
                try:
                    await self._send(layer, run_id, events)
                    outage.back()
                except OUTAGE_ERRORS as exc:
                    outage.lost(exc)
                except Exception:  # a page misses a batch and fills the gap from the store
                    log.exception("live: could not publish %d events of %s", len(events), run_id)
            await asyncio.sleep(self.flush_s)

    async def _send(self, layer: Any, run_id: str, events: list[dict[str, Any]]) -> None:
        events.sort(key=lambda e: e["seq"])
        group = group_name(run_id)
        if len(events) > BURST:
            more: MoreMessage = {
                "type": "trace.more",
                "run_id": run_id,
                "last_seq": events[-1]["seq"],
            }
            await layer.group_send(group, more)
            self.sent_messages += 1
            return
        for start in range(0, len(events), CHUNK):
            message: EventsMessage = {
                "type": "trace.events",
                "run_id": run_id,
                "events": [wire(e) for e in events[start : start + CHUNK]],
            }
            await layer.group_send(group, message)
            self.sent_messages += 1
