"""The venue side of a sub-query: a Celery task on the `venue.<name>` queue."""

from __future__ import annotations

import json
import logging
import os
import time

from celery import shared_task

from frlm_web.redis_client import get_redis
from traces.emitter import Emitter
from workers import venues
from workers.backends import ModelError, ModelSpec, chat
from workers.jobs import Job, Result, cancelled_key, encode_result, results_stream

log = logging.getLogger(__name__)


def _sim_profile() -> dict:
    raw = os.environ.get("FRLM_SIM_PROFILE")
    return json.loads(raw) if raw else {}


@shared_task(name="workers.subquery_execute", ignore_result=True, acks_late=False)
def subquery_execute(job: Job) -> None:
    """1. skip work nobody wants any more, 2. call the model inside an Execute span,
    3. push the result to the run's result stream."""
    client = get_redis()
    venue, worker_id = venues.this_worker() or ("unknown", None)
    base: Result = {"sq_id": job["sq_id"], "venue": venue, "worker_id": worker_id or ""}

    if time.time() > job["deadline"] or client.sismember(
        cancelled_key(job["run_id"]), job["sq_id"]
    ):
        client.xadd(results_stream(job["run_id"]), encode_result({**base, "status": "cancelled"}))
        return

    emitter = Emitter(client, job["run_id"], venue=venue, worker_id=worker_id)
    spec = ModelSpec.from_dict(job["model"])
    if spec.kind == "sim":
        profile = {**_sim_profile(), **spec.sim, "attempt": job.get("attempt", 1) - 1}
        spec = ModelSpec(spec.kind, spec.model, spec.base_url, profile)
    span = emitter.start(
        "SubQuery.Execute",
        parent=job["submit_span"],
        depth=job["depth"],
        sq_id=job["sq_id"],
        model=spec.label,
    )
    # Tells the conductor who holds the job, so it can re-dispatch if this worker dies.
    client.xadd(results_stream(job["run_id"]), encode_result({**base, "status": "started"}))
    try:
        reply = chat(
            spec, [{"role": "user", "content": job["prompt"]}], timeout=job["timeout_s"], retries=1
        )
    except ModelError as exc:
        span.end("error", error=str(exc))
        client.xadd(
            results_stream(job["run_id"]),
            encode_result({**base, "status": "error", "error": str(exc)}),
        )
        return
    span.end(
        "ok",
        payload=reply.text,
        tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out,
        cost=reply.cost,
        model_ms=reply.ms,
    )
    result: Result = {
        **base,
        "status": "ok",
        "text": reply.text,
        "tokens_in": reply.tokens_in,
        "tokens_out": reply.tokens_out,
        "ms": reply.ms,
        "cost": reply.cost,
    }
    client.xadd(results_stream(job["run_id"]), encode_result(result))
