"""Parsing stream entries: the emitter's layout taken in bulk, and each event parsed and
checked in Python, the reference for what is stored and why an event is dead-lettered
(traces.recorder.columnar parses big batches at once and hands it what it does not judge)."""

from __future__ import annotations

import json
from operator import itemgetter
from typing import Any

import pyarrow as pa

from frlm_web import jsontext
from traces.schema import ARROW_SCHEMA, Event, problems

# A batch parsed as one table: the store's columns, then the payload texts (for the blob
# pack, dropped from the segment).
_PAYLOAD = pa.field("payload", pa.string())
_STAGED_SCHEMA = ARROW_SCHEMA.append(_PAYLOAD)

Dead = tuple[int, str, str]  # index in the batch, reason, the entry's text


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
        event = jsontext.loads(raw)
    except ValueError as exc:
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


def _raw_text(raw: Any) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
