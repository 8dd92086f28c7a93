"""The recorder: the one writer of the trace store (DESIGN §3).

It reads the event stream through a consumer group, writes each batch per run as an
immutable Parquet segment (temporary name, fsync, rename), and only then acknowledges and
deletes the entries. Killed at any moment, it loses nothing: unacknowledged entries are read
again on restart, and those already in a segment are recognised by event id and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM
from traces.schema import ARROW_SCHEMA, Event, problems

log = logging.getLogger(__name__)

GROUP = "recorder"
LOCK_KEY = "frlm:recorder:lock"
HEARTBEAT_KEY = "frlm:recorder:alive"


class RecorderBusy(RuntimeError):
    pass


class Recorder:
    def __init__(
        self,
        client: redis.Redis,
        *,
        consumer: str = "recorder",
        batch_max: int = 20000,
        block_ms: int = 50,
        on_stored: Callable[[list[Event]], None] | None = None,
    ) -> None:
        self.client = client
        self.consumer = consumer
        self.batch_max = batch_max
        self.block_ms = block_ms
        self.on_stored = on_stored
        self.token = f"{socket.gethostname()}:{os.getpid()}"
        self.stored = 0

    # --- lifecycle -------------------------------------------------------------------
    def acquire(self, ttl_s: int = 10) -> None:
        """Take the single-writer lock; a second recorder refuses to start. A lock left by
        a recorder of this machine that is dead (killed, crashed) is taken over at once."""
        if not self.client.set(LOCK_KEY, self.token, nx=True, ex=ttl_s):
            holder = self.client.get(LOCK_KEY)
            if _dead_here(holder) and self.client.delete(LOCK_KEY):
                self.client.set(LOCK_KEY, self.token, nx=True, ex=ttl_s)
                if self.client.get(LOCK_KEY) in (self.token, self.token.encode()):
                    log.warning("recorder: took over the lock of dead recorder %r", holder)
                    return
            raise RecorderBusy(
                f"another recorder holds the trace store ({holder!r}); stop it first, "
                f"or wait {ttl_s} s if it was killed"
            )

    def refresh(self, ttl_s: int = 10) -> None:
        if self.client.get(LOCK_KEY) not in (self.token, self.token.encode()):
            raise RecorderBusy("lost the recorder lock; another recorder took over")
        pipe = self.client.pipeline()
        pipe.expire(LOCK_KEY, ttl_s)
        pipe.set(HEARTBEAT_KEY, self.token, ex=ttl_s)
        pipe.execute()

    def release(self) -> None:
        if self.client.get(LOCK_KEY) in (self.token, self.token.encode()):
            self.client.delete(LOCK_KEY)
        self.client.delete(HEARTBEAT_KEY)

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(EVENTS_STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self, stop: threading.Event) -> None:
        """1. take the lock, 2. store what an earlier life read but did not acknowledge,
        3. store new entries as they come until told to stop."""
        self.acquire()
        try:
            self.ensure_group()
            self.refresh()
            self.recover()
            last_refresh = time.monotonic()
            while not stop.is_set():
                self.step()
                if time.monotonic() - last_refresh > 2:
                    self.refresh()
                    last_refresh = time.monotonic()
        finally:
            self.release()

    # --- work ------------------------------------------------------------------------
    def recover(self) -> int:
        total = 0
        while True:
            reply = self.client.xreadgroup(
                GROUP, self.consumer, {EVENTS_STREAM: "0"}, count=self.batch_max
            )
            entries = reply[0][1] if reply else []
            if not entries:
                return total
            total += self.store_entries(entries, recovering=True)

    def step(self) -> int:
        reply = self.client.xreadgroup(
            GROUP, self.consumer, {EVENTS_STREAM: ">"}, count=self.batch_max, block=self.block_ms
        )
        entries = reply[0][1] if reply else []
        return self.store_entries(entries) if entries else 0

    def store_entries(self, entries: list[tuple[Any, dict]], *, recovering: bool = False) -> int:
        """Store one batch; returns how many events were newly stored."""
        by_run: dict[str, list[Event]] = defaultdict(list)
        dead: list[tuple[Any, str, str]] = []
        ids = [entry_id for entry_id, _ in entries]
        for entry_id, fields in entries:
            event, reason = _decode(fields)
            if event is None:
                raw = fields.get(b"e", fields.get("e", b""))
                dead.append(
                    (
                        entry_id,
                        reason,
                        raw if isinstance(raw, str) else raw.decode("utf-8", "replace"),
                    )
                )
                continue
            by_run[event["run_id"]].append(event)

        stored: list[Event] = []
        staged: list[tuple[Path, Path]] = []
        for run_id, events in by_run.items():
            if recovering:
                events = _without_stored(run_id, events)
            if events:
                staged.append(_stage_segment(run_id, events, first_id=_id_text(ids[0])))
                stored.extend(events)
        if staged:
            _commit(staged)

        pipe = self.client.pipeline()
        for entry_id, reason, raw in dead:
            pipe.xadd(
                DEAD_LETTER_STREAM, {"reason": reason, "event": raw, "id": _id_text(entry_id)}
            )
        pipe.xack(EVENTS_STREAM, GROUP, *ids)
        pipe.xdel(EVENTS_STREAM, *ids)
        pipe.execute()
        if dead:
            log.warning("recorder: %d event(s) dead-lettered, first: %s", len(dead), dead[0][1])
        self.stored += len(stored)
        if stored and self.on_stored is not None:
            self.on_stored(stored)
        return len(stored)


def _dead_here(holder: Any) -> bool:
    """Whether a lock holder ("host:pid") is a process of this machine that no longer runs."""
    if isinstance(holder, bytes):
        holder = holder.decode("utf-8", "replace")
    host, _, pid = str(holder or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _id_text(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _decode(fields: dict) -> tuple[Event | None, str]:
    raw = fields.get(b"e", fields.get("e"))
    seq = fields.get(b"seq", fields.get("seq"))
    if raw is None:
        return None, "entry has no event field 'e'"
    try:
        event = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"event is not JSON: {exc}"
    if isinstance(event, dict):
        try:
            event["seq"] = int(seq)
        except (TypeError, ValueError):
            event["seq"] = None
    found = problems(event)
    if found:
        return None, "; ".join(found)
    return event, ""


def _without_stored(run_id: str, events: list[Event]) -> list[Event]:
    known = store.stored_event_ids(run_id, [e["event_id"] for e in events])
    return [e for e in events if e["event_id"] not in known]


def _stage_segment(run_id: str, events: list[Event], *, first_id: str) -> tuple[Path, Path]:
    """Write a run's batch as a temporary segment, and its payloads to the blob store;
    nothing is durable until _commit."""
    rows = []
    for event in events:
        row = dict(event)
        attrs = dict(row.get("attrs") or {})
        payload = attrs.pop("_payload", None)
        if payload is not None and row.get("payload_ref"):
            blobs.blob_put(row["payload_ref"], payload, durable=False)
        row["attrs"] = json.dumps(attrs, separators=(",", ":"), default=str)
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    directory = store.run_dir(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"seg-{first_id}-{events[0]['event_id']}.parquet"
    tmp = directory / f".{final.name}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    return tmp, final


def _commit(staged: list[tuple[Path, Path]]) -> None:
    """Make a batch durable at once: one sync for all its blobs and segments (an fsync per
    file capped the recorder at about a thousand payloads a second), then each segment
    appears by rename, and the renames are made durable too."""
    os.sync()
    for tmp, final in staged:
        os.replace(tmp, final)
    for directory in {final.parent for _, final in staged}:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_segment(run_id: str, events: list[Event], *, first_id: str) -> Path:
    tmp, final = _stage_segment(run_id, events, first_id=first_id)
    _commit([(tmp, final)])
    return final
