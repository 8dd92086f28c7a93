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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM
from traces.schema import ARROW_SCHEMA, NAMES, PHASES, STATUSES, Event, problems

log = logging.getLogger(__name__)

GROUP = "recorder"
LIVE_GROUP = "live"  # the live forwarder's group (traces.forwarder)
LIVE_HEARTBEAT_KEY = "frlm:forwarder:alive"
LIVE_LAG_MAX = 1_000_000  # entries a forwarder may be behind before it holds nothing back
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
    ) -> None:
        self.client = client
        # The same connections, without redis-py's reply parsing of XREADGROUP: a dict
        # per entry is a quarter of the cost of storing it.
        self.raw = redis.Redis(connection_pool=client.connection_pool)
        self.raw.response_callbacks.pop("XREADGROUP", None)
        self.consumer = consumer
        self.batch_max = batch_max
        self.block_ms = block_ms
        self.blobs = blobs.PackWriter()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="frlm-recorder-read")
        self._next: Future[list[Any]] | None = None
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
            self.blobs.open()
            self.recover()
            last_refresh = time.monotonic()
            while not stop.is_set():
                self.step()
                if time.monotonic() - last_refresh > 2:
                    self.refresh()
                    last_refresh = time.monotonic()
            self.drain()
        finally:
            self.blobs.close()
            self.release()

    # --- work ------------------------------------------------------------------------
    def recover(self) -> int:
        total = 0
        while True:
            entries = self._read("0")
            if not entries:
                return total
            total += self.store_entries(entries, recovering=True)

    def step(self) -> int:
        """Store the next batch. While a full batch is stored, the next one is read in the
        background (the read is mostly Redis building its reply, and DuckDB and Parquet
        release the GIL): under load the two overlap."""
        if self._next is not None:
            entries, self._next = self._next.result(), None
        else:
            entries = self._read(">", block_ms=self.block_ms)
        if not entries:
            return 0
        if len(entries) >= self.batch_max:
            self._next = self._reader.submit(self._read, ">")
        return self.store_entries(entries)

    def drain(self) -> None:
        """Store a batch read ahead, so that stopping leaves nothing read but unstored."""
        if self._next is not None:
            entries, self._next = self._next.result(), None
            if entries:
                self.store_entries(entries)

    def _read(self, start: str, *, block_ms: int | None = None) -> list[Any]:
        """Entries of the stream as [id, [b"seq", seq, b"e", json]] lists."""
        args: list[Any] = ["GROUP", GROUP, self.consumer, "COUNT", self.batch_max]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        reply = self.raw.execute_command("XREADGROUP", *args, "STREAMS", EVENTS_STREAM, start)
        if not reply:
            return []
        # A map of stream to entries (RESP3, or hiredis), or a list of [stream, entries].
        return next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]

    def store_entries(self, entries: list[Any], *, recovering: bool = False) -> int:
        """Store one batch; returns how many events were newly stored.

        1. parse and check the whole batch at once (columnar, in DuckDB), 2. stage each
        run's events as a segment and their payloads in the blob pack, 3. make it all
        durable, 4. acknowledge, dead-letter what did not fit, and trim what every reader
        of the stream is done with."""
        ids = [entry[0] for entry in entries]
        table, dead = _decode_batch(_fields_of(entries))
        self.blobs.notice_prune()
        staged: list[tuple[Path, Path]] = []
        stored = 0
        first_id = _id_text(ids[0]) if ids else "0-0"
        for run_id, events in _by_run(table):
            if recovering:
                known = store.stored_event_ids(run_id, events.column("event_id").to_pylist())
                if known:
                    keep = pc.invert(pc.is_in(events.column("event_id"), pa.array(list(known))))
                    events = events.filter(keep)
            if events.num_rows:
                staged.append(_stage_table(run_id, events, self.blobs, first_id=first_id))
                stored += events.num_rows
        self.blobs.sync()
        if staged:
            _commit(staged)

        pipe = self.client.pipeline()
        for index, reason, raw in dead:
            pipe.xadd(
                DEAD_LETTER_STREAM, {"reason": reason, "event": raw, "id": _id_text(ids[index])}
            )
        pipe.xack(EVENTS_STREAM, GROUP, *ids)
        pipe.execute()
        self.trim()
        if dead:
            log.warning("recorder: %d event(s) dead-lettered, first: %s", len(dead), dead[0][1])
        self.stored += stored
        return stored

    def trim(self) -> None:
        """Delete the stream's entries that the recorder has acknowledged and the live
        forwarder (traces.forwarder) has read. A forwarder that is not running (no
        heartbeat) or is LIVE_LAG_MAX entries behind holds nothing back: pages fill a gap
        from the store."""
        floors: dict[str, tuple[int, int]] = {}
        live_lag: int | None = None
        for group in self.client.xinfo_groups(EVENTS_STREAM):
            name = _text(group["name"])
            if name not in (GROUP, LIVE_GROUP):
                continue
            floors[name] = _after(_text(group["last-delivered-id"]))
            if name == LIVE_GROUP:
                live_lag = group.get("lag")
            if name == GROUP and group["pending"]:
                summary = self.client.xpending(EVENTS_STREAM, GROUP)
                floors[name] = min(floors[name], _parse_id(_text(summary["min"])))
        if GROUP not in floors:
            return
        floor = floors[GROUP]
        if (
            LIVE_GROUP in floors
            and (live_lag is None or live_lag < LIVE_LAG_MAX)
            and self.client.exists(LIVE_HEARTBEAT_KEY)
        ):
            floor = min(floor, floors[LIVE_GROUP])
        if floor > (0, 1):
            self.client.xtrim(EVENTS_STREAM, minid=f"{floor[0]}-{floor[1]}", approximate=False)


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _after(entry_id: str) -> tuple[int, int]:
    ms, seq = _parse_id(entry_id)
    return ms, seq + 1


