"""The recorder: the one writer of the trace store (DESIGN §3).

It reads the event stream through a consumer group, writes each batch per run as an
immutable Parquet segment (temporary name, fsync, rename), and only then acknowledges and
deletes the entries. Killed at any moment, it loses nothing: unacknowledged entries are read
again on restart, and those already in a segment are recognised by event id and skipped.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM
from traces.schema import ARROW_SCHEMA, NAMES, PHASES, RUN_ID, STATUSES, Event, problems

log = logging.getLogger(__name__)

GROUP = "recorder"
LIVE_GROUP = "live"  # the live forwarder's group (traces.forwarder)
LIVE_HEARTBEAT_KEY = "frlm:forwarder:alive"
LIVE_LAG_MAX = 1_000_000  # entries a forwarder may be behind before it holds nothing back
LOCK_KEY = "frlm:recorder:lock"
HEARTBEAT_KEY = "frlm:recorder:alive"
# A trickle of events (a read of fewer than GATHER_BELOW) is gathered this long before it
# is stored (see Recorder._gather); a backlog is stored at once.
GATHER_S = 0.1
GATHER_BELOW = 1000


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
        gather_s: float = GATHER_S,
    ) -> None:
        self.client = client
        # The same connections, without redis-py's reply parsing of XREADGROUP: a dict
        # per entry is a quarter of the cost of storing it.
        self.raw = redis.Redis(connection_pool=client.connection_pool)
        self.raw.response_callbacks.pop("XREADGROUP", None)
        self.consumer = consumer
        self.batch_max = batch_max
        self.block_ms = block_ms
        self.gather_s = gather_s
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
        quiet_collector()
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
            # Frozen objects are not collected at exit either: DuckDB's bindings would
            # report its live objects as leaks.
            gc.unfreeze()

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
            entries = self._gather()
        if not entries:
            return 0
        if len(entries) >= self.batch_max:
            self._next = self._reader.submit(self._read, ">")
        return self.store_entries(entries)

    def _gather(self) -> list[Any]:
        """What the stream holds, or the first entries to come, then what else comes within
        gather_s: a batch costs a parse, a segment and an fsync whatever its size, and
        events trickling in during a run would otherwise be stored a few at a time (pages
        see them live from the forwarder meanwhile). The window is slept through and
        read once: a blocking read per arrival woke the recorder for every few events of
        a fanout, which cost some 40% of its CPU."""
        entries = self._read(">", block_ms=self.block_ms)
        if not entries or len(entries) >= GATHER_BELOW:
            return entries
        time.sleep(self.gather_s)
        return entries + self._read(">")

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
        table, dead = _decode_batch(*_fields_of(entries))
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


def quiet_collector() -> None:
    """Tune the cycle collector for a process whose work is the recorder's loop. A batch's
    stream reply is some 100,000 short-lived lists and tuples: at the default threshold
    (700) the collector ran a hundred times a batch, and each full collection walked all of
    Django and the libraries again (a quarter of the recorder's time, measured). What the
    process loaded to start is frozen (never walked again), and a collection waits until
    50,000 more objects are alive than were freed; a batch's objects are freed by then."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])


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


def _fields_of(entries: list[Any]) -> tuple[list[Any], list[Any]]:
    """The seqs and the event JSON texts of a batch's entries. The emitter's layout is taken
    in bulk, with no Python step per entry (what a loop costs is a good part of a batch)."""
    flat = list(map(itemgetter(1), entries))
    n = len(flat)
    try:
        if (
            sum(map(len, flat)) == 4 * n
            and list(map(itemgetter(0), flat)).count(b"seq") == n
            and list(map(itemgetter(2), flat)).count(b"e") == n
        ):
            return list(map(itemgetter(1), flat)), list(map(itemgetter(3), flat))
    except (TypeError, IndexError, KeyError):
        pass  # entries of another layout (another producer): taken one by one
    pairs = [_entry_fields(f) for f in flat]
    return [seq for seq, _ in pairs], [raw for _, raw in pairs]


def _decode(fields: dict) -> tuple[Event | None, str]:
    """One entry, parsed and checked in Python: the reference for what is stored, and what
    tells a dead-lettered event's reason."""
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


# The batch parse. DuckDB parses each event once, into the JSON text of each field
# (normalised by its parser: no spaces, non-ASCII unescaped, numbers in one form). Arrow's
# compute kernels then check and convert those texts column by column, an order of magnitude
# cheaper than the same checks as SQL expressions. An event whose texts have an unusual shape
# (an escaped quote in an id, a missing `links`, a number out of range, not JSON at all) is
# not judged here: it goes through _decode like a small batch, so the fast path only ever
# accepts what _decode accepts, and stores what _decode would store.
_JSON_FIELDS = [f.name for f in ARROW_SCHEMA if f.name != "seq"]
_AS_JSON = json.dumps({name: "JSON" for name in _JSON_FIELDS})
_PAYLOAD_KEY = '"_payload"'


def _parse_sql(guarded: bool) -> str:
    parse = f"json_transform(e, '{_AS_JSON}')"
    if guarded:  # a batch with text that is not JSON: parse the rest, leave that to _decode
        parse = f"CASE WHEN json_valid(e) THEN {parse} END"
    fields = ", ".join(f"j.{name}::VARCHAR AS {name}" for name in _JSON_FIELDS)
    has_payload = f"contains(attrs, '{_PAYLOAD_KEY}')"
    return f"""
WITH p AS (SELECT i, {parse} AS j FROM batch), f AS (SELECT i, {fields} FROM p)
SELECT *,
  CASE WHEN {has_payload} THEN json_type(attrs, '$._payload') END AS payload_type,
  CASE WHEN {has_payload} THEN json_extract_string(attrs, '$._payload') END AS payload,
  CASE WHEN {has_payload} THEN json_merge_patch(attrs, '{{"_payload":null}}')::VARCHAR END
    AS attrs_rest
FROM f
"""  # noqa: S608 (built from constants only)


_SQL = {guarded: _parse_sql(guarded) for guarded in (False, True)}
_INT64 = r"^(0|-?[1-9][0-9]{0,17})$"  # 18 digits at most: never past int64
_POSITIVE_INT64 = r"^([1-9][0-9]{0,17}|[1-8][0-9]{18})$"  # ts: 19 digits until 2255
_INT32 = r"^(0|-?[1-9][0-9]{0,8})$"
_FLOAT = r"^-?(0|[1-9][0-9]{0,17})(\.[0-9]+)?([eE][-+]?[0-9]{1,2})?$"
_PLAIN_LIST = r'^\["[^"\\]*"(,"[^"\\]*")*\]$'  # strings without escapes: split on ","
_REF = r'^"[0-9a-f]{64}"$'
_RUN_ID = f'^"{RUN_ID.pattern}"$'
_QUOTED = {
    field: pa.array(sorted(f'"{v}"' for v in values))
    for field, values in (("name", NAMES), ("phase", PHASES), ("status", STATUSES))
}

_PAYLOAD = pa.field("payload", pa.string())
_STAGED_SCHEMA = ARROW_SCHEMA.append(_PAYLOAD)
_local = threading.local()

COLUMNAR_MIN = 200  # smaller batches (a quiet stream) parse faster event by event


def _batch_connection() -> duckdb.DuckDBPyConnection:
    """One thread: the machine's cores are the runs' first."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect(config={"threads": 1})
    return con


Dead = tuple[int, str, str]  # index in the batch, reason, the entry's text


def _decode_batch(seqs: list[Any], raws: list[Any]) -> tuple[pa.Table, list[Dead]]:
    """A batch of seqs and event JSON texts as one table in _STAGED_SCHEMA order (the
    payload texts last), and the entries that do not fit."""
    if len(raws) < COLUMNAR_MIN:
        return _decode_slowly(seqs, raws)
    try:
        return _decode_at_once(seqs, raws)
    except (duckdb.Error, pa.ArrowException, TypeError, ValueError, OverflowError):
        log.exception("recorder: the columnar parse failed; this batch goes event by event")
        return _decode_slowly(seqs, raws)


def _decode_at_once(seqs: list[Any], raws: list[Any]) -> tuple[pa.Table, list[Dead]]:
    n = len(raws)
    texts = pa.array(raws, pa.binary())
    try:
        texts = texts.cast(pa.string())
    except pa.ArrowInvalid:  # text that is not UTF-8: those entries are left to _decode
        texts = pa.array([_utf8_or_none(raw) for raw in raws], pa.string())
    index = pa.array(np.arange(n, dtype=np.int64))
    con = _batch_connection()
    con.register("batch", pa.table({"i": index, "e": texts}))
    try:
        try:
            parsed = con.sql(_SQL[False]).to_arrow_table()
        except duckdb.Error:
            parsed = con.sql(_SQL[True]).to_arrow_table()
    finally:
        con.unregister("batch")
    if parsed.num_rows != n or not pc.all(pc.equal(parsed["i"], index)).as_py():
        raise ValueError("the parsed batch is not in the stream's order")
    seq_text = pa.array(seqs, pa.binary()).cast(pa.string())
    fits = _fits_columns(parsed, seq_text)

    fit = fits.to_numpy(zero_copy_only=False)
    if fit.all():
        return _converted(parsed, seq_text), []
    table = _converted(parsed.filter(fits), seq_text.filter(fits))
    rest, kept, dead = _decode_each(seqs, raws, np.flatnonzero(~fit).tolist())
    if rest.num_rows:  # back into the stream's order
        order = np.argsort(np.concatenate([np.flatnonzero(fit), kept]), kind="stable")
        table = pa.concat_tables([table, rest]).take(pa.array(order))
    return table, dead


def _fits_columns(t: pa.Table, seq_text: pa.Array) -> pa.Array:
    """Which parsed events have the common shape and fit the schema (schema.problems)."""

    def plain(column: str) -> pa.ChunkedArray:  # a string without escapes
        text = t[column]
        return pc.and_(pc.starts_with(text, '"'), pc.invert(pc.match_substring(text, "\\")))

    def absent_or(column: str, present: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.or_kleene(pc.is_null(t[column]), present)

    def matches(column: str, pattern: str) -> pa.ChunkedArray:
        return pc.match_substring_regex(t[column], pattern)

    checks = [pc.match_substring_regex(seq_text, _POSITIVE_INT64), matches("run_id", _RUN_ID)]
    for column in ("event_id", "span_id"):
        checks += [plain(column), pc.greater(pc.binary_length(t[column]), 2)]
    checks += [pc.is_in(t[column], value_set=values) for column, values in _QUOTED.items()]
    checks += [
        matches("ts", _POSITIVE_INT64),
        matches("depth", _INT32),
        pc.or_(pc.equal(t["links"], "[]"), matches("links", _PLAIN_LIST)),
        pc.starts_with(t["attrs"], "{"),
    ]
    checks += [absent_or(column, matches(column, _FLOAT)) for column in ("ms", "cost")]
    checks += [
        absent_or(column, matches(column, _INT64))
        for column in ("bytes", "tokens_in", "tokens_out")
    ]
    checks += [
        absent_or(column, plain(column))
        for column in ("parent_id", "venue", "worker_id", "payload_ref")
    ]
    kind = t["payload_type"]
    checks.append(
        pc.or_kleene(
            pc.or_kleene(pc.is_null(kind), pc.equal(kind, "NULL")),
            pc.and_(pc.equal(kind, "VARCHAR"), matches("payload_ref", _REF)),
        )
    )
    fits = checks[0]
    for check in checks[1:]:
        fits = pc.and_kleene(fits, check)
    fits = pc.fill_null(fits, False)
    return fits.combine_chunks() if isinstance(fits, pa.ChunkedArray) else fits


def _converted(t: pa.Table, seq_text: pa.Array) -> pa.Table:
    """Checked JSON texts as the store's columns."""

    def unquoted(column: str) -> pa.ChunkedArray:
        return pc.utf8_slice_codeunits(t[column], 1, -1)

    columns = {
        "run_id": unquoted("run_id"),
        "seq": pc.cast(seq_text, pa.int64()),
        "event_id": unquoted("event_id"),
        "span_id": unquoted("span_id"),
        "parent_id": unquoted("parent_id"),
        "links": _links(t["links"]),
        "name": unquoted("name"),
        "phase": unquoted("phase"),
        "ts": pc.cast(t["ts"], pa.int64()),
        "status": unquoted("status"),
        "venue": unquoted("venue"),
        "worker_id": unquoted("worker_id"),
        "depth": pc.cast(t["depth"], pa.int32()),
        "ms": pc.cast(t["ms"], pa.float64()),
        "bytes": pc.cast(t["bytes"], pa.int64()),
        "tokens_in": pc.cast(t["tokens_in"], pa.int64()),
        "tokens_out": pc.cast(t["tokens_out"], pa.int64()),
        "cost": pc.cast(t["cost"], pa.float64()),
        "payload_ref": unquoted("payload_ref"),
        "attrs": pc.if_else(pc.is_null(t["payload_type"]), t["attrs"], t["attrs_rest"]),
        "payload": t["payload"],
    }
    arrays = [pc.cast(columns[f.name], f.type) for f in _STAGED_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=_STAGED_SCHEMA)


def _links(texts: pa.ChunkedArray) -> pa.Array:
    """Checked lists of plain strings (`["a","b"]`, `[]`) as lists. An if_else with an empty
    list would cost more than all the other columns together: "[]" becomes a null list
    instead, whose offsets, read without its validity, are an empty list."""
    texts = texts.combine_chunks()
    inner = pc.if_else(pc.equal(texts, "[]"), None, pc.utf8_slice_codeunits(texts, 2, -2))
    lists = pc.split_pattern(inner, '","')
    offsets = lists.offsets.to_numpy()
    null = lists.is_null().to_numpy(zero_copy_only=False)
    if lists.offset or (offsets[1:] != offsets[:-1])[null].any():
        raise ValueError("a null list holds values")  # the batch goes event by event
    return pa.ListArray.from_arrays(lists.offsets, lists.values)


def _decode_slowly(seqs: list[Any], raws: list[Any]) -> tuple[pa.Table, list[Dead]]:
    table, _, dead = _decode_each(seqs, raws, range(len(raws)))
    return table, dead


def _decode_each(
    seqs: list[Any], raws: list[Any], indices: Any
) -> tuple[pa.Table, list[int], list[Dead]]:
    """The entries at `indices`, event by event: their table, which of them it holds, and
    the dead ones."""
    rows: list[dict[str, Any]] = []
    kept: list[int] = []
    dead: list[Dead] = []
    for index in indices:
        event, reason = _decode({b"seq": seqs[index], b"e": raws[index]})
        if event is None:
            dead.append((index, reason, _raw_text(raws[index])))
        else:
            rows.append(_row(event))
            kept.append(index)
    try:
        return pa.Table.from_pylist(rows, schema=_STAGED_SCHEMA), kept, dead
    except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError):
        pass
    # One row the store cannot take (text that is not Unicode, say) must not stop the batch:
    # that row alone is dead-lettered.
    tables, still_kept = [], []
    for row, index in zip(rows, kept, strict=True):
        try:
            tables.append(pa.Table.from_pylist([row], schema=_STAGED_SCHEMA))
            still_kept.append(index)
        except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError) as exc:
            dead.append((index, f"the event does not fit the store: {exc}", _raw_text(raws[index])))
    dead.sort()
    table = pa.concat_tables(tables) if tables else _STAGED_SCHEMA.empty_table()
    return table, still_kept, dead


