"""JSON endpoints over the trace store, for the run page, the diff page and the venue pages
(the reads across several runs those pages need are in traces.selectors).

The trace app knows nothing of runs or owners (ARCHITECTURE.md §4): who may read a run's trace is
decided by an `access(user, run_id)` callable the URLconf passes to every view here."""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from typing import Any, TypedDict

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from frlm_web.vendor import accepts_gzip
from traces import live, store
from traces.blobs import blob_get
from traces.diff import TraceDiffError, run_diff

RunAccess = Callable[[Any, str], bool]
TEXT_CHARS = 100_000  # of one payload shown in a span's detail
TURN_TEXT_CHARS = 20_000  # of each code cell, output and reply in the turns list
EVENTS_GZIP_BYTES = 64_000  # an events answer longer than this goes gzipped
EVENTS_CACHE = "events-wire.json.gz"  # an ended run's whole trace, as run_events answers it

# What a span's payloads are, by span name: (what went in, what came out).
PAYLOAD_LABELS: dict[str, tuple[str, str]] = {
    "Run.Decode": ("prompt", "reply"),
    "Repl.Exec": ("code", "output"),
    "SubQuery.Submit": ("prompt", "reply"),
    "SubQuery.Execute": ("prompt", "reply"),
    "Run.Done": ("answer", "answer"),
}


def api_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """GET only, signed in (401 otherwise: a script asked, not a person to redirect)."""

    @require_GET
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            # Said of every API view, traces and worker names alike (a review).
            return JsonResponse(
                {
                    "error": "sign in first: GET /accounts/login/ for its csrftoken cookie, "
                    "POST username, password and csrfmiddlewaretoken to it, then send the "
                    "sessionid cookie it sets"
                },
                status=401,
            )
        return view(request, *args, **kwargs)

    return wrapped


def _not_found(run_id: str) -> JsonResponse:
    return JsonResponse({"error": f"no run {run_id!r} that you may see"}, status=404)


def _int(raw: str | None, default: int, low: int = 0, high: int = 2**62) -> int:
    try:
        return max(low, min(high, int(raw))) if raw not in (None, "") else default
    except ValueError:
        return default


def _text(ref: str | None, limit: int) -> dict[str, Any] | None:
    if not ref:
        return None
    text = blob_get(ref)
    if text is None:
        return {"ref": ref, "text": None, "chars": 0, "truncated": False}
    return {"ref": ref, "text": text[:limit], "chars": len(text), "truncated": len(text) > limit}


# --- one run ------------------------------------------------------------------------------
@api_view
def run_events(request: HttpRequest, run_id: str, *, access: RunAccess) -> HttpResponse:
    """The run's events after `after_seq`, in seq order, in the wire form of traces.live."""
    if not access(request.user, run_id):
        return _not_found(run_id)
    after = _int(request.GET.get("after_seq"), 0)
    response = HttpResponse(content_type="application/json")
    patch_vary_headers(response, ["Accept-Encoding"])
    if after == 0 and accepts_gzip(request):
        response.content = _whole_trace_gzipped(run_id)
        response["Content-Encoding"] = "gzip"
        return response
    body = _events_body(run_id, after)
    if len(body) > EVENTS_GZIP_BYTES and accepts_gzip(request):
        body = _gzip(body)
        response["Content-Encoding"] = "gzip"
    response.content = body
    return response


def _events_body(run_id: str, after: int) -> bytes:
    """The answer's JSON. The rows come as JSON text from the store
    (live.stored_wire_json): only the frame around them is encoded here."""
    wire = live.stored_wire_json(run_id, after)
    head = json.dumps({"run_id": run_id, "fields": live.WIRE_FIELDS})[:-1]
    last_seq = wire["last_seq"] if wire["count"] else after
    return f'{head}, "events": {wire["events"]}, "last_seq": {last_seq}}}'.encode()


def _gzip(body: bytes) -> bytes:
    # Level 1: a fifth of the bytes (20,000 events: 2.9 MB -> 0.6 MB) for ~30 ms.
    return gzip.compress(body, compresslevel=1, mtime=0)