def _entry_fields(fields: Any) -> tuple[Any, Any]:
    """(seq, event JSON) of a stream entry: a dict from redis-py's parser, or the flat
    [b"seq", seq, b"e", json] list the raw reader returns."""
    if isinstance(fields, dict):
        return fields.get(b"seq", fields.get("seq")), fields.get(b"e", fields.get("e"))
    if len(fields) == 4 and fields[0] == b"seq" and fields[2] == b"e":
        return fields[1], fields[3]
    pairs = dict(zip(fields[::2], fields[1::2], strict=True))
    return pairs.get(b"seq"), pairs.get(b"e")


def _fields_of(entries: list[Any]) -> list[tuple[Any, Any]]:
    """(seq, event JSON) per entry; the emitter's layout taken in bulk."""
    flat = [entry[1] for entry in entries]
    if all(type(f) is list and len(f) == 4 and f[0] == b"seq" and f[2] == b"e" for f in flat):
        return [(f[1], f[3]) for f in flat]
    return [_entry_fields(f) for f in flat]


def _decode(fields: dict) -> tuple[Event | None, str]:
    """One entry, parsed and checked in Python: what tells a dead-lettered event's reason."""
    seq, raw = _entry_fields(fields)
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


# The batch parse: every field typed in one pass over each event's JSON, plus the JSON types
# of the fields (json_transform alone turns 12 into "12" or "12" into 12, and a mismatch
# into NULL; the types let the check below be as strict as schema.problems).
_TYPED = json.dumps(
    {
        "run_id": "VARCHAR",
        "event_id": "VARCHAR",
        "span_id": "VARCHAR",
        "parent_id": "VARCHAR",
        "links": ["VARCHAR"],
        "name": "VARCHAR",
        "phase": "VARCHAR",
        "ts": "BIGINT",
        "status": "VARCHAR",
        "venue": "VARCHAR",
        "worker_id": "VARCHAR",
        "depth": "INTEGER",
        "ms": "DOUBLE",
        "bytes": "BIGINT",
        "tokens_in": "BIGINT",
        "tokens_out": "BIGINT",
        "cost": "DOUBLE",
        "payload_ref": "VARCHAR",
        "attrs": "JSON",
    }
)
_REQUIRED = ("run_id", "event_id", "span_id", "name", "phase", "status")
_NUMBERS = ("ms", "bytes", "tokens_in", "tokens_out", "cost")
_OPTIONAL_TEXT = ("parent_id", "venue", "worker_id", "payload_ref")
_TYPED_PATHS = [*_REQUIRED, "ts", "depth", *_NUMBERS, "links", "attrs", *_OPTIONAL_TEXT]


