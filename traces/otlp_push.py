"""Pushing an exported run to an OpenTelemetry collector over OTLP/HTTP with protobuf
bodies, the encoding every collector accepts (Phoenix, Langfuse, the OpenTelemetry
Collector). The document is the OTLP/JSON of `traces/otlp.py`, encoded with the official
schema (`opentelemetry-proto`)."""

from __future__ import annotations

import base64
import copy
import json
import urllib.parse
from typing import Any

import httpx
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from traces.otlp import ExportTraceServiceRequest as OtlpDocument

TRACES_PATH = "/v1/traces"
HEADERS_ENV = "OTEL_EXPORTER_OTLP_HEADERS"  # the OpenTelemetry SDKs' own variable


class PushError(Exception):
    """The collector could not be reached or refused the trace; the message says which."""


def traces_url(endpoint: str) -> str:
    """The endpoint as given when it names the traces path, else with /v1/traces added
    (as OpenTelemetry SDKs treat OTEL_EXPORTER_OTLP_ENDPOINT)."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PushError(
            f"--otlp-endpoint must be an http(s) URL such as http://localhost:4318, got "
            f"{endpoint!r}"
        )
    if parts.path.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + TRACES_PATH))


def parse_headers(items: list[str], environ_value: str | None) -> dict[str, str]:
    """Headers from `KEY=VALUE` options and from OTEL_EXPORTER_OTLP_HEADERS
    (`k1=v1,k2=v2`, values URL-encoded); the options win."""
    found: dict[str, str] = {}
    pairs = [p for p in (environ_value or "").split(",") if p.strip()]
    for source, entries in ((HEADERS_ENV, pairs), ("--otlp-header", items)):
        for entry in entries:
            key, eq, value = entry.partition("=")
            if not eq or not key.strip():
                raise PushError(f"{source}: expected KEY=VALUE, got {entry!r}")
            found[key.strip()] = urllib.parse.unquote(value.strip())
    return found


def to_protobuf(document: OtlpDocument) -> bytes:
    """The OTLP/JSON document as a serialised ExportTraceServiceRequest. OTLP/JSON spells
    ids in hex where protobuf's JSON mapping of bytes reads base64."""
    doc = copy.deepcopy(document)
    for resource_spans in doc["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                _ids_as_base64(span, ("traceId", "spanId", "parentSpanId"))
                for link in span.get("links") or []:
                    _ids_as_base64(link, ("traceId", "spanId"))
    message = json_format.Parse(json.dumps(doc), ExportTraceServiceRequest())
    return message.SerializeToString()


def _ids_as_base64(item: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        if item.get(key):
            item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()


def push(
    document: OtlpDocument,
    endpoint: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> int:
    """POST the trace to the collector; returns how many spans it rejected (its
    partial_success), PushError when it cannot be reached or answers with an error."""
    url = traces_url(endpoint)
    body = to_protobuf(document)
    sent = {**(headers or {}), "Content-Type": "application/x-protobuf"}
    try:
        response = httpx.post(url, content=body, headers=sent, timeout=timeout)
    except httpx.HTTPError as exc:
        raise PushError(f"cannot reach the collector at {url}: {exc}") from exc
    if response.status_code >= 300:
        raise PushError(
            f"the collector at {url} answered {response.status_code}: "
            f"{response.text[:300].strip() or response.reason_phrase}"
        )
    return _rejected(response)


def _rejected(response: httpx.Response) -> int:
    if not response.content:
        return 0
    reply = ExportTraceServiceResponse()
    try:
        if response.headers.get("content-type", "").startswith("application/json"):
            json_format.Parse(response.text, reply, ignore_unknown_fields=True)
        else:
            reply.ParseFromString(response.content)
    except (json_format.ParseError, DecodeError, ValueError):
        return 0  # a collector that answers 2xx with a body of its own accepted the trace
    return int(reply.partial_success.rejected_spans)
