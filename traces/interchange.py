"""Trace interchange: what the importers (OTLP, rlms logs) and exporters (OTLP, JSON lines,
Parquet) share.

An importer parses its format into `ImportedSpan`s (plus instants that hang on no span);
`to_events` turns those into schema-valid events of a fresh run, ordered as they happened,
with payload text in `attrs["_payload"]` so the recorder moves it to the blob store.
Exporters take a run's stored events as `store.read_events` returns them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from traces.emitter import new_id, sha256_text
from traces.schema import ARROW_SCHEMA, Event, problems

_START_METRICS = ("bytes",)
_END_METRICS = ("ms", "tokens_in", "tokens_out", "cost")
METRICS = ("ms", "bytes", "tokens_in", "tokens_out", "cost")


class InterchangeError(ValueError):
    """Input that is not the format it should be; the message says what was expected."""


@dataclass
class ImportedEvent:
    """A point event: an instant (Run.Done, SubQuery.Return...) or a span's progress."""

    name: str
    ts_ns: int
    phase: str = "instant"
    status: str = "ok"
    venue: str | None = None
    worker_id: str | None = None
    depth: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    payload: str | None = None  # the text, when the source carries it
    payload_ref: str | None = None  # only a reference, when it does not
    links: list[str] = field(default_factory=list)


@dataclass
class ImportedSpan:
    """One span as a source describes it. `key` is its id in the source; `parent` and
    `links` refer to other spans by key."""

    key: str
    parent: str | None
    name: str
    start_ns: int
    end_ns: int | None
    status: str = "ok"
    venue: str | None = None
    worker_id: str | None = None
    depth: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    start_attrs: dict[str, Any] = field(default_factory=dict)
    end_attrs: dict[str, Any] = field(default_factory=dict)
    start_payload: str | None = None
    end_payload: str | None = None
    start_payload_ref: str | None = None
    end_payload_ref: str | None = None
    links: list[str] = field(default_factory=list)
    events: list[ImportedEvent] = field(default_factory=list)


@dataclass
class ParsedTrace:
    """What an importer hands on: the spans, instants that hang on no span, and what the
    source says about itself (for the run row and the report)."""

    source: str  # "otlp" or "rlms"
    spans: list[ImportedSpan]
    loose: list[ImportedEvent] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


# --- spans to events --------------------------------------------------------------------


def to_events(trace: ParsedTrace, run_id: str) -> list[Event]:
    """1. give every span a fresh id, 2. make its start, end, instant and progress events,
    3. order them as they happened, 4. check each against the schema; any problem raises
    InterchangeError naming the event."""
    if not trace.spans:
        raise InterchangeError(f"the {trace.source} trace holds no spans")
    ids = {span.key: new_id() for span in trace.spans}
    levels = _tree_levels(trace.spans)
    keyed: list[tuple[tuple[int, int, float], Event]] = []
    for span in trace.spans:
        level = levels[span.key]
        for event in _span_events(span, run_id, ids):
            keyed.append((_order(event, span.start_ns, level), event))
    for point in trace.loose:
        event = _point_event(point, run_id, None, None, ids)
        keyed.append((_order(event, None, -1), event))
    keyed.sort(key=lambda pair: pair[0])
    events = [event for _, event in keyed]
    check_events(events)
    return events


def _order(event: Event, span_start: int | None, level: int) -> tuple[int, int, float]:
    """Where an event goes among those of the same nanosecond: what ends (deepest first,
    a span's instants just before its own end) goes before what starts (parents first);
    a span that starts at that very nanosecond ends after it starts."""
    ts = event["ts"]
    if event["phase"] == "start":
        return (ts, 1, level)
    late = 2 if span_start == ts else 0
    if event["phase"] == "end":
        return (ts, late, -level)
    return (ts, late, -(level + 0.5))  # an instant or progress point on the span


def check_events(events: list[Event]) -> None:
    """Every event must pass the schema (seq is given here as the stream would give it)."""
    for seq, event in enumerate(events, start=1):
        found = problems({**event, "seq": seq})
        if found:
            raise InterchangeError(
                f"event {seq} ({event.get('name')} {event.get('phase')}) does not fit the "
                f"trace schema: {'; '.join(found)}"
            )


def _tree_levels(spans: list[ImportedSpan]) -> dict[str, int]:
    parents = {span.key: span.parent for span in spans}
    levels: dict[str, int] = {}
    for key in parents:
        chain: list[str] = []
        node: str | None = key
        while node is not None and node in parents and node not in levels:
            if node in chain:  # a cycle in the source: cut it here
                break
            chain.append(node)
            node = parents[node]
        base = levels.get(node, -1) if node is not None else -1
        for offset, member in enumerate(reversed(chain), start=1):
            levels[member] = base + offset
    return levels


