"""What every worker does with a job, however the job reached it (a Celery queue on the
broker, or the gateway's WebSocket): pick the model endpoint from the worker's own
configuration, build the result, attest when asked, sign."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from django.conf import settings

from frlm_web.money import ZERO, money_str
from workers import signing
from workers.agreement import AgreementRule
from workers.attestation import attestation_build, attestation_sign
from workers.backends import ChatResult, ModelError, ModelSpec
from workers.jobs import UNSERVED_ENDPOINT, Job, Result


def served(spec: ModelSpec) -> ModelSpec:
    """The model a job names, called at an endpoint of this worker's own configuration.

    A job says which model, never where: a job naming any other address (a worker, or
    whoever wrote to the queue, could name its own server to collect the API key the
    worker sends with each call) is refused with ModelError. A worker started with its own
    backend (frlm_worker --backend openai, or a gateway worker's own simulated model)
    answers with it whatever the run named; a replay answers from its recording and asks
    the worker's own endpoint for what the recording lacks."""
    if spec.kind == "cassette":
        live = spec.live()
        own_live = served(live) if live is not None else None
        return ModelSpec(
            spec.kind,
            spec.model,
            "",
            spec.sim,
            {**spec.replay, "live": own_live.to_dict() if own_live else None},
        )
    own = _own_backend(os.environ.get("FRLM_WORKER_BACKEND") or "")
    if own:
        return ModelSpec(own["kind"], own["model"] or spec.model, own["base_url"], spec.sim)
    if spec.kind == "sim":
        return ModelSpec("sim", spec.model, settings.FRLM_SIM_URL, spec.sim)
    allowed = {settings.FRLM_OPENAI_BASE_URL, *settings.FRLM_ENDPOINTS.values()}
    if spec.base_url.rstrip("/") not in {url.rstrip("/") for url in allowed}:
        raise ModelError(
            f"{UNSERVED_ENDPOINT} {spec.base_url[:200]!r}, which is not one of "
            "this worker's endpoints; a worker calls only the endpoints it is configured "
            "with (FRLM_ENDPOINTS, FRLM_OPENAI_BASE_URL, or frlm_worker --base-url)"
        )
    return spec


@functools.lru_cache(maxsize=4)
def _own_backend(raw: str) -> dict[str, Any] | None:
    """FRLM_WORKER_BACKEND's value, parsed once, not once per job."""
    return json.loads(raw) if raw else None


def reply_fields(reply: ChatResult) -> dict[str, Any]:
    """What the Execute span's end records of a model reply (its text becomes the span's
    payload)."""
    return {
        "payload": reply.text,
        "tokens_in": reply.tokens_in,
        "tokens_out": reply.tokens_out,
        "cost": reply.cost,
        "model_ms": reply.ms,
        "request_hash": reply.request_hash,
        "replayed": reply.replayed or None,
        "cut_from": reply.cut_from or None,
    }


def ok_result(job: Job, base: Result, worker_id: str, reply: ChatResult) -> Result:
    """The reply as a result, with this worker's attestation when the job asks it to check
    another worker's reply (ValueError when it cannot attest)."""
    result: Result = {
        **base,
        "status": "ok",
        "text": reply.text,
        "tokens_in": reply.tokens_in,
        "tokens_out": reply.tokens_out,
        "ms": reply.ms,
        # A money string on the wire (frlm_web.money): exact, and JSON for the gateway.
        "cost": money_str(reply.cost or ZERO),
    }
    if job.get("validate"):
        result["attestation"] = attest(job, worker_id, reply.text)
    return result


def attest(job: Job, worker_id: str, text: str) -> str:
    """This worker's signed attestation (workers.attestation) of the reply it was asked to
    check: whether its own answer to the same prompt agrees with it."""
    key = signing.process_key()
    if key is None:
        raise ValueError("this worker has no registered key to sign with")
    order = job["validate"]
    attestation = attestation_build(
        run_id=job["run_id"],
        span_id=order["span"],
        subquery_id=order["subquery"],
        worker_id=order["worker"],
        validator_id=worker_id,
        prompt=job["prompt"],
        worker_output=order["output"],
        validator_output=text,
        rule=AgreementRule(mode=order.get("mode", "exact")),
    )
    return json.dumps(attestation_sign(attestation, key), separators=(",", ":"))


def signed(result: Result) -> Result:
    """A final result with this worker's signature; unsigned where no registered worker
    runs this task (the conductor decides what it makes of that)."""
    key = signing.process_key()
    if key is None:
        return result
    return {**result, "sig": signing.result_sign(key, result)}