def _row(event: Event) -> dict[str, Any]:
    row: dict[str, Any] = {"links": [], "depth": 0, **event}  # the schema's defaults
    for field in ("ms", "cost"):  # a whole number past int64 is still a float64
        if type(row.get(field)) is int:
            row[field] = float(row[field])
    attrs = dict(row.get("attrs") or {})
    row["payload"] = attrs.pop("_payload", None)
    row["attrs"] = json.dumps(attrs, separators=(",", ":"), default=str)
    return row


def _utf8_or_none(raw: Any) -> str | None:
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) else None


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
        carried = pc.is_valid(payloads)
        refs = pc.filter(events.column("payload_ref"), carried).to_pylist()
        for ref, text in zip(refs, pc.filter(payloads, carried).to_pylist(), strict=True):
            if ref:
                writer.add(ref, text)
    table = events.drop_columns(["payload"])
    directory = store.run_dir(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    first_event = events.column("event_id")[0].as_py()
    final = directory / f"seg-{first_id}-{first_event}.parquet"
    tmp = directory / f".{final.name}.tmp"
    pq.write_table(table, tmp, compression="zstd", use_dictionary=_FEW_VALUES)
    return tmp, final


# Columns with few distinct values: a dictionary pays there. Ids, times and attrs are
# nearly all distinct, and a dictionary tried on them was a sixth of the write.
_FEW_VALUES = ["run_id", "name", "phase", "status", "venue", "worker_id", "depth"]


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
