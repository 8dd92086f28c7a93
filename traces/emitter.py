"""The span emitter: every process reports what it does as events on one Redis stream.

Each event gets its run's next `seq` in the same atomic step that appends it to the stream,
so `seq` order is the stream's order even when many processes emit for one run.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from frlm_web import fastjson
from frlm_web.redis_client import LuaScript
from traces import caps
from traces.schema import Event

EVENTS_STREAM = "frlm:events"
DEAD_LETTER_STREAM = "frlm:events:dead"

# ARGV = run_id, event json, run_id, event json, ... (append_args). The stream is named in
# the script, not passed in KEYS: EVAL needs read access to the keys it declares, and a
# venue worker's Redis user may append to the stream but not read it
# (frlm_web/redis_acl.py); the XADD inside needs write access only.
APPEND_LUA = f"""
for i = 1, #ARGV, 2 do
  local seq = redis.call('INCR', 'frlm:seq:' .. ARGV[i])
  redis.call('XADD', '{EVENTS_STREAM}', '*', 'seq', seq, 'e', ARGV[i + 1])
end
return #ARGV / 2
"""
_APPEND_SCRIPT = LuaScript(APPEND_LUA)

# The same, for a process that keeps its open spans in a hash (KEYS[1]) so that whoever
# finds it dead can close them (runs/lease.py). ARGV = run_id, event json, span id, and
# the span's description on its start, "-" on its end, "" for any other event; repeated.
OPEN_SPANS_TTL_S = 7 * 86400
TRACK_LUA = f"""
for i = 1, #ARGV, 4 do
  local seq = redis.call('INCR', 'frlm:seq:' .. ARGV[i])
  redis.call('XADD', '{EVENTS_STREAM}', '*', 'seq', seq, 'e', ARGV[i + 1])
  local open = ARGV[i + 3]
  if open == '-' then
    redis.call('HDEL', KEYS[1], ARGV[i + 2])
  elseif open ~= '' then
    redis.call('HSET', KEYS[1], ARGV[i + 2], open)
  end
end
redis.call('EXPIRE', KEYS[1], {OPEN_SPANS_TTL_S})
return #ARGV / 4
"""
_TRACK_SCRIPT = LuaScript(TRACK_LUA)


# Every event is encoded on the emitting process's hot path (frlm_web/fastjson.py).
_encode = fastjson.dumps


def append_args(events: list[Event]) -> list[str | bytes]:
    """APPEND_LUA's arguments for these events: run id and JSON of each in turn."""
    args: list[str | bytes] = []
    for event in events:
        args.append(event["run_id"])
        args.append(_encode(event))
    return args


def track_args(events: list[Event]) -> list[str | bytes]:
    """TRACK_LUA's arguments for these events."""
    args: list[str | bytes] = []
    for event in events:
        phase = event["phase"]
        if phase == "start":
            open_ = _encode(
                {
                    key: event.get(key)
                    for key in ("name", "parent_id", "depth", "ts", "venue", "worker_id")
                }
            )
        else:
            open_ = "-" if phase == "end" else ""
        args += [
            event["run_id"],
            _encode(event),
            event["span_id"],
            open_,
        ]
    return args


def tracing() -> bool:
    """Whether events are sent: off only to measure what tracing costs (bench/), and a run
    without events has no trace."""
    return os.environ.get("FRLM_TRACE_EVENTS", "1") != "0"


def append(events: list[Event], client: redis.Redis | redis.client.Pipeline) -> None:
    """Append events of any runs to the stream now, or queue them on a pipeline."""
    if events and tracing():
        _append(events, client)


def _append(events: list[Event], client: redis.Redis | redis.client.Pipeline) -> None:
    _APPEND_SCRIPT(keys=[], args=append_args(events), client=client)


def new_id() -> str:
    """16 random hex digits (64 bits; a uuid4's first 16 digits held 60 and cost more)."""
    return os.urandom(8).hex()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Span:
    """An open span: its start event is already on the stream."""

    def __init__(
        self,
        emitter: Emitter,
        name: str,
        span_id: str,
        parent_id: str | None,
        depth: int,
        started_ns: int,
    ) -> None:
        self.emitter = emitter
        self.name = name
        self.span_id = span_id
        self.parent_id = parent_id
        self.depth = depth
        self.started_ns = started_ns
        self.ended = False

    def end(self, status: str = "ok", *, payload: str | None = None, **fields: Any) -> None:
        if self.ended:
            return
        self.ended = True
        fields.setdefault("ms", (time.time_ns() - self.started_ns) / 1e6)
        self.emitter.emit(
            self.name,
            "end",
            span_id=self.span_id,
            parent=self.parent_id,
            depth=self.depth,
            status=status,
            payload=payload,
            **fields,
        )

    def progress(self, **attrs: Any) -> None:
        self.emitter.emit(
            self.name,
            "progress",
            span_id=self.span_id,
            parent=self.parent_id,
            depth=self.depth,
            attrs=attrs,
        )