def _whole_trace_gzipped(run_id: str) -> bytes:
    """A run page's first ask, gzipped. An ended run's answer is kept beside its segments
    (store.read_beside: stale once a later event adds a segment): 6,000 events took the
    store ~0.12 s and gzip 0.03 s per page load, against a file read now."""
    key, cached = store.read_beside(run_id, EVENTS_CACHE)
    if cached is not None:
        return cached
    body = _gzip(_events_body(run_id, 0))
    if key and store.run_ended(run_id):
        store.write_beside(run_id, EVENTS_CACHE, key, body)
    return body


class SpanDetail(TypedDict):
    span_id: str
    name: str
    parent_id: str | None
    status: str
    venue: str | None
    worker_id: str | None
    depth: int
    start_ms: float | None
    end_ms: float | None
    ms: float | None
    tokens_in: int | None
    tokens_out: int | None
    cost: float | None
    attrs: dict[str, Any]
    links: list[str]
    labels: tuple[str, str]
    input: dict[str, Any] | None
    output: dict[str, Any] | None
    events: list[dict[str, Any]]
    subquery: SubQueryRecord | None


class SubQueryRecord(TypedDict):
    """Everything the trace holds on one sub-query, whichever of its spans was clicked: the
    prompt, the reply, the routing decision, each attempt, the verdicts and the receipts."""

    submit_span: str
    prompt: dict[str, Any] | None
    reply: dict[str, Any] | None
    reply_span: str | None
    routing: dict[str, Any] | None
    attempts: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    receipts: list[dict[str, Any]]
    budget: list[dict[str, Any]]


@api_view
def span_detail(
    request: HttpRequest, run_id: str, span_id: str, *, access: RunAccess
) -> HttpResponse:
    """One span: its metrics and attributes, the texts behind its payload refs (from the
    blob store), its instants, and its causal links."""
    if not access(request.user, run_id):
        return _not_found(run_id)
    # A query on one span, not read_events: a big trace is 50,000 events and this is a click.
    rows = store._query(
        run_id,
        """SELECT * EXCLUDE (run_id, ts), epoch_ns(ts) AS ts FROM ev
           WHERE span_id = ? OR (parent_id = ? AND phase = 'instant') ORDER BY seq""",
        [span_id, span_id],
    )
    own = [r for r in rows if r["span_id"] == span_id]
    if not own:
        return JsonResponse({"error": f"run {run_id} has no span {span_id!r}"}, status=404)
    detail = _span_detail(span_id, own)
    detail["events"] = _span_instants(span_id, rows)
    detail["subquery"] = _subquery(run_id, detail)
    return JsonResponse(detail)


def _span_detail(span_id: str, own: list[dict[str, Any]]) -> SpanDetail:
    """A span as its own events tell it (start and end, or one instant); "events" is left
    empty for the instants under it."""
    first = own[0]
    detail: SpanDetail = {
        "span_id": span_id,
        "name": first["name"],
        "parent_id": first["parent_id"],
        "status": "open",
        "venue": None,
        "worker_id": None,
        "depth": first["depth"] or 0,
        "start_ms": None,
        "end_ms": None,
        "ms": None,
        "tokens_in": None,
        "tokens_out": None,
        "cost": None,
        "attrs": {},
        "links": [],
        "labels": PAYLOAD_LABELS.get(first["name"], ("input", "output")),
        "input": None,
        "output": None,
        "events": [],
    }
    for row in own:
        attrs = json.loads(row["attrs"]) if row["attrs"] else {}
        detail["attrs"].update({k: v for k, v in attrs.items() if not k.startswith("_")})
        detail["venue"] = row["venue"] or detail["venue"]
        detail["worker_id"] = row["worker_id"] or detail["worker_id"]
        detail["links"] += [link for link in row["links"] or [] if link not in detail["links"]]
        if row["phase"] in ("start", "instant"):
            detail["start_ms"] = row["ts"] / 1e6
            detail["input"] = _text(row["payload_ref"], TEXT_CHARS)
        if row["phase"] in ("end", "instant"):
            detail["end_ms"] = row["ts"] / 1e6
            detail["status"] = row["status"]
            for key in ("ms", "tokens_in", "tokens_out", "cost"):
                if row[key] is not None:
                    detail[key] = row[key]  # type: ignore[literal-required]
            detail["output"] = _text(row["payload_ref"], TEXT_CHARS)
    if first["phase"] == "instant":
        detail["input"] = None
    return detail


