"""OpenTelemetry export and import of a run's trace, as OTLP/JSON (an
`ExportTraceServiceRequest`: resourceSpans > scopeSpans > spans).

Export (`to_otlp`), made from the stored events:
- one trace per run; its trace id is 32 hex derived from the run id (stable), span ids are
  the FRLM span ids (16 hex already; anything else is hashed to 16 hex);
- only finished spans: OTLP knows no open span, so spans still open are left out and
  counted in the resource attribute `frlm.open_spans`;
- model spans (Run.Decode, SubQuery.Execute) follow the GenAI semantic conventions: kind
  CLIENT, name `chat {model}`, `gen_ai.operation.name`, `gen_ai.request.model`,
  `gen_ai.usage.input_tokens` / `output_tokens`, `gen_ai.provider.name` (and the older
  `gen_ai.system`) where the provider is known; every other span is INTERNAL;
- every FRLM field is kept under `frlm.*`: event_name, status, venue, worker_id, depth, ms,
  bytes, tokens_in, tokens_out, cost, start/end payload refs (and texts, unless left out),
  `frlm.attrs.<key>` for the span's attrs (`frlm.end_attr_keys` says which came with the
  end event), so an export imports back to the same span tree;
- instants (Run.Done, SubQuery.Return...) and progress events become span events on their
  span; links become OTLP links; status OK, or ERROR with a message.
Per the OTLP/JSON encoding, ids are hex, enums integers and 64-bit integers strings.

The import of such a document is `traces/otlp_import.py`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from traces import blobs
from traces.interchange import (
    METRICS,
    InterchangeError,
)
from traces.otlp_semconv import (
    MODEL_SPANS,
    SpanText,
    chat_messages,
    semconv_fields,
    trace_fields,
)

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_CODE_OK = 1
STATUS_CODE_ERROR = 2
SCOPE = {"name": "frlm.traces", "version": "1"}

HEX16 = re.compile(r"^[0-9a-fA-F]{16}\Z")
HEX32 = re.compile(r"^[0-9a-fA-F]{32}\Z")
FRLM_ATTRS = "frlm.attrs."
_SIM_SUFFIX = " (simulated model)"


class AnyValue(TypedDict, total=False):
    stringValue: str
    boolValue: bool
    intValue: str
    doubleValue: float | str
    arrayValue: dict[str, list[AnyValue]]
    kvlistValue: dict[str, list[KeyValue]]
    bytesValue: str


class KeyValue(TypedDict):
    key: str
    value: AnyValue


class OtlpStatus(TypedDict, total=False):
    code: int
    message: str


class OtlpEvent(TypedDict):
    timeUnixNano: str
    name: str
    attributes: list[KeyValue]


class OtlpLink(TypedDict):
    traceId: str
    spanId: str


class OtlpSpan(TypedDict, total=False):
    traceId: str
    spanId: str
    parentSpanId: str
    name: str
    kind: int
    startTimeUnixNano: str
    endTimeUnixNano: str
    attributes: list[KeyValue]
    events: list[OtlpEvent]
    links: list[OtlpLink]
    status: OtlpStatus


class ScopeSpans(TypedDict):
    scope: dict[str, str]
    spans: list[OtlpSpan]


class ResourceSpans(TypedDict):
    resource: dict[str, list[KeyValue]]
    scopeSpans: list[ScopeSpans]


class ExportTraceServiceRequest(TypedDict):
    resourceSpans: list[ResourceSpans]


# --- ids and values -----------------------------------------------------------------------


def trace_id_for(run_id: str) -> str:
    return hashlib.sha256(f"frlm-run:{run_id}".encode()).hexdigest()[:32]


def span_id_for(span_id: str) -> str:
    """FRLM span ids are 16 hex already; anything else gets a stable 16-hex stand-in."""
    if HEX16.match(span_id):
        return span_id.lower()
    return hashlib.sha256(f"frlm-span:{span_id}".encode()).hexdigest()[:16]


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        # JSON has no NaN or infinity; the protobuf JSON mapping spells them as strings.
        return {
            "doubleValue": "NaN"
            if math.isnan(value)
            else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [kv(str(k), v) for k, v in value.items()]}}
    if value is None:
        return {}
    return {"stringValue": str(value)}


def kv(key: str, value: Any) -> KeyValue:
    return {"key": key, "value": any_value(value)}


def plain_value(value: Any) -> Any:
    """An AnyValue back to plain JSON (an empty AnyValue is None)."""
    if not isinstance(value, dict):
        raise InterchangeError(f"an attribute value must be an AnyValue object, got {value!r}")
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int_field(value["intValue"], "intValue")
    if "doubleValue" in value:
        try:
            return float(value["doubleValue"])
        except (TypeError, ValueError):
            raise InterchangeError(f"not a doubleValue: {value['doubleValue']!r}") from None
    if "arrayValue" in value:
        return [plain_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return attributes_dict((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes_dict(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        raise InterchangeError("attributes must be a list of {key, value} objects")
    found: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise InterchangeError(f"an attribute must be a {{key, value}} object, got {item!r}")
        found[item["key"]] = plain_value(item.get("value", {}))
    return found


def _attributes(values: dict[str, Any]) -> list[KeyValue]:
    return [kv(key, value) for key, value in values.items() if value is not None]


# --- export -------------------------------------------------------------------------------


@dataclass
class _Span:
    span_id: str
    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def parent_id(self) -> str | None:
        first = self.start or self.end or {}
        return first.get("parent_id")


def to_otlp(
    run_id: str,
    events: list[dict[str, Any]],
    *,
    payload_text: Callable[[str], str | None] | None = blobs.blob_get,
) -> ExportTraceServiceRequest:
    """The run's events (as `store.read_events` gives them) as one OTLP/JSON request.
    `payload_text` looks a payload ref up; None leaves payload texts out (refs stay)."""
    spans, loose = _group(events)
    finished = {sid: s for sid, s in spans.items() if s.start and s.end}
    trace_id = trace_id_for(run_id)
    cancels = _cancelled_copies(loose)
    dropped = _hang_points(spans, finished, loose)
    context = _Export(run_id, trace_id, finished, payload_text, _clipped(finished), cancels)
    otlp_spans = [
        _otlp_span(context, span)
        for span in sorted(finished.values(), key=lambda s: (s.start or {})["seq"])
    ]
    resource = {
        "service.name": "frlm",
        "frlm.run_id": run_id,
        "frlm.event_count": len(events),
        "frlm.open_spans": sum(1 for s in spans.values() if s.start and not s.end),
        "frlm.unstarted_spans": sum(1 for s in spans.values() if s.end and not s.start),
        "frlm.dropped_events": dropped,
    }
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [{"scope": dict(SCOPE), "spans": otlp_spans}],
            }
        ]
    }


@dataclass
class _Export:
    """What every span of one export needs to see beyond itself."""

    run_id: str
    trace_id: str
    finished: dict[str, _Span]
    payload_text: Callable[[str], str | None] | None
    windows: dict[str, tuple[int, int]]  # span id -> (start, end) inside its parent's
    cancels: dict[str, str]  # sq_id of a copy given up -> why

    def text(self, ref: str | None) -> str | None:
        return self.payload_text(ref) if ref and self.payload_text else None


def _cancelled_copies(instants: list[dict[str, Any]]) -> dict[str, str]:
    """The attempts the conductor gave up (SubQuery.Cancel names their sq_id): a hedge's
    losing copy, or a copy no longer needed. Their workers may still finish them later."""
    found: dict[str, str] = {}
    for event in instants:
        attrs = event.get("attrs") or {}
        if event["name"] == "SubQuery.Cancel" and isinstance(attrs.get("sq_id"), str):
            found[attrs["sq_id"]] = str(attrs.get("reason") or "cancelled by the conductor")
    return found


def _clipped(finished: dict[str, _Span]) -> dict[str, tuple[int, int]]:
    """Each span's (start, end) clipped into its parent's clipped window: a copy the
    conductor gave up ends on its worker after the sub-query and even the run were over,
    and viewers measure a trace by its latest end."""
    windows: dict[str, tuple[int, int]] = {}

    def window(span: _Span, seen: frozenset[str]) -> tuple[int, int]:
        if span.span_id in windows:
            return windows[span.span_id]
        start, end = int((span.start or {})["ts"]), int((span.end or {})["ts"])
        parent = finished.get(span.parent_id or "")
        if parent is not None and parent.span_id not in seen:
            low, high = window(parent, seen | {span.span_id})
            end = max(low, min(end, high))
            start = max(low, min(start, end))
        windows[span.span_id] = (start, end)
        return start, end

    for span in finished.values():
        window(span, frozenset({span.span_id}))
    return windows


def _group(events: list[dict[str, Any]]) -> tuple[dict[str, _Span], list[dict[str, Any]]]:
    spans: dict[str, _Span] = {}
    instants: list[dict[str, Any]] = []
    for event in events:
        if event["phase"] == "instant":
            instants.append(event)
            continue
        span = spans.setdefault(event["span_id"], _Span(event["span_id"]))
        if event["phase"] == "start":
            span.start = event
        elif event["phase"] == "end":
            span.end = event
        else:  # progress: a point on the span itself
            span.points.append(event)
    return spans, instants


def _hang_points(
    spans: dict[str, _Span], finished: dict[str, _Span], instants: list[dict[str, Any]]
) -> int:
    """Put each instant on its span, or on the nearest finished ancestor when its span is
    not exported, or on the first root; returns how many found no home."""
    roots = [s for s in finished.values() if not s.parent_id or s.parent_id not in finished]
    roots.sort(key=lambda s: (s.start or {})["seq"])
    dropped = 0
    for span in spans.values():
        if span.span_id not in finished and span.points:
            dropped += len(span.points)
    for event in instants:
        home = _finished_ancestor(event.get("parent_id"), spans, finished)
        if home is None and roots:
            home = roots[0]
        if home is None:
            dropped += 1
        else:
            home.points.append(event)
    return dropped


def _finished_ancestor(
    span_id: str | None, spans: dict[str, _Span], finished: dict[str, _Span]
) -> _Span | None:
    seen: set[str] = set()
    while span_id and span_id not in seen:
        seen.add(span_id)
        if span_id in finished:
            return finished[span_id]
        span = spans.get(span_id)
        span_id = span.parent_id if span else None
    return None


def _otlp_span(export: _Export, span: _Span) -> OtlpSpan:
    start, end = span.start or {}, span.end or {}
    name = start["name"]
    attrs = {**(start.get("attrs") or {}), **(end.get("attrs") or {})}
    status = end.get("status") or "ok"
    fields = _frlm_fields_of(export, span, attrs)
    gave_up = export.cancels.get(str(attrs.get("sq_id"))) if name == "SubQuery.Execute" else None
    if gave_up is not None:
        # The worker finished (or failed) a copy nobody waited for any more.
        fields["frlm.cancelled_copy"] = True
        fields["frlm.cancel_reason"] = gave_up
        fields["frlm.hedge_loser"] = gave_up.startswith("hedged")
        if status == "ok":
            status, attrs = "cancelled", {**attrs, "reason": gave_up}
    began, ended = export.windows[span.span_id]
    if ended != int(end["ts"]) or began != int(start["ts"]):
        fields["frlm.clipped"] = True
        fields["frlm.recorded_start_ns"] = int(start["ts"])
        fields["frlm.recorded_end_ns"] = int(end["ts"])
    links = [link for link in start.get("links") or [] if link]
    if any(not HEX16.match(link) for link in links):
        fields["frlm.links"] = links  # kept as text where OTLP links cannot say them
    model, provider = model_name(attrs.get("model"))
    otlp_status = _status(status, attrs)
    fields.update(
        semconv_fields(
            name,
            attrs,
            _span_text(export, span, name, attrs),
            model=model,
            provider=provider,
            tokens=(end.get("tokens_in"), end.get("tokens_out")),
            cost=end.get("cost"),
            status=status,
            status_message=otlp_status.get("message"),
        )
    )
    if span.parent_id is None or span.parent_id not in export.finished:
        fields.update(_root_fields(export, span, attrs))
    span_name = name
    kind = SPAN_KIND_INTERNAL
    if name in MODEL_SPANS:
        kind = SPAN_KIND_CLIENT
        span_name = f"chat {model}" if model else "chat"
    otlp: OtlpSpan = {
        "traceId": export.trace_id,
        "spanId": span_id_for(span.span_id),
        "name": span_name,
        "kind": kind,
        "startTimeUnixNano": str(began),
        "endTimeUnixNano": str(ended),
        "attributes": [],
        "events": [
            _otlp_event(p, export.payload_text, began, ended) for p in sorted(span.points, key=_seq)
        ],
        "links": [
            {"traceId": export.trace_id, "spanId": link.lower()}
            for link in links
            if HEX16.match(link)
        ],
        "status": otlp_status,
    }
    if span.parent_id:
        otlp["parentSpanId"] = span_id_for(span.parent_id)
    if status != "ok":
        fields["error.type"] = status
    otlp["attributes"] = _attributes(fields)
    return otlp


def _frlm_fields_of(export: _Export, span: _Span, attrs: dict[str, Any]) -> dict[str, Any]:
    """Every FRLM field under frlm.*, so that an export imports back to the same tree."""
    start, end = span.start or {}, span.end or {}
    fields: dict[str, Any] = {
        "frlm.run_id": export.run_id,
        "frlm.event_name": start["name"],
        "frlm.status": end.get("status") or "ok",
        "frlm.span_id": span.span_id,
        "frlm.venue": end.get("venue") or start.get("venue"),
        "frlm.worker_id": end.get("worker_id") or start.get("worker_id"),
        "frlm.depth": end.get("depth") if end.get("depth") is not None else start.get("depth"),
        "frlm.bytes": start.get("bytes"),
    }
    for metric in ("ms", "tokens_in", "tokens_out", "cost"):
        fields[f"frlm.{metric}"] = end.get(metric)
    fields.update(
        _payload_fields("frlm.start_payload", start.get("payload_ref"), export.payload_text)
    )
    fields.update(_payload_fields("frlm.end_payload", end.get("payload_ref"), export.payload_text))
    fields.update({f"{FRLM_ATTRS}{key}": value for key, value in attrs.items()})
    end_keys = sorted((end.get("attrs") or {}).keys())
    if end_keys:
        fields["frlm.end_attr_keys"] = end_keys
    return fields


def _span_text(export: _Export, span: _Span, name: str, attrs: dict[str, Any]) -> SpanText:
    """The span's input and output as texts: its own payloads, the question and answer on
    a run, and on a worker's model call the prompt its sub-query sent."""
    start, end = span.start or {}, span.end or {}
    given = export.text(start.get("payload_ref"))
    taken = export.text(end.get("payload_ref"))
    if name == "Run.Init":
        done = next((p for p in span.points if p["name"] == "Run.Done"), None)
        question = attrs.get("question")
        answer = export.text(done.get("payload_ref")) if done else None
        return {"input": question if isinstance(question, str) else None, "output": answer}
    if name == "SubQuery.Execute" and given is None:
        parent = export.finished.get(span.parent_id or "")
        given = export.text((parent.start or {}).get("payload_ref")) if parent else None
    if name == "Run.Decode":
        return {"input": given, "output": taken, "messages": chat_messages(given)}
    return {"input": given, "output": taken}


