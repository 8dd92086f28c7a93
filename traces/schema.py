"""The trace event schema (ARCHITECTURE.md §6): one row per event, shared by every process."""

from __future__ import annotations

import functools
import re
from typing import Any, TypedDict

# Why a sub-query was cancelled without counting as failed, as its SubQuery.Submit span's
# end says (attrs "cut"): its batch's quorum was met without it, or the run was cancelled.
CUT_QUORUM = "quorum"
CUT_CANCEL = "cancel"

NAMES = frozenset(
    {
        "Run.Init",
        "Run.Decode",
        "Run.Done",
        "Repl.Exec",
        "Env.SelectFragments",
        "Env.LoadFragment",
        "Context.Fold",
        "SubQuery.Submit",
        "SubQuery.Execute",
        "SubQuery.Return",
        "SubQuery.Timeout",
        "SubQuery.Cancel",
        "SubQuery.Retry",
        "SubQuery.Hedge",
        "Verify.Redundant",
        "Verify.Objective",
        "Verify.Attest",
        "Verify.Probe",
        "Verify.Flag",
        "Verify.Gate",
        "Memory.CacheHit",
        "Memory.CacheMiss",
        "Weights.Fetch",
        "GPU.Dispatch",
        "Budget.Reserve",
        "Budget.Settle",
        "Budget.Alert",
        "Receipt.Emit",
        "Worker.Register",
        "Worker.Heartbeat",
        "Worker.Lost",
        "Circuit.Open",
        "Circuit.Close",
    }
)
# What a run's directory in the store may be named after (no path separators).
RUN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
PHASES = frozenset({"start", "end", "instant", "progress"})
# `abandoned`: a span whose process died before ending it, closed for it by whoever noticed
# (runs/lease.py for a conductor, runs/engine/fanout/liveness.py and the gateway for a worker).
STATUSES = frozenset({"ok", "error", "timeout", "cancelled", "rejected", "abandoned"})


class Event(TypedDict, total=False):
    run_id: str
    seq: int
    event_id: str
    span_id: str
    parent_id: str | None
    links: list[str]
    name: str
    phase: str
    ts: int  # nanoseconds since the epoch, at the emitter
    status: str
    venue: str | None
    worker_id: str | None
    depth: int
    ms: float | None
    bytes: int | None
    tokens_in: int | None
    tokens_out: int | None
    cost: float | None
    payload_ref: str | None
    attrs: dict[str, Any]


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa  # a second to import on a busy machine: only the store's users pay

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("seq", pa.int64()),
            ("event_id", pa.string()),
            ("span_id", pa.string()),
            ("parent_id", pa.string()),
            ("links", pa.list_(pa.string())),
            ("name", pa.string()),
            ("phase", pa.string()),
            ("ts", pa.timestamp("ns")),  # UTC
            ("status", pa.string()),
            ("venue", pa.string()),
            ("worker_id", pa.string()),
            ("depth", pa.int32()),
            ("ms", pa.float64()),
            ("bytes", pa.int64()),
            ("tokens_in", pa.int64()),
            ("tokens_out", pa.int64()),
            ("cost", pa.float64()),
            ("payload_ref", pa.string()),
            ("attrs", pa.string()),  # JSON text: DuckDB reads it with json functions
        ]
    )


def __getattr__(name: str) -> Any:
    """`ARROW_SCHEMA`, the Parquet segments' columns, made when first asked for: the
    emitter and the command line import this module and never need it."""
    if name == "ARROW_SCHEMA":
        return _arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REQUIRED_TEXT = ("run_id", "event_id", "span_id", "name", "phase", "status")
_FLOATS = ("ms", "cost")
_COUNTS = ("bytes", "tokens_in", "tokens_out")  # int64 columns: whole numbers only
_OPTIONAL_TEXT = ("parent_id", "venue", "worker_id", "payload_ref")
_REF_CHARS = frozenset("0123456789abcdef")
# The store's column types: a value past them could not be written, and the recorder would
# stop at that event on every restart instead of dead-lettering it.
INT64_MAX = 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _is_int(value: Any, low: int = -INT64_MAX - 1, high: int = INT64_MAX) -> bool:
    return type(value) is int and low <= value <= high


