"""Cassettes: every model reply of a run, by a hash of its request, read back from the
run's own trace (a model span's end event carries `request_hash`; the reply is its payload
in the blob store). Replaying a run answers its model calls from here, with no model."""

from __future__ import annotations

import functools
import hashlib
import json
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


def recordings(run_id: str) -> dict[str, Recording]:
    """The run's cassette: request hash -> what the model answered."""
    found: dict[str, Recording] = {}
    for event in store.read_events(run_id):
        if event["name"] not in MODEL_SPANS or event["phase"] != "end" or event["status"] != "ok":
            continue
        key = event["attrs"].get("request_hash")
        text = blobs.blob_get(event["payload_ref"]) if event["payload_ref"] else None
        if key and text is not None and key not in found:
            found[key] = Recording(
                text,
                event["tokens_in"] or 0,
                event["tokens_out"] or 0,
                event["cost"],
                event["ms"] or 0.0,
            )
    return found


@functools.lru_cache(maxsize=8)
def cassette(run_id: str) -> dict[str, Recording]:
    """Cached per process: a finished run's trace does not change."""
    return recordings(run_id)
