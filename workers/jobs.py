"""The contract between the conductor and venue workers: what a sub-query job carries,
where its result goes, and how it is cancelled. Workers push results to a Redis stream of
the run; the conductor reads it and never waits on Celery's result backend."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal
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
    # (it refused the holder's result: try the job again now), returned (its holder gave it
    # back: the session it came on dropped before it answered; try it again now)
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
    malformed: str  # the conductor's: which figures were out of type or range (decode_result)
    # The conductor's: the token counts it believes of an ok reply, those of `tokens_in` and
    # `tokens_out` (the worker's signed word) that its prompt and text could hold
    # (runs/engine/fanout/spending.py, fair_tokens): what the run's totals add up.
    counted: tuple[int, int]


RESULT_FIELDS_INT = ("tokens_in", "tokens_out")
RESULT_FIELDS_FLOAT = ("ms",)
# What a worker's figures may be: beyond these a result is malformed (a review sent 1.5,
# 10**30 and -1000000 tokens, "abc" ms and a cost of 1e400; each broke a batch, a run's
# row or every page that sums costs).
MAX_TOKENS = 10**9
MAX_MS = 1e9
MAX_COST = Decimal(1_000_000)  # dollars for one reply
# The finest cost a claim is kept to: a price of 12 decimal places per 1,000 tokens, times
# whole tokens, has at most 15. A claim of "1e-1000000" was written out in full, a million
# digits, into every Budget.Settle, receipt and run summary that named it (a review).
COST_STEP = Decimal("1e-15")
MAX_ERROR_CHARS = 2000
# How a worker's error result begins when it cannot call the model endpoint a job names
# (workers/execution.served): the run's routing, not the worker, is at fault; the conductor
# sends the job elsewhere for free and gives that worker none of the run's work.
UNSERVED_ENDPOINT = "the job names the model endpoint"


def results_stream(run_id: str) -> str:
    return f"frlm:run:{run_id}:results"


def cancelled_key(run_id: str) -> str:
    return f"frlm:run:{run_id}:cancelled"


def encode_result(result: Result) -> dict[str, str]:
    return {k: str(v) for k, v in result.items() if v is not None}


def decode_result(fields: dict[bytes, bytes]) -> Result:
    """A result as read from its stream; never raises. A figure out of its type or range is
    read as 0 and named in `malformed`, for the conductor to refuse the reply (intake)."""
    data = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()}
    out: dict[str, Any] = dict(data)
    problems = []
    for key in RESULT_FIELDS_INT:
        if key in out:
            text = out[key].strip()
            whole = int(text) if text.isdigit() and len(text) <= 10 else -1
            if not 0 <= whole <= MAX_TOKENS:
                problems.append(f"{key} must be a whole number from 0 to {MAX_TOKENS:,}")
                whole = 0
            out[key] = whole
    for key in RESULT_FIELDS_FLOAT:
        if key in out:
            try:
                value = float(out[key])
            except ValueError:
                value = math.nan
            if not 0 <= value <= MAX_MS:  # NaN too
                problems.append(f"{key} must be a number from 0 to {MAX_MS:g}")
                value = 0.0
            out[key] = value
    if "cost" in out:
        try:
            cost = money(out["cost"])
        except (ValueError, ArithmeticError):
            # A worker's claim, not the books' figure: a malformed one counts as nothing.
            cost = ZERO
        if cost > MAX_COST:
            problems.append(f"cost must be at most {MAX_COST} dollars")
            cost = ZERO
        out["cost"] = cost.quantize(COST_STEP, rounding=ROUND_HALF_EVEN).normalize()
    if "error" in out:
        out["error"] = out["error"][:MAX_ERROR_CHARS]
    if problems:
        out["malformed"] = "; ".join(problems)
    return out  # type: ignore[return-value]