def _subquery(run_id: str, detail: SpanDetail) -> SubQueryRecord | None:
    """The sub-query a Submit or Execute span belongs to, told by its Submit span: the
    events under it, and the verdicts that link to it (ARCHITECTURE.md §6)."""
    if detail["name"] == "SubQuery.Submit":
        submit = detail["span_id"]
    elif detail["name"] == "SubQuery.Execute" and detail["parent_id"]:
        submit = detail["parent_id"]
    else:
        return None
    rows = store._query(
        run_id,
        """SELECT * EXCLUDE (run_id, ts), epoch_ns(ts) AS ts FROM ev
           WHERE span_id = ? OR parent_id = ? OR list_contains(links, ?) ORDER BY seq""",
        [submit, submit, submit],
    )
    record: SubQueryRecord = {
        "submit_span": submit,
        "prompt": None,
        "reply": None,
        "reply_span": None,
        "routing": None,
        "attempts": [],
        "verdicts": [],
        "receipts": [],
        "budget": [],
    }
    executions: dict[str, dict[str, Any]] = {}
    for row in rows:
        attrs = json.loads(row["attrs"]) if row["attrs"] else {}
        attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        name, phase = row["name"], row["phase"]
        if row["span_id"] == submit:
            _submit_row(record, row, attrs)
        elif name == "SubQuery.Execute":
            _execute_row(record, executions, row)
        elif phase == "instant":
            entry = {
                "span_id": row["span_id"],
                "name": name,
                "status": row["status"],
                "t_ms": row["ts"] / 1e6,
                "worker_id": row["worker_id"],
                "venue": row["venue"],
                "links": list(row["links"] or []),
                "attrs": attrs,
            }
            if name.startswith("Verify."):
                record["verdicts"].append(entry)
            elif name == "Receipt.Emit":
                record["receipts"].append(entry)
            elif name.startswith("Budget."):
                record["budget"].append(entry)
    record["attempts"] = list(executions.values())
    return record


def _submit_row(record: SubQueryRecord, row: dict[str, Any], attrs: dict[str, Any]) -> None:
    if row["phase"] == "start":
        record["prompt"] = _text(row["payload_ref"], TEXT_CHARS)
        routing = attrs.get("routing")
        if routing is not None or attrs.get("route"):
            record["routing"] = {
                "route": attrs.get("route"),
                "venue": row["venue"],
                "worker_id": row["worker_id"],
                "decision": routing,
            }
    elif row["phase"] == "end" and row["payload_ref"]:
        record["reply"] = _text(row["payload_ref"], TEXT_CHARS)
        record["reply_span"] = row["span_id"]


def _execute_row(
    record: SubQueryRecord, executions: dict[str, dict[str, Any]], row: dict[str, Any]
) -> None:
    """One attempt on a worker; the last ok one's reply stands when the Submit span's end
    carries none."""
    attempt = executions.setdefault(
        row["span_id"],
        {"span_id": row["span_id"], "status": "open", "ms": None, "worker_id": None, "venue": None},
    )
    attempt["worker_id"] = row["worker_id"] or attempt["worker_id"]
    attempt["venue"] = row["venue"] or attempt["venue"]
    if row["phase"] == "end":
        attempt.update(
            status=row["status"],
            ms=row["ms"],
            tokens_in=row["tokens_in"],
            tokens_out=row["tokens_out"],
            cost=row["cost"],
        )
        if row["status"] == "ok" and row["payload_ref"] and record["reply_span"] is None:
            record["reply"] = _text(row["payload_ref"], TEXT_CHARS)
            record["reply_span"] = row["span_id"]