def _root_fields(export: _Export, span: _Span, attrs: dict[str, Any]) -> dict[str, Any]:
    text = _span_text(export, span, (span.start or {})["name"], attrs)
    return trace_fields(export.run_id, text.get("input"), text.get("output"))


def _seq(event: dict[str, Any]) -> int:
    return event.get("seq") or 0


def _status(status: str, attrs: dict[str, Any]) -> OtlpStatus:
    if status == "ok":
        return {"code": STATUS_CODE_OK}
    message = attrs.get("error") or attrs.get("reason") or status
    return {"code": STATUS_CODE_ERROR, "message": str(message)}


def _payload_fields(
    prefix: str, ref: str | None, payload_text: Callable[[str], str | None] | None
) -> dict[str, Any]:
    if not ref:
        return {}
    fields: dict[str, Any] = {f"{prefix}_ref": ref}
    text = payload_text(ref) if payload_text else None
    if text is not None:
        fields[prefix] = text
    return fields


def _otlp_event(
    event: dict[str, Any],
    payload_text: Callable[[str], str | None] | None,
    began: int,
    ended: int,
) -> OtlpEvent:
    fields: dict[str, Any] = {
        "frlm.event_name": event["name"],
        "frlm.phase": event["phase"],
        "frlm.status": event.get("status"),
        "frlm.venue": event.get("venue"),
        "frlm.worker_id": event.get("worker_id"),
        "frlm.depth": event.get("depth"),
    }
    for metric in METRICS:
        fields[f"frlm.{metric}"] = event.get(metric)
    fields.update(_payload_fields("frlm.payload", event.get("payload_ref"), payload_text))
    if event.get("links"):
        fields["frlm.links"] = list(event["links"])
    fields.update(
        {f"{FRLM_ATTRS}{key}": value for key, value in (event.get("attrs") or {}).items()}
    )
    ts = max(began, min(int(event["ts"]), ended))
    if ts != int(event["ts"]):
        fields["frlm.recorded_ts_ns"] = int(event["ts"])  # kept inside its clipped span
    return {
        "timeUnixNano": str(ts),
        "name": event["name"],
        "attributes": _attributes(fields),
    }


def model_name(label: Any) -> tuple[str | None, str | None]:
    """(model, provider) from an FRLM model label: `NAME (simulated model)`,
    `NAME at BASE_URL`, or a bare name (imported runs)."""
    if not isinstance(label, str) or not label:
        return None, None
    if label.endswith(_SIM_SUFFIX):
        return label[: -len(_SIM_SUFFIX)], "frlm.simulated"
    name, at, url = label.partition(" at ")
    if at:
        return name, "openai" if "api.openai.com" in url else None
    return label, None


def int_field(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool) or value is None:
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise InterchangeError(f"{what} must be an integer (as a string), got {value!r}") from None
