"""What workers sign: their requests to the worker API, and every final result they push to
a run's result stream. The conductor checks results with result_verify; the API checks
requests with request_claim and workers.keys.verify."""

from __future__ import annotations

import hashlib
from typing import Any, TypedDict

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workers import keys
from workers.jobs import Result

TIMESTAMP_HEADER = "X-FRLM-Timestamp"
SIGNATURE_HEADER = "X-FRLM-Signature"

# The key of the worker running in this process (set by the worker runtime), with which
# subquery_execute signs its results.
_process_key: Ed25519PrivateKey | None = None


class RequestClaim(TypedDict):
    method: str
    path: str
    timestamp: str  # the X-FRLM-Timestamp header as sent: epoch seconds
    body_sha256: str


class ResultClaim(TypedDict):
    run_id: str
    sq_id: str
    worker_id: str
    status: str
    text_sha256: str
    tokens_in: int
    tokens_out: int


def sha256_hex(data: bytes | str) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def request_claim(method: str, path: str, timestamp: str, body: bytes) -> RequestClaim:
    """What a signed API request's signature covers."""
    return {
        "method": method.upper(),
        "path": path,
        "timestamp": timestamp,
        "body_sha256": sha256_hex(body),
    }


def result_claim(result: Result | dict[str, Any]) -> ResultClaim:
    """What a result's `sig` covers: who answered which sub-query of which run, how, with
    what text and token counts. Anything else a result carries (venue, ms, cost) is the
    worker's report, not its signed word."""
    return {
        "run_id": str(result.get("run_id", "")),
        "sq_id": str(result.get("sq_id", "")),
        "worker_id": str(result.get("worker_id", "")),
        "status": str(result.get("status", "")),
        "text_sha256": sha256_hex(str(result.get("text") or "")),
        "tokens_in": int(result.get("tokens_in") or 0),
        "tokens_out": int(result.get("tokens_out") or 0),
    }


def result_sign(key: Ed25519PrivateKey, result: Result) -> str:
    return keys.sign(key, result_claim(result))


def result_verify(result: Result | dict[str, Any], public_key: str) -> bool:
    """True when the result carries `public_key`'s signature over its claim; never raises."""
    sig = result.get("sig")
    if not isinstance(sig, str) or not sig:
        return False
    try:
        claim = result_claim(result)
    except (TypeError, ValueError):
        return False
    return keys.verify(public_key, claim, sig)


def use_process_key(key: Ed25519PrivateKey | None) -> None:
    global _process_key
    _process_key = key


def process_key() -> Ed25519PrivateKey | None:
    return _process_key