def _span_events(span: ImportedSpan, run_id: str, ids: dict[str, str]) -> list[Event]:
    span_id = ids[span.key]
    parent = ids.get(span.parent) if span.parent else None
    links = [ids.get(link, link) for link in span.links]
    common = {
        "run_id": run_id,
        "span_id": span_id,
        "parent_id": parent,
        "name": span.name,
        "venue": span.venue,
        "worker_id": span.worker_id,
        "depth": span.depth,
    }
    start: Event = {
        **common,
        "event_id": new_id(),
        "links": links,
        "phase": "start",
        "ts": span.start_ns,
        "status": "ok",
        "attrs": dict(span.start_attrs),
    }
    _put_metrics(start, span.metrics, _START_METRICS)
    _put_payload(start, span.start_payload, span.start_payload_ref)
    events = [start]
    for point in span.events:
        if point.phase == "progress":
            events.append(_point_event(point, run_id, span_id, parent, ids, own_span=True))
        else:
            events.append(_point_event(point, run_id, span_id, None, ids))
    if span.end_ns is not None:
        end: Event = {
            **common,
            "event_id": new_id(),
            "links": [],
            "phase": "end",
            "ts": span.end_ns,
            "status": span.status,
            "attrs": dict(span.end_attrs),
        }
        _put_metrics(end, span.metrics, _END_METRICS)
        _put_payload(end, span.end_payload, span.end_payload_ref)
        events.append(end)
    return events


def _point_event(
    point: ImportedEvent,
    run_id: str,
    span_id: str | None,
    parent: str | None,
    ids: dict[str, str],
    *,
    own_span: bool = False,
) -> Event:
    """An instant hangs on its span (parent = the span); progress belongs to the span itself
    (span id = the span, parent = the span's parent), as the emitter writes them."""
    event: Event = {
        "run_id": run_id,
        "event_id": new_id(),
        "span_id": span_id if own_span and span_id else new_id(),
        "parent_id": parent if own_span else span_id,
        "links": [ids.get(link, link) for link in point.links],
        "name": point.name,
        "phase": point.phase,
        "ts": point.ts_ns,
        "status": point.status,
        "venue": point.venue,
        "worker_id": point.worker_id,
        "depth": point.depth,
        "attrs": dict(point.attrs),
    }
    _put_metrics(event, point.metrics, METRICS)
    _put_payload(event, point.payload, point.payload_ref)
    return event


def _put_metrics(event: Event, metrics: dict[str, float], keys: tuple[str, ...]) -> None:
    for key in keys:
        if metrics.get(key) is not None:
            event[key] = metrics[key]  # type: ignore[literal-required]


def _put_payload(event: Event, text: str | None, ref: str | None) -> None:
    if text is not None:
        event["payload_ref"] = sha256_text(text)
        # The recorder moves the text into the blob store and keeps only the ref.
        event["attrs"] = {**event["attrs"], "_payload": text}
    elif ref:
        event["payload_ref"] = ref


# --- exports ----------------------------------------------------------------------------


def to_jsonl(run_id: str, events: list[dict[str, Any]]) -> str:
    """One JSON object per line per event, in seq order, each naming its run."""
    lines = [
        json.dumps({"run_id": run_id, **event}, separators=(",", ":"), default=str)
        for event in events
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def to_arrow(run_id: str, events: list[dict[str, Any]]) -> pa.Table:
    """The events as one Arrow table with the store's schema, built column by column."""
    columns: dict[str, list[Any]] = {}
    for column in ARROW_SCHEMA.names:
        if column == "run_id":
            columns[column] = [run_id] * len(events)
        elif column == "attrs":
            columns[column] = [
                json.dumps(e.get("attrs") or {}, separators=(",", ":"), default=str) for e in events
            ]
        elif column == "links":
            columns[column] = [list(e.get("links") or []) for e in events]
        else:
            columns[column] = [e.get(column) for e in events]
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def write_parquet(run_id: str, events: list[dict[str, Any]], path: Path) -> None:
    pq.write_table(to_arrow(run_id, events), path, compression="zstd")


# --- reading ------------------------------------------------------------------------------


def json_lines(text: str) -> list[tuple[int, Any]]:
    """Each non-blank line of a JSON-lines text, parsed, with its line number. A last line
    that does not parse is reported as a cut-off file, any other as a bad line."""
    lines = text.split("\n")
    filled = [n for n, line in enumerate(lines, start=1) if line.strip()]
    parsed: list[tuple[int, Any]] = []
    for number in filled:
        try:
            parsed.append((number, json.loads(lines[number - 1])))
        except ValueError as exc:
            if number == filled[-1]:
                raise InterchangeError(
                    f"line {number}, the last, is not complete JSON: the file looks truncated"
                ) from None
            raise InterchangeError(f"line {number} is not JSON ({exc})") from None
    return parsed
