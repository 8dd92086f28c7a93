"""Import a trace made elsewhere (an OTLP/JSON export, or an rlms trajectory log) as a new
run: the run row says what the trace says, and its events go through the recorder like
those of any run, so every view shows an imported run as it shows its own."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from django.db import transaction

from frlm_web import jsontext
from frlm_web.money import ZERO, money
from frlm_web.redis_client import get_redis
from runs.models import Run, new_run_id
from traces import store
from traces.emitter import Emitter
from traces.interchange import InterchangeError, ParsedTrace, json_lines, to_events
from traces.otlp import model_name
from traces.otlp_import import from_otlp
from traces.recorder import HEARTBEAT_KEY
from traces.rlms_log import from_rlms_log, is_rlms_record
from traces.schema import CUT_CANCEL, CUT_QUORUM, Event

EXPECTED = (
    "expected an OTLP/JSON trace (a JSON object with resourceSpans) or an rlms trajectory "
    "log (JSON lines of type metadata and iteration)"
)
MODEL_SPANS = ("Run.Decode", "SubQuery.Execute")


class ImportSummary(TypedDict):
    run_id: str
    status: str
    question: str
    answer: str
    error: str | None
    format: str
    spans: int
    events: int
    stored: bool
    source_run_id: str | None


@dataclass
class ImportOutcome:
    run: Run
    trace: ParsedTrace
    events: int
    stored: bool

    def summary(self) -> ImportSummary:
        return {
            "run_id": self.run.id,
            "status": self.run.status,
            "question": self.run.question,
            "answer": self.run.answer,
            "error": self.run.error or None,
            "format": self.trace.source,
            "spans": len(self.trace.spans),
            "events": self.events,
            "stored": self.stored,
            "source_run_id": self.trace.notes.get("frlm.run_id"),
        }


# --- reading ------------------------------------------------------------------------------


def trace_file_parse(path: Path) -> ParsedTrace:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InterchangeError(f"cannot read the file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InterchangeError(f"the file is not UTF-8 text; {EXPECTED}") from None
    return trace_parse(text)


def trace_parse(text: str) -> ParsedTrace:
    """Tell the format from the text and parse all of it; InterchangeError says why not."""
    stripped = text.strip()
    if not stripped:
        raise InterchangeError(f"the file is empty; {EXPECTED}")
    first_line = stripped.split("\n", 1)[0]
    if "\n" in stripped and _is_json(first_line):
        return _from_lines(json_lines(text))
    try:
        document = json.loads(stripped)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string") or exc.pos >= len(stripped) - 1:
            raise InterchangeError(
                f"the JSON ends early (line {exc.lineno}, column {exc.colno}): the file "
                "looks truncated"
            ) from None
        raise InterchangeError(f"not JSON ({exc}); {EXPECTED}") from None
    if isinstance(document, dict) and "resourceSpans" in document:
        return from_otlp(document)
    if is_rlms_record(document):
        return from_rlms_log([(1, document)])
    raise InterchangeError(f"{EXPECTED}; got {_describe(document)}")


def _from_lines(records: list[tuple[int, Any]]) -> ParsedTrace:
    objects = [record for _, record in records]
    # The OpenTelemetry Collector's file exporter writes one request per line.
    if all(isinstance(o, dict) and "resourceSpans" in o for o in objects):
        return from_otlp(
            {"resourceSpans": [rs for o in objects for rs in o["resourceSpans"] or []]}
        )
    if not any(is_rlms_record(o) for o in objects):
        raise InterchangeError(f"{EXPECTED}; got JSON lines of neither kind")
    return from_rlms_log(records)


def _is_json(text: str) -> bool:
    try:
        jsontext.loads(text)
    except ValueError:
        return False
    return True


def _describe(document: Any) -> str:
    if isinstance(document, dict):
        return f"a JSON object with keys {sorted(document)[:6]}"
    return f"a JSON {type(document).__name__}"


# --- the run ------------------------------------------------------------------------------


# What the parsers raise for a file beyond the errors they name: a field of the wrong type,
# a number out of range (Infinity, 1e300 seconds, the year 1), JSON nested past the parser's
# recursion. Nineteen such files of a review each ended the command with a traceback; they
# are refused in one line, and nothing is written.
UNREADABLE = (
    ValueError,
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    OverflowError,
    RecursionError,
)


def run_import(path: Path, *, wait_s: float = 30.0) -> ImportOutcome:
    """1. parse and check the whole file (nothing is written before it all fits), 2. save
    the run as the trace ends, 3. send every event in one atomic append, 4. wait for the
    recorder to store them; if it does not, the run fails with that reason."""
    run_id = new_run_id()
    try:
        trace = trace_file_parse(path)
        events = to_events(trace, run_id)
        fields = run_fields(events, path)
    except InterchangeError:
        raise
    except UNREADABLE as exc:
        raise InterchangeError(
            f"the file is not a trace FRLM can read ({type(exc).__name__}: "
            f"{str(exc)[:200]}); {EXPECTED}"
        ) from None
    client = get_redis()
    with transaction.atomic():
        run = Run.objects.create(id=run_id, **fields)
        emitter = Emitter(client, run_id, venue=None)
        emitter.enabled = True  # an import exists to write its events
        # Last in the transaction: if Redis refuses them, the run row goes too.
        emitter.send(events)
    stored = _wait_stored(run_id, len(events), wait_s)
    if not stored:
        reason = _not_stored_reason(len(events), wait_s, bool(client.exists(HEARTBEAT_KEY)))
        Run.objects.filter(id=run_id).update(status=Run.Status.FAILED, error=reason)
        run.refresh_from_db()
    return ImportOutcome(run, trace, len(events), stored)


def _wait_stored(run_id: str, count: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        if store.event_count(run_id) >= count:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _not_stored_reason(count: int, wait_s: float, recorder_alive: bool) -> str:
    heartbeat = "" if recorder_alive else " (no recorder heartbeat in this Redis)"
    return (
        f"the recorder did not store the {count} imported events within {wait_s:g} s"
        f"{heartbeat}: is `python manage.py frlm_recorder` running against FRLM_REDIS_URL? "
        "The events wait on the stream and are stored when it runs."
    )


def run_fields(events: list[Event], path: Path) -> dict[str, Any]:
    """The run row as the trace tells it: question and models from Run.Init, answer,
    status and totals from Run.Done (counted from the spans where it says nothing)."""
    root_start, root_end = _root(events)
    done = next((e for e in reversed(events) if e["name"] == "Run.Done"), None)
    init_attrs = root_start["attrs"] if root_start and root_start["name"] == "Run.Init" else {}
    # Its totals are the event's own fields, the rest its attrs: counted from the spans
    # instead, a hedge's loser and a cut-off copy were added to what the run spent.
    said = {**_own_totals(done), **done["attrs"]} if done else {}
    status, answer, error = _outcome(done, root_end)
    started = root_start["ts"] if root_start else events[0]["ts"]
    finished = root_end["ts"] if root_end else (done["ts"] if done else None)
    return {
        "question": _question(init_attrs, path),
        "context_source": Run.Source.IMPORTED,
        "context_path": str(path.resolve())[:1024],
        "policy": init_attrs.get("policy") if isinstance(init_attrs.get("policy"), dict) else {},
        "root_model": _imported_model(init_attrs.get("root_model") or _first(events, "Run.Decode")),
        "worker_model": _imported_model(
            init_attrs.get("worker_model") or _first(events, "SubQuery.Execute")
        ),
        "venues": sorted(
            {e["venue"] for e in events if e["name"] == "SubQuery.Execute" and e.get("venue")}
        ),
        "status": status,
        "answer": answer,
        "error": error,
        "correct": said.get("correct") if isinstance(said.get("correct"), bool) else None,
        "started": _when(started),
        "finished": _when(finished) if finished else None,
        "wall_ms": _number(said.get("wall_ms"))
        or ((finished - started) / 1e6 if finished else None),
        **_totals(events, said),
    }


def _root(events: list[Event]) -> tuple[Event | None, Event | None]:
    starts = [e for e in events if e["phase"] == "start" and not e.get("parent_id")]
    root = next((e for e in starts if e["name"] == "Run.Init"), starts[0] if starts else None)
    if root is None:
        return None, None
    end = next((e for e in events if e["phase"] == "end" and e["span_id"] == root["span_id"]), None)
    return root, end


def _outcome(done: Event | None, root_end: Event | None) -> tuple[str, str, str]:
    ending = done or root_end
    if ending is None:
        return Run.Status.FAILED, "", "the imported trace never ends: its root span is open"
    attrs = ending["attrs"]
    text = attrs.get("_payload")
    if ending["status"] == "ok":
        return (
            Run.Status.SUCCEEDED,
            str(text if text is not None else attrs.get("answer") or ""),
            "",
        )
    status = Run.Status.CANCELLED if ending["status"] == "cancelled" else Run.Status.FAILED
    error = attrs.get("error") or text or f"the trace ended with status {ending['status']}"
    return status, "", str(error)


def _question(init_attrs: dict[str, Any], path: Path) -> str:
    question = init_attrs.get("question")
    return question if isinstance(question, str) and question else f"(imported from {path.name})"


def _first(events: list[Event], name: str) -> str | None:
    for event in events:
        if event["name"] == name and isinstance(event["attrs"].get("model"), str):
            return event["attrs"]["model"]
    return None


def _imported_model(label: Any) -> dict[str, Any]:
    name = model_name(label)[0] or "unknown"
    return {"kind": "imported", "model": name, "base_url": "", "sim": {}}


def _totals(events: list[Event], said: dict[str, Any]) -> dict[str, Any]:
    ends = [e for e in events if e["phase"] == "end"]
    submits = [e for e in ends if e["name"] == "SubQuery.Submit"]
    model_ends = [e for e in ends if e["name"] in MODEL_SPANS]
    counted = {
        "turns": sum(
            1
            for e in events
            if e["name"] == "Run.Decode" and e["phase"] == "start" and not e.get("depth")
        ),
        "subqueries": len(submits),
        "subqueries_failed": sum(1 for e in submits if e["status"] != "ok" and not _cut(e)),
        "subqueries_cut": sum(1 for e in submits if _cut(e) == CUT_QUORUM),
        "subqueries_cancelled": sum(1 for e in submits if _cut(e) == CUT_CANCEL),
        "tokens_in": sum(e.get("tokens_in") or 0 for e in model_ends),
        "tokens_out": sum(e.get("tokens_out") or 0 for e in model_ends),
        "cost": sum((money(e.get("cost") or 0) for e in model_ends), ZERO),
    }
    for key in counted:
        value = _number(said.get(key))
        if value is None:
            continue
        if key != "cost":
            counted[key] = type(counted[key])(value)
        elif math.isfinite(value) and value >= 0:  # else the spans' own sum stands
            counted[key] = money(value)  # by its shortest spelling: 0.1 is 0.1
    return counted


def _own_totals(done: Event) -> dict[str, Any]:
    return {key: done.get(key) for key in ("tokens_in", "tokens_out", "cost")}


def _cut(submit_end: Event) -> str | None:
    """Why it was cancelled without counting as failed, as the Submit span's end says in its
    attrs: its batch's quorum, or the run's cancel (runs/engine/fanout/attempts.py)."""
    attrs = submit_end.get("attrs")
    cut = attrs.get("cut") if isinstance(attrs, dict) else None
    return cut if cut in (CUT_QUORUM, CUT_CANCEL) else None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def _when(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)