def _quoted(values: frozenset[str]) -> str:
    return ", ".join(f"'{v}'" for v in sorted(values))


def _fits_sql() -> str:
    t = {name: f"t[{i + 1}]" for i, name in enumerate([*_TYPED_PATHS, "_payload"])}
    checks = [f"{t[f]} = 'VARCHAR' AND length(j.{f}) > 0" for f in _REQUIRED]
    checks += [
        f"j.name IN ({_quoted(NAMES)})",
        f"j.phase IN ({_quoted(PHASES)})",
        f"j.status IN ({_quoted(STATUSES)})",
        "seq >= 1",
        f"{t['ts']} IN ('BIGINT', 'UBIGINT') AND j.ts > 0",
        f"({t['depth']} IS NULL OR ({t['depth']} IN ('BIGINT', 'UBIGINT') "
        "AND j.depth IS NOT NULL))",
        f"({t['links']} IS NULL OR ({t['links']} = 'ARRAY' AND list_has_all(['VARCHAR'], lt)))",
        f"({t['attrs']} IS NULL OR {t['attrs']} = 'OBJECT')",
        f"({t['_payload']} IS NULL OR {t['_payload']} = 'NULL' OR ({t['_payload']} = 'VARCHAR'"
        " AND regexp_full_match(coalesce(j.payload_ref, ''), '[0-9a-f]{64}')))",
    ]
    checks += [
        f"({t[f]} IS NULL OR {t[f]} = 'NULL' OR ({t[f]} IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
        f"AND j.{f} IS NOT NULL))"
        for f in _NUMBERS
    ]
    checks += [f"({t[f]} IS NULL OR {t[f]} IN ('NULL', 'VARCHAR'))" for f in _OPTIONAL_TEXT]
    return "coalesce(" + "\n    AND ".join(checks) + ", false)"


_PATHS = "[" + ", ".join(f"'$.{f}'" for f in _TYPED_PATHS) + ", '$.attrs._payload']"
_BATCH_SQL = f"""
WITH p AS (
  SELECT i, seq, json_transform(e, '{_TYPED}') AS j, json_type(e, {_PATHS}) AS t,
         json_type(e, '$.links[*]') AS lt
  FROM batch
)
SELECT i, {_fits_sql()} AS ok,
       j.run_id, seq, j.event_id, j.span_id, j.parent_id, coalesce(j.links, []) AS links,
       j.name, j.phase, j.ts, j.status, j.venue, j.worker_id, coalesce(j.depth, 0) AS depth,
       j.ms, j.bytes, j.tokens_in, j.tokens_out, j.cost, j.payload_ref,
       CASE WHEN t[{len(_TYPED_PATHS) + 1}] IS NULL THEN coalesce(j.attrs::VARCHAR, '{{}}')
            ELSE json_merge_patch(j.attrs, '{{"_payload":null}}')::VARCHAR END AS attrs,
       json_extract_string(j.attrs, '$._payload') AS payload
FROM p ORDER BY i
"""  # noqa: S608 (built from constants only)

_PAYLOAD = pa.field("payload", pa.string())
_STAGED_SCHEMA = ARROW_SCHEMA.append(_PAYLOAD)
_local = threading.local()


COLUMNAR_MIN = 200  # smaller batches (a quiet stream) parse faster event by event


