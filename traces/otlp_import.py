"""OpenTelemetry import of a trace (`from_otlp`): an OTLP/JSON document (an
`ExportTraceServiceRequest`, as `traces/otlp.py` writes it or any other tool does) read back
into `ImportedSpan`s. Spans from other tools (no `frlm.event_name`) are mapped onto the
taxonomy: a root span is Run.Init, a GenAI span under a root is Run.Decode and deeper a
SubQuery.Execute, anything else Repl.Exec. FRLM's own exports import back to the same span
tree, with the times they recorded before the export clipped them into their parents.
"""

from __future__ import annotations

from typing import Any

from traces.interchange import (
    METRICS,
    ImportedEvent,
    ImportedSpan,
    InterchangeError,
    ParsedTrace,
)
from traces.otlp import (
    FRLM_ATTRS,
    HEX16,
    HEX32,
    STATUS_CODE_ERROR,
    attributes_dict,
    int_field,
)
from traces.schema import NAMES, STATUSES


def from_otlp(data: Any) -> ParsedTrace:
    """An OTLP/JSON trace document as spans; InterchangeError for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("resourceSpans"), list):
        raise InterchangeError(
            "not an OTLP trace: expected a JSON object with a resourceSpans list "
            "(an OTLP/JSON ExportTraceServiceRequest)"
        )
    raw: list[tuple[str, dict[str, Any]]] = []
    notes: dict[str, Any] = {"skipped_events": 0}
    for r, resource_spans in enumerate(data["resourceSpans"]):
        where = f"resourceSpans[{r}]"
        if not isinstance(resource_spans, dict):
            raise InterchangeError(f"{where} must be an object")
        described = resource_spans.get("resource")
        resource = attributes_dict(
            described.get("attributes", []) if isinstance(described, dict) else []
        )
        for key in ("frlm.run_id", "frlm.open_spans"):
            if key in resource:
                notes[key] = resource[key]
        scopes = resource_spans.get("scopeSpans", resource_spans.get("instrumentationLibrarySpans"))
        if not isinstance(scopes, list):
            raise InterchangeError(f"{where}.scopeSpans must be a list")
        for s, scope in enumerate(scopes):
            spans = scope.get("spans") if isinstance(scope, dict) else None
            if not isinstance(spans, list):
                raise InterchangeError(f"{where}.scopeSpans[{s}].spans must be a list")
            raw.extend((f"{where}.scopeSpans[{s}].spans[{i}]", sp) for i, sp in enumerate(spans))
    if not raw:
        raise InterchangeError("the OTLP trace holds no spans")
    checked = [_checked_span(where, span) for where, span in raw]
    keys = [span["spanId"].lower() for span in checked]
    if len(set(keys)) != len(keys):
        raise InterchangeError("the OTLP trace has two spans with one spanId")
    parents = {
        k: (s.get("parentSpanId") or "").lower() or None for k, s in zip(keys, checked, strict=True)
    }
    imported = [_imported_span(span, parents, notes) for span in checked]
    return ParsedTrace("otlp", imported, notes=notes)


def _checked_span(where: str, span: Any) -> dict[str, Any]:
    if not isinstance(span, dict):
        raise InterchangeError(f"{where} must be an object")
    if not isinstance(span.get("spanId"), str) or not HEX16.match(span["spanId"]):
        raise InterchangeError(f"{where}.spanId must be 16 hex digits")
    if not isinstance(span.get("traceId"), str) or not HEX32.match(span["traceId"]):
        raise InterchangeError(f"{where}.traceId must be 32 hex digits")
    parent = span.get("parentSpanId") or ""
    if parent and (not isinstance(parent, str) or not HEX16.match(parent)):
        raise InterchangeError(f"{where}.parentSpanId must be 16 hex digits or empty")
    if not isinstance(span.get("name"), str):
        raise InterchangeError(f"{where}.name must be a string")
    start = int_field(span.get("startTimeUnixNano"), f"{where}.startTimeUnixNano")
    end = int_field(span.get("endTimeUnixNano"), f"{where}.endTimeUnixNano")
    if start <= 0 or end < start:
        raise InterchangeError(f"{where}: its times must be positive and end after start")
    return span


def _imported_span(
    span: dict[str, Any], parents: dict[str, str | None], notes: dict[str, Any]
) -> ImportedSpan:
    key = span["spanId"].lower()
    attrs = attributes_dict(span.get("attributes", []))
    parent = parents[key] if parents[key] in parents else None
    start_ns = int(span["startTimeUnixNano"])
    end_ns = int(span["endTimeUnixNano"])
    status = span.get("status") if isinstance(span.get("status"), dict) else {}
    imported = ImportedSpan(
        key=key,
        parent=parent,
        name="",
        start_ns=start_ns,
        end_ns=end_ns,
        links=[
            str(link.get("spanId", "")).lower()
            for link in span.get("links") or []
            if isinstance(link, dict) and link.get("spanId")
        ],
    )
    if attrs.get("frlm.event_name") in NAMES:
        _frlm_fields(imported, attrs)
    else:
        _foreign_fields(imported, span, attrs, parents)
    # FRLM's export marks a copy nobody waited for (a hedge's loser) as an error for other
    # tools; its own status is what the worker reported (it was imported as a failure).
    copy = attrs.get("frlm.cancelled_copy") is True and attrs.get("frlm.event_name") in NAMES
    if (
        imported.status == "ok"
        and not copy
        and status.get("code") in (STATUS_CODE_ERROR, "STATUS_CODE_ERROR")
    ):
        imported.status = "error"
        imported.end_attrs.setdefault("error", status.get("message") or "error")
    if imported.metrics.get("ms") is None:
        imported.metrics["ms"] = (end_ns - start_ns) / 1e6
    for event in span.get("events") or []:
        point = _imported_event(event, imported.depth)
        if point is None:
            notes["skipped_events"] += 1
        else:
            imported.events.append(point)
    return imported


def _frlm_fields(span: ImportedSpan, attrs: dict[str, Any]) -> None:
    """A span FRLM exported: every field comes back from its frlm.* attributes."""
    span.name = attrs["frlm.event_name"]
    # A span clipped into its parent on export comes back with the times it recorded.
    began, ended = attrs.get("frlm.recorded_start_ns"), attrs.get("frlm.recorded_end_ns")
    if isinstance(began, int) and isinstance(ended, int) and 0 < began <= ended:
        span.start_ns, span.end_ns = began, ended
    if attrs.get("frlm.status") in STATUSES:
        span.status = attrs["frlm.status"]
    span.venue = _text(attrs.get("frlm.venue"))
    span.worker_id = _text(attrs.get("frlm.worker_id"))
    span.depth = _depth(attrs.get("frlm.depth"))
    span.metrics = {m: attrs[f"frlm.{m}"] for m in METRICS if _number(attrs.get(f"frlm.{m}"))}
    end_keys = set(attrs.get("frlm.end_attr_keys") or [])
    for key, value in attrs.items():
        if key.startswith(FRLM_ATTRS):
            name = key[len(FRLM_ATTRS) :]
            (span.end_attrs if name in end_keys else span.start_attrs)[name] = value
    span.start_payload = _text(attrs.get("frlm.start_payload"))
    span.end_payload = _text(attrs.get("frlm.end_payload"))
    span.start_payload_ref = _text(attrs.get("frlm.start_payload_ref"))
    span.end_payload_ref = _text(attrs.get("frlm.end_payload_ref"))
    if isinstance(attrs.get("frlm.links"), list):
        span.links = [str(link) for link in attrs["frlm.links"]]


def _foreign_fields(
    span: ImportedSpan, raw: dict[str, Any], attrs: dict[str, Any], parents: dict[str, str | None]
) -> None:
    """A span from another tool, placed on the taxonomy by where it sits and what it is."""
    model_call = "gen_ai.operation.name" in attrs
    if span.parent is None and not model_call:
        span.name = "Run.Init"
    elif model_call:
        grandparent = parents.get(span.parent) if span.parent else None
        span.name = (
            "Run.Decode" if span.parent is None or grandparent is None else "SubQuery.Execute"
        )
    else:
        span.name = "Repl.Exec"
    span.start_attrs = {"otel.name": raw["name"], **attrs}
    if attrs.get("gen_ai.request.model"):
        span.start_attrs["model"] = attrs["gen_ai.request.model"]
    for ours, theirs in (
        ("tokens_in", "gen_ai.usage.input_tokens"),
        ("tokens_out", "gen_ai.usage.output_tokens"),
    ):
        if _number(attrs.get(theirs)):
            span.metrics[ours] = attrs[theirs]


def _imported_event(event: Any, depth: int) -> ImportedEvent | None:
    if not isinstance(event, dict):
        raise InterchangeError(f"a span event must be an object, got {event!r}")
    attrs = attributes_dict(event.get("attributes", []))
    name = attrs.get("frlm.event_name", event.get("name"))
    if name not in NAMES:
        return None  # not a step FRLM knows (an exception record, a log line...)
    recorded = attrs.get("frlm.recorded_ts_ns")
    point = ImportedEvent(
        name=name,
        ts_ns=recorded
        if _number(recorded)
        else int_field(event.get("timeUnixNano"), "an event's timeUnixNano"),
        phase="progress" if attrs.get("frlm.phase") == "progress" else "instant",
        status=attrs["frlm.status"] if attrs.get("frlm.status") in STATUSES else "ok",
        venue=_text(attrs.get("frlm.venue")),
        worker_id=_text(attrs.get("frlm.worker_id")),
        depth=_depth(attrs.get("frlm.depth"), depth),
        metrics={m: attrs[f"frlm.{m}"] for m in METRICS if _number(attrs.get(f"frlm.{m}"))},
        attrs={k[len(FRLM_ATTRS) :]: v for k, v in attrs.items() if k.startswith(FRLM_ATTRS)},
        payload=_text(attrs.get("frlm.payload")),
        payload_ref=_text(attrs.get("frlm.payload_ref")),
        links=[str(link) for link in attrs.get("frlm.links") or []],
    )
    return point


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value != "" else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _depth(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
