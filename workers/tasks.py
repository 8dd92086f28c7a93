"""The venue side of a sub-query as Celery tasks, for a broker worker whose consumer is
Celery's (`frlm_worker --consumer celery`): a job alone, or a bundle of them. What is done
with each job is workers/jobrun.py's."""

from __future__ import annotations

import functools
import logging

from frlm_web.celery import app
from workers import slots, wire
from workers.jobrun import execute
from workers.jobs import Job

log = logging.getLogger(__name__)


@app.task(name=wire.TASK, ignore_result=True, acks_late=False)
def subquery_execute(job: Job) -> None:
    """One job, in a slot of this worker (workers/slots.py)."""
    current = slots.current()
    token = current.enter()
    if token is not None:
        current.run(token, functools.partial(execute, job))


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
        running.append(pool.submit(current.run, token, functools.partial(execute, job)))
    for future in running:
        error = future.exception()
        if error is not None:
            log.error("a job of a bundle failed: %r", error)