def _batch_connection() -> duckdb.DuckDBPyConnection:
    """A connection with the batch query as a view over `batch` (parsed once, not per
    batch: it is long). One thread: the machine's cores are the runs' first."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect(config={"threads": 1})
        empty = pa.table({"i": pa.array([], pa.int64()), "seq": pa.array([], pa.int64())})
        con.register("batch", empty.append_column("e", pa.array([], pa.string())))
        con.execute(f"CREATE TEMP VIEW decoded AS {_BATCH_SQL}")
        con.unregister("batch")
    return con


def _decode_batch(fields: list[tuple[Any, Any]]) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """A batch of (seq, event JSON) as one table in ARROW_SCHEMA order plus the payload
    texts, and the entries that do not fit: (index, reason, raw text). Parsed column by
    column in DuckDB; a batch DuckDB cannot take (text that is not JSON, not UTF-8) goes
    event by event through _decode."""
    if len(fields) < COLUMNAR_MIN:
        return _decode_slowly(fields)
    try:
        seqs = pa.array([_int_or_none(seq) for seq, _ in fields], pa.int64())
        raws = pa.array([raw for _, raw in fields], pa.binary()).cast(pa.string())
        batch = pa.table({"i": pa.array(range(len(fields)), pa.int64()), "seq": seqs, "e": raws})
        con = _batch_connection()
        con.register("batch", batch)
        try:
            result = con.sql("SELECT * FROM decoded").to_arrow_table()
        finally:
            con.unregister("batch")
    except (duckdb.Error, pa.ArrowException, TypeError):
        return _decode_slowly(fields)
    ok = result.column("ok")
    dead = [(i, _reason(fields[i]), _raw_text(fields[i][1])) for i in _false_at(ok)]
    good = result.filter(ok).drop_columns(["i", "ok"])
    columns = [good.column(f.name).cast(f.type) for f in _STAGED_SCHEMA]
    return pa.Table.from_arrays(columns, schema=_STAGED_SCHEMA), dead


def _decode_slowly(fields: list[tuple[Any, Any]]) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    rows: list[dict[str, Any]] = []
    dead: list[tuple[int, str, str]] = []
    for index, (seq, raw) in enumerate(fields):
        event, reason = _decode({b"seq": seq, b"e": raw})
        if event is None:
            dead.append((index, reason, _raw_text(raw)))
        else:
            rows.append(_row(event))
    return pa.Table.from_pylist(rows, schema=_STAGED_SCHEMA), dead


def _row(event: Event) -> dict[str, Any]:
    row: dict[str, Any] = dict(event)
    attrs = dict(row.get("attrs") or {})
    row["payload"] = attrs.pop("_payload", None)
    row["attrs"] = json.dumps(attrs, separators=(",", ":"), default=str)
    return row


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _false_at(mask: pa.ChunkedArray) -> list[int]:
    if pc.all(mask).as_py():
        return []
    return [i for i, ok in enumerate(mask.to_pylist()) if not ok]


def _reason(fields: tuple[Any, Any]) -> str:
    _, reason = _decode({b"seq": fields[0], b"e": fields[1]})
    return reason or "the event does not fit the schema"


def _raw_text(raw: Any) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def _by_run(table: pa.Table) -> list[tuple[str, pa.Table]]:
    if not table.num_rows:
        return []
    runs = table.column("run_id")
    unique = pc.unique(runs).to_pylist()
    if len(unique) == 1:
        return [(unique[0], table)]
    return [(run_id, table.filter(pc.equal(runs, run_id))) for run_id in unique]


def _stage_table(
    run_id: str, events: pa.Table, writer: blobs.PackWriter, *, first_id: str
) -> tuple[Path, Path]:
    """Write a run's batch as a temporary segment, and hand its payloads to the blob pack;
    nothing is durable until the pack's sync and _commit."""
    payloads = events.column("payload")
    if payloads.null_count < len(payloads):
        for ref, text in zip(
            events.column("payload_ref").to_pylist(), payloads.to_pylist(), strict=True
        ):
            if text is not None and ref:
                writer.add(ref, text)
    table = events.drop_columns(["payload"])
    directory = store.run_dir(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    first_event = events.column("event_id")[0].as_py()
    final = directory / f"seg-{first_id}-{first_event}.parquet"
    tmp = directory / f".{final.name}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    return tmp, final


def _commit(staged: list[tuple[Path, Path]]) -> None:
    """Make a batch's segments durable (each file synced: os.sync would flush every dirty
    page of the machine, other programs' too), then make each appear by rename, and the
    renames durable too."""
    for tmp, _ in staged:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for tmp, final in staged:
        os.replace(tmp, final)
    for directory in {final.parent for _, final in staged}:
        blobs.fsync_dir(directory)


def _write_segment(run_id: str, events: list[Event], *, first_id: str) -> Path:
    """Store events given as dicts (tests, tools): the recorder's path, without a stream."""
    writer = blobs.PackWriter()
    table = pa.Table.from_pylist([_row(e) for e in events], schema=_STAGED_SCHEMA)
    tmp, final = _stage_table(run_id, table, writer, first_id=first_id)
    writer.sync()
    writer.close()
    _commit([(tmp, final)])
    return final