def _one_of(value: Any, values: frozenset[str]) -> bool:
    return type(value) is str and value in values  # a list would not even hash


def _is_ref(value: Any) -> bool:
    return type(value) is str and len(value) == 64 and _REF_CHARS.issuperset(value)


def _fits(event: dict) -> bool:
    """The common case, checked cheaply: the recorder checks every event it stores."""
    get = event.get
    for field in _REQUIRED_TEXT:
        value = get(field)
        if type(value) is not str or not value:
            return False
    if not RUN_ID.fullmatch(get("run_id")):
        return False
    if not (_is_int(get("seq"), 1) and _is_int(get("ts"), 1)):
        return False
    if not _is_int(get("depth", 0), INT32_MIN, INT32_MAX):
        return False
    if get("name") not in NAMES or get("phase") not in PHASES or get("status") not in STATUSES:
        return False
    for field in _FLOATS:
        value = get(field)
        if value is not None and type(value) not in (int, float):
            return False
    for field in _COUNTS:
        value = get(field)
        if value is not None and not _is_int(value):
            return False
    for field in _OPTIONAL_TEXT:
        value = get(field)
        if value is not None and type(value) is not str:
            return False
    links = get("links", [])
    if type(links) is not list or any(type(x) is not str for x in links):
        return False
    attrs = get("attrs", {})
    if type(attrs) is not dict:
        return False
    payload = attrs.get("_payload")
    return payload is None or (type(payload) is str and _is_ref(get("payload_ref")))


def problems(event: Any) -> list[str]:
    """What is wrong with an event, as sentences; empty when it fits the schema."""
    if isinstance(event, dict) and _fits(event):
        return []
    if not isinstance(event, dict):
        return [f"an event must be a JSON object, got {type(event).__name__}"]
    found: list[str] = []
    for field in _REQUIRED_TEXT:
        if not isinstance(event.get(field), str) or not event.get(field):
            found.append(f"{field} must be a non-empty string")
    run_id = event.get("run_id")
    if isinstance(run_id, str) and run_id and not RUN_ID.fullmatch(run_id):
        found.append("run_id must be 1 to 64 letters, digits or _.:- (it names a directory)")
    if not _one_of(event.get("name"), NAMES):
        found.append(f"name {event.get('name')!r} is not in the taxonomy")
    if not _one_of(event.get("phase"), PHASES):
        found.append(f"phase {event.get('phase')!r} is not one of {sorted(PHASES)}")
    if not _one_of(event.get("status"), STATUSES):
        found.append(f"status {event.get('status')!r} is not one of {sorted(STATUSES)}")
    if not _is_int(event.get("seq"), 1):
        found.append("seq must be a positive 64-bit integer")
    if not _is_int(event.get("ts"), 1):
        found.append("ts must be nanoseconds since the epoch (a positive 64-bit integer)")
    if not _is_int(event.get("depth", 0), INT32_MIN, INT32_MAX):
        found.append("depth must be an integer (32-bit)")
    for field in _FLOATS:
        value = event.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            found.append(f"{field} must be a number")
    for field in _COUNTS:
        value = event.get(field)
        if value is not None and not _is_int(value):
            found.append(f"{field} must be a whole number (64-bit)")
    for field in _OPTIONAL_TEXT:
        if event.get(field) is not None and not isinstance(event.get(field), str):
            found.append(f"{field} must be a string or null")
    links = event.get("links", [])
    if not isinstance(links, list) or not all(isinstance(x, str) for x in links):
        found.append("links must be a list of span ids")
    attrs = event.get("attrs", {})
    if not isinstance(attrs, dict):
        found.append("attrs must be a JSON object")
    elif attrs.get("_payload") is not None:
        if not isinstance(attrs["_payload"], str):
            found.append("attrs._payload (the payload text) must be a string")
        elif not _is_ref(event.get("payload_ref")):
            found.append("an event with a payload needs payload_ref: the sha256 of its text")
    return found
