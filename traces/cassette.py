"""Cassettes: every model reply of a run, by a hash of its request, read back from the
run's own trace (a model span's end event carries `request_hash`; the reply is its payload
in the blob store). Replaying a run answers its model calls from here, with no model."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from traces import blobs, store

MODEL_SPANS = ("Run.Decode", "SubQuery.Execute")


def request_hash(model: str, messages: list[dict[str, Any]]) -> str:
    canonical = json.dumps([model, messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Recording:
    text: str
    tokens_in: int
    tokens_out: int
    cost: float | None
    ms: float


def recordings_of(
    events: Iterable[dict[str, Any]], text: Callable[[str], str | None] = blobs.blob_get
) -> dict[str, Recording]:
    """A cassette from a run's events (request hash -> what the model answered); `text`
    reads a payload ref."""
    found: dict[str, Recording] = {}
    for event in events:
        if event["name"] not in MODEL_SPANS or event["phase"] != "end" or event["status"] != "ok":
            continue
        key = event["attrs"].get("request_hash")
        if not key or key in found or not event["payload_ref"]:
            continue
        reply = text(event["payload_ref"])
        if reply is not None:
            found[key] = Recording(
                reply,
                event["tokens_in"] or 0,
                event["tokens_out"] or 0,
                event["cost"],
                event["ms"] or 0.0,
            )
    return found


def recordings(run_id: str) -> dict[str, Recording]:
    """The run's cassette: request hash -> what the model answered."""
    return recordings_of(store.read_events(run_id))


_KEPT = 8  # cassettes a process keeps: a finished run's trace does not change
_cassettes: OrderedDict[str, dict[str, Recording]] = OrderedDict()
_lock = threading.Lock()


def cassette(run_id: str) -> dict[str, Recording]:
    """The run's cassette, read once per process."""
    with _lock:
        found = _cassettes.get(run_id)
        if found is not None:
            _cassettes.move_to_end(run_id)
            return found
    return cassette_keep(run_id, recordings(run_id))


def cassette_keep(run_id: str, found: dict[str, Recording]) -> dict[str, Recording]:
    """Keep a cassette read by whoever had the run's events at hand already (a full
    replay's conductor reads them once for its book and its root turns alike)."""
    with _lock:
        _cassettes[run_id] = found
        _cassettes.move_to_end(run_id)
        while len(_cassettes) > _KEPT:
            _cassettes.popitem(last=False)
    return found


def cassette_forget() -> None:
    """Drop every cassette this process keeps (a test that rewrites a run's trace)."""
    with _lock:
        _cassettes.clear()
