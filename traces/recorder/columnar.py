"""The batch parse: a big batch of stream entries parsed and checked at once, in DuckDB and
Arrow, with what it cannot judge left to traces.recorder.decode."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traces.recorder.decode import _STAGED_SCHEMA, Dead, _decode_each, _decode_slowly
from traces.schema import ARROW_SCHEMA, NAMES, PHASES, RUN_ID, STATUSES

log = logging.getLogger("traces.recorder")  # the name its log lines had before the split

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

_local = threading.local()

COLUMNAR_MIN = 200  # smaller batches (a quiet stream) parse faster event by event


def _batch_connection() -> duckdb.DuckDBPyConnection:
    """One thread: the machine's cores are the runs' first."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect(config={"threads": 1})
    return con


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


def _utf8_or_none(raw: Any) -> str | None:
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) else None