class Emitter:
    """Writes events of one run. Venue and worker name where the emitting code runs."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        *,
        venue: str | None = "conductor",
        worker_id: str | None = None,
        open_spans: str | None = None,
    ) -> None:
        """`open_spans`: the Redis hash where the spans this emitter starts are kept until
        they end (None: not kept)."""
        self.client = client
        self.open_spans = open_spans
        self.run_id = run_id
        self.venue = venue
        self.worker_id = worker_id
        self._held: list[Event] | None = None
        self.enabled = tracing()

    def build(
        self,
        name: str,
        phase: str,
        *,
        span_id: str | None = None,
        parent: str | None = None,
        depth: int = 0,
        status: str = "ok",
        links: list[str] | None = None,
        payload: str | None = None,
        attrs: dict[str, Any] | None = None,
        **metrics: Any,
    ) -> Event:
        event: Event = {
            "run_id": self.run_id,
            "event_id": new_id(),
            "span_id": span_id or new_id(),
            "parent_id": parent,
            "links": list(links or []),
            "name": name,
            "phase": phase,
            "ts": time.time_ns(),
            "status": status,
            "venue": metrics.pop("venue", self.venue),
            "worker_id": metrics.pop("worker_id", self.worker_id),
            "depth": depth,
            "attrs": attrs or {},
        }
        for key in ("ms", "bytes", "tokens_in", "tokens_out", "cost"):
            if metrics.get(key) is not None:
                event[key] = metrics.pop(key)
        if "cost" in event:
            # The trace's cost column is a float measurement per span (ARCHITECTURE.md §9):
            # the books keep exact Decimals, and their attrs carry them as strings.
            event["cost"] = float(event["cost"])
        if metrics or payload is not None:
            merged = {**event["attrs"], **metrics}  # a copy: the caller's attrs stay as given
            if payload is not None:
                payload, whole = caps.cut(payload)
                if whole:
                    merged["payload_cut_from"] = whole
                event["payload_ref"] = sha256_text(payload)
                # The recorder moves the text into the blob store and keeps only the ref.
                merged["_payload"] = payload
            event["attrs"] = merged
        return event

    def emit(self, name: str, phase: str, **kwargs: Any) -> Event:
        return self.emit_built(self.build(name, phase, **kwargs))

    def emit_built(self, event: Event) -> Event:
        """Send an event built earlier (its timestamp stays when it was built), or hold it
        in the open batch."""
        if self._held is not None:
            self._held.append(event)
        else:
            self.send([event])
        return event

    def send(self, events: list[Event], pipe: redis.client.Pipeline | None = None) -> None:
        """Append events to the stream now, or queue them on `pipe` for its caller to run."""
        if not events or not self.enabled:
            return
        if self.open_spans is not None:
            _TRACK_SCRIPT(
                keys=[self.open_spans],
                args=track_args(events),
                client=self.client if pipe is None else pipe,
            )
            return
        _append(events, self.client if pipe is None else pipe)

    @contextmanager
    def batch(self, pipe: redis.client.Pipeline | None = None) -> Iterator[None]:
        """Hold events emitted inside the block and send them in one round trip (or queue
        them on `pipe`, so they travel with the caller's own commands)."""
        outer = self._held
        self._held = [] if outer is None else outer
        try:
            yield
        finally:
            if outer is None:
                held, self._held = self._held, None
                self.send(held or [], pipe)

    def start(
        self,
        name: str,
        *,
        parent: str | None = None,
        depth: int = 0,
        payload: str | None = None,
        links: list[str] | None = None,
        span_id: str | None = None,
        **fields: Any,
    ) -> Span:
        span_id = span_id or new_id()
        event = self.emit(
            name,
            "start",
            span_id=span_id,
            parent=parent,
            depth=depth,
            payload=payload,
            links=links,
            **fields,
        )
        return Span(self, name, span_id, parent, depth, event["ts"])

    @contextmanager
    def span(self, name: str, **kwargs: Any) -> Iterator[Span]:
        """A span around a block; an exception ends it with status error and goes on."""
        span = self.start(name, **kwargs)
        try:
            yield span
        except BaseException as exc:
            span.end("error", error=f"{type(exc).__name__}: {exc}")
            raise
        span.end()

    def instant(
        self,
        name: str,
        *,
        parent: str | None = None,
        depth: int = 0,
        status: str = "ok",
        **fields: Any,
    ) -> Event:
        return self.emit(name, "instant", parent=parent, depth=depth, status=status, **fields)
