"""The contract between the conductor and venue workers: what a sub-query job carries,
where its result goes, and how it is cancelled. Workers push results to a Redis stream of
the run; the conductor reads it and never waits on Celery's result backend."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, NotRequired, TypedDict

from frlm_web.money import ZERO, money


class Job(TypedDict):
    run_id: str
    sq_id: str  # "<index>.<attempt>" within the run
    submit_span: str  # the SubQuery.Submit span the Execute span hangs under
    prompt: str
    model: dict[str, Any]  # ModelSpec.to_dict()
    deadline: float  # epoch seconds; past it the result is no longer wanted
    depth: int
    timeout_s: float
    attempt: int  # 1 for the first try of a sub-query
    # A validator's job (the high-trust tier): the reply to re-run and attest to, with
    # subquery, span, worker, output and mode (the agreement rule).
    validate: NotRequired[dict[str, Any]]
    # A full replay's: the recorded reply (text, tokens, cost, ms, request_hash), used when
    # the request hashes the same, or the recorded failure ({"error": text}), raised again
    # (workers.backends.chat).
    recorded: NotRequired[dict[str, Any]]


class Result(TypedDict, total=False):
    run_id: str
    sq_id: str
    # started | ok | error | cancelled; the gateway's: lost (look at presence now), refused
    # (it refused the holder's result: try the job again now)
    status: str
    text: str
    error: str
    tokens_in: int
    tokens_out: int
    cost: str | Decimal  # a money string on the wire, exact dollars once decoded
    ms: float
    venue: str
    worker_id: str
    sig: str  # the worker's signature of workers.signing.result_claim (final results)
    attestation: str  # a validator's: JSON of workers.attestation.SignedAttestation
    span: str  # a "started": the Execute span the worker opened
    alive: str  # a "started": "1" when the worker holds an alive line (workers/alive.py)
    at: float  # the conductor's: when it reached the stream (runs/engine/fanout/transport.py)


RESULT_FIELDS_INT = ("tokens_in", "tokens_out")
RESULT_FIELDS_FLOAT = ("ms",)


def results_stream(run_id: str) -> str:
    return f"frlm:run:{run_id}:results"


def cancelled_key(run_id: str) -> str:
    return f"frlm:run:{run_id}:cancelled"


def encode_result(result: Result) -> dict[str, str]:
    return {k: str(v) for k, v in result.items() if v is not None}


def decode_result(fields: dict[bytes, bytes]) -> Result:
    data = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
    out: dict[str, Any] = dict(data)
    for key in RESULT_FIELDS_INT:
        if key in out:
            out[key] = int(out[key])
    for key in RESULT_FIELDS_FLOAT:
        if key in out:
            out[key] = float(out[key])
    if "cost" in out:
        try:
            out["cost"] = money(out["cost"])
        except ValueError:
            # A worker's claim, not the books' figure: a malformed one counts as nothing.
            out["cost"] = ZERO
    return out  # type: ignore[return-value]