def _span_instants(span_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instants recorded under the span (rows of other spans), in seq order."""
    events: list[dict[str, Any]] = []
    for row in rows:
        if row["span_id"] != span_id:
            attrs = json.loads(row["attrs"]) if row["attrs"] else {}
            events.append(
                {
                    "span_id": row["span_id"],
                    "name": row["name"],
                    "status": row["status"],
                    "t_ms": row["ts"] / 1e6,
                    "venue": row["venue"],
                    "worker_id": row["worker_id"],
                    "attrs": {k: v for k, v in attrs.items() if not k.startswith("_")},
                }
            )
    return events


@api_view
def run_turns(request: HttpRequest, run_id: str, *, access: RunAccess) -> HttpResponse:
    """Each root-model turn (and each child RLM's): the reply, and every REPL cell it ran
    with its code and output."""
    if not access(request.user, run_id):
        return _not_found(run_id)
    rows = store._query(
        run_id,
        """SELECT span_id, parent_id, name, phase, epoch_ns(ts) AS ts, status, depth,
                  payload_ref, attrs, tokens_in, tokens_out, cost, ms
           FROM ev WHERE name IN ('Run.Decode', 'Repl.Exec') ORDER BY seq""",
    )
    return JsonResponse({"run_id": run_id, "turns": _turns(rows)})


def _turns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run.Decode and Repl.Exec events in seq order, folded into turns: each with its
    decode (the reply) and its cells (code and output)."""
    turns: dict[tuple[str | None, int], dict[str, Any]] = {}
    cells: dict[str, dict[str, Any]] = {}

    def turn_of(parent: str | None, number: int, depth: int, ts: int) -> dict[str, Any]:
        key = (parent, number)
        if key not in turns:
            turns[key] = {
                "parent_id": parent,
                "turn": number,
                "depth": depth,
                "t_ms": ts / 1e6,
                "decode": None,
                "cells": [],
            }
        return turns[key]

    for row in rows:
        attrs = json.loads(row["attrs"]) if row["attrs"] else {}
        if row["name"] == "Run.Decode":
            if row["phase"] == "start":
                turn = turn_of(row["parent_id"], attrs.get("turn") or 0, row["depth"], row["ts"])
                turn["decode"] = {"span_id": row["span_id"], "status": "open", "reply": None}
                cells[row["span_id"]] = turn["decode"]
            elif row["span_id"] in cells:
                decode = cells[row["span_id"]]
                decode.update(
                    status=row["status"],
                    ms=row["ms"],
                    tokens_in=row["tokens_in"],
                    tokens_out=row["tokens_out"],
                    cost=row["cost"],
                    reply=_text(row["payload_ref"], TURN_TEXT_CHARS),
                )
        elif row["phase"] == "start":
            turn = turn_of(row["parent_id"], attrs.get("turn") or 0, row["depth"], row["ts"])
            cell = {
                "span_id": row["span_id"],
                "cell": attrs.get("cell"),
                "status": "open",
                "code": _text(row["payload_ref"], TURN_TEXT_CHARS),
                "output": None,
            }
            turn["cells"].append(cell)
            cells[row["span_id"]] = cell
        elif row["span_id"] in cells:
            cells[row["span_id"]].update(
                status=row["status"],
                ms=row["ms"],
                error=attrs.get("error"),
                output=_text(row["payload_ref"], TURN_TEXT_CHARS),
            )
    return list(turns.values())


@api_view
def run_aggregates(request: HttpRequest, run_id: str, *, access: RunAccess) -> HttpResponse:
    """The run's summary, per-worker figures and events binned over time."""
    if not access(request.user, run_id):
        return _not_found(run_id)
    by = request.GET.get("by", "name")
    if by not in ("name", "worker"):
        return JsonResponse({"error": "by must be 'name' or 'worker'"}, status=400)
    bin_ms = _int(request.GET.get("bin_ms"), 250, low=1, high=3_600_000)
    return JsonResponse(
        {
            "summary": store.run_summary(run_id),
            "workers": store.worker_figures(run_id),
            "bins": store.binned(run_id, bin_ms=bin_ms, by=by),
            "bin_ms": bin_ms,
            "by": by,
        }
    )


@api_view
def diff_json(request: HttpRequest, *, access: RunAccess) -> HttpResponse:
    """traces.diff.run_diff of runs `a` and `b`."""
    a, b = request.GET.get("a", ""), request.GET.get("b", "")
    if not a or not b:
        need = "give the two runs to compare: ?a=RUN_ID&b=RUN_ID"
        return JsonResponse({"error": need}, status=400)
    for run_id in (a, b):
        if not access(request.user, run_id):
            return _not_found(run_id)
    try:
        return JsonResponse(run_diff(a, b))
    except TraceDiffError as exc:
        return JsonResponse({"error": str(exc)}, status=409)
