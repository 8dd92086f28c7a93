"""The venue side of a sub-query: a Celery task on the `venue.<name>` queue."""

from __future__ import annotations

import logging
import os
import time

from frlm_web.celery import app
from frlm_web.redis_client import get_redis
from traces.emitter import Emitter, Span
from traces.schema import Event
from workers import fragments, slots, venues, wire
from workers.alive import ALIVE_ENV
from workers.backends import ModelError, ModelSpec, chat
from workers.execution import ok_result, reply_fields, served, signed
from workers.jobs import Job, Result, cancelled_key, encode_result, results_stream
from workers.sim.device import on_device

log = logging.getLogger(__name__)


@app.task(name=wire.TASK, ignore_result=True, acks_late=False)
def subquery_execute(job: Job) -> None:
    """One job, in a slot of this worker (workers/slots.py)."""
    current = slots.current()
    token = current.enter()
    if token is not None:
        current.run(token, job, execute)


@app.task(name=wire.BUNDLE_TASK, ignore_result=True, acks_late=False)
def subquery_bundle(jobs: list[Job]) -> None:
    """Several jobs for this worker in one message: each takes a slot in the bundle's order
    and runs on the slots' threads as if it had come alone; the task ends with the last."""
    if not isinstance(jobs, list) or not jobs:
        log.error("a bundle that is not a list of jobs: dropped")
        return
    current = slots.current()
    pool = current.pool()
    running = []
    for job in jobs:
        token = current.enter()
        if token is None:
            break  # draining: the rest go elsewhere once this worker has deregistered
        running.append(pool.submit(current.run, token, job, execute))
    for future in running:
        error = future.exception()
        if error is not None:
            log.error("a job of a bundle failed: %r", error)


def execute(job: Job) -> bool:
    """1. skip work nobody wants any more, 2. call the model inside an Execute span,
    3. push the result to the run's result stream. Two Redis round trips in all: the
    span's start travels with the cancel check, its end (and the fragments it loaded)
    with the result. Whether it called the model."""
    client = get_redis()
    venue, worker_id = venues.this_worker() or ("unknown", None)
    base: Result = {
        "run_id": job["run_id"],
        "sq_id": job["sq_id"],
        "venue": venue,
        "worker_id": worker_id or "",
    }
    stream = results_stream(job["run_id"])
    if time.time() > job["deadline"]:
        client.xadd(stream, encode_result(signed({**base, "status": "cancelled"})))
        return False

    emitter = Emitter(client, job["run_id"], venue=venue, worker_id=worker_id)
    try:
        spec = on_device(served(ModelSpec.from_dict(job["model"])), attempt=job.get("attempt", 1))
    except ModelError as exc:
        client.xadd(stream, encode_result(signed({**base, "status": "error", "error": str(exc)})))
        return False
    pipe = client.pipeline(transaction=False)
    pipe.sismember(cancelled_key(job["run_id"]), job["sq_id"])
    with emitter.batch(pipe):
        span = emitter.start(
            "SubQuery.Execute",
            parent=job["submit_span"],
            depth=job["depth"],
            sq_id=job["sq_id"],
            model=spec.label,
        )
    # Tells the conductor who holds the job, so it can re-dispatch if this worker dies: it
    # watches this process's alive line (workers/alive.py) and, if the line drops, ends
    # the Execute span as abandoned.
    started = {**base, "status": "started", "span": span.span_id}
    if os.environ.get(ALIVE_ENV) == "1":
        started["alive"] = "1"
    pipe.xadd(stream, encode_result(started))  # type: ignore[arg-type]
    if pipe.execute()[0]:
        _finish(emitter, span, stream, {**base, "status": "cancelled"}, "cancelled")
        return False
    loaded: list[Event] = []
    try:
        prompt, loaded = _load_fragments(emitter, span, job)
        reply = chat(
            spec,
            [{"role": "user", "content": prompt}],
            timeout=job["timeout_s"],
            retries=1,
            recorded=job.get("recorded"),
        )
    except (fragments.FragmentError, ModelError) as exc:
        _fail(emitter, span, stream, base, str(exc), loaded)
        return True
    try:
        result = ok_result(job, base, worker_id or "", reply)
    except ValueError as exc:
        _fail(emitter, span, stream, base, f"cannot attest: {exc}", loaded)
        return True
    _finish(emitter, span, stream, result, "ok", loaded, **reply_fields(reply))
    return True


def _load_fragments(emitter: Emitter, span: Span, job: Job) -> tuple[str, list[Event]]:
    """The prompt with the context fragments it refers to read in (workers/fragments.py),
    and one Env.LoadFragment event per fragment, stamped now, to send with the span's end."""
    prompt, items = fragments.fill(job["prompt"])
    loaded = [
        emitter.build(
            "Env.LoadFragment", "instant", parent=span.span_id, depth=job["depth"], **item
        )
        for item in items
    ]
    return prompt, loaded


def _fail(
    emitter: Emitter, span: Span, stream: str, base: Result, error: str, loaded: list[Event]
) -> None:
    """End the Execute span as an error and deliver the error result."""
    _finish(
        emitter,
        span,
        stream,
        {**base, "status": "error", "error": error},
        "error",
        loaded,
        error=error,
    )


def _finish(
    emitter: Emitter,
    span: Span,
    stream: str,
    result: Result,
    status: str,
    loaded: list[Event] | None = None,
    **fields: object,
) -> None:
    """End the Execute span and deliver the signed result in one round trip, with the
    events held for it (`loaded`) ahead of the end."""
    pipe = emitter.client.pipeline(transaction=False)
    with emitter.batch(pipe):
        for event in loaded or ():
            emitter.emit_built(event)
        span.end(status, **fields)
    pipe.xadd(stream, encode_result(signed(result)))
    pipe.execute()
