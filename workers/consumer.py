"""FRLM's own consumer of a broker worker's queues (`frlm_worker --consumer frlm`).

Celery's consumer costs a broker worker about a third of its CPU per job (issue 18's
profile: kombu's read and decode, the request, the task's tracing), and for an untrusted
worker its prefetch counts messages, so such a worker takes one job per message. This
loop takes jobs off the worker's queues (its own `worker.<id>` first, then `venue.<name>`)
only for slots that are free: as many as are free in one round trip (wire.POP_LUA), or,
with none queued, the first to come (BRPOP). It therefore never holds a job it does not
run, trusted or not: what a kill -9 loses is what runs, as with Celery's at-most-once
delivery, and the conductor sends that elsewhere when the worker's alive line drops.

The jobs run in the worker's slots (workers/slots.py) through the same steps as a Celery
task's (workers/jobrun.py), but the jobs taken together are opened together, in one round
trip, and their results go out with the others that finished meanwhile
(workers/delivery.py); a bundle's extra jobs wait for slots as they do in the task. The
slots are tasks of an event loop (workers/aslots.py) or threads (`ThreadSlots`). Celery's
remote control does not reach this loop: a revoked job is found in its run's cancelled set as it
starts, as every job is. A message that is not a sub-query task is dropped, and said."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import redis

from frlm_web.redis_client import LuaScript
from workers import wire
from workers.jobs import Job
from workers.slots import Slots

log = logging.getLogger(__name__)

_POP = LuaScript(wire.POP_LUA)
# Jobs taken together, opened together: per job, the rest of its work (what the Runner
# runs: a function on a slot's thread or a coroutine function on the loop; whether it
# called its model), or None where it ended as it opened (workers/jobrun.py's open_jobs).
Opener = Callable[[list[Job]], list[Any]]


class Runner(Protocol):
    """Where opened jobs run, each holding its slot (its token) until its work ends."""

    def start(self, jobs: list[tuple[str, Any]]) -> None: ...
    def shutdown(self) -> None: ...


# The pops go through a client that does not run a command again on a new connection
# (get_redis(ride_out=False)): a pop whose reply was lost, run again, would lose the jobs
# the first one took. A failed pop is tried again after OUTAGE_PAUSE_S instead.
WAIT_S = 1.0  # a wait on the queues, and for a free slot, before looking at `stop` again
OUTAGE_PAUSE_S = 1.0  # after Redis failed a pop (beyond get_redis's own retries)


class QueueConsumer:
    def __init__(
        self,
        client: redis.Redis,
        queues: list[str],
        slots: Slots,
        open_jobs: Opener,
        *,
        wait_s: float = WAIT_S,
        runner: Runner | None = None,
    ) -> None:
        self.client = client
        self.queues = queues
        self.slots = slots
        self.open_jobs = open_jobs
        # Where opened jobs run: the slots' threads, or an event loop (workers/aslots.py).
        self.runner = runner or ThreadSlots(slots)
        self.wait_s = wait_s

    def run(self, stopping: Callable[[], bool]) -> None:
        """Take and run jobs until `stopping()` says so, then wait for the ones running.
        A flag, not an Event: a signal handler that set an Event while this thread held
        its lock (in a wait) would deadlock."""
        try:
            while not stopping():
                held = self.slots.take(self.slots.size, self.wait_s)
                if not held:
                    continue
                try:
                    raws, held = self._take(held)
                except redis.RedisError as exc:
                    log.warning("worker: could not take jobs off %s: %s", self.queues, exc)
                    time.sleep(OUTAGE_PAUSE_S)
                    continue
                self._start(raws, held)
        finally:
            self.runner.shutdown()

    def _take(self, held: int) -> tuple[list[bytes], int]:
        """Up to `held` messages at once; with none queued, the first to come within
        wait_s, for which one slot stays held (the others are given back meanwhile). The
        messages, and how many slots are still held for them; on a Redis error every
        slot is given back before it is raised."""
        try:
            _, raws = _POP(keys=self.queues, args=[held], client=self.client)
        except redis.RedisError:
            self.slots.give_back(held)
            raise
        if raws:
            return list(raws), held  # type: ignore[arg-type]
        self.slots.give_back(held - 1)
        try:
            popped = self.client.brpop(self.queues, timeout=self.wait_s)
        except redis.RedisError:
            self.slots.give_back(1)
            raise
        if popped is None:
            self.slots.give_back(1)
            return [], 0
        return [popped[1]], 1

    def _start(self, raws: list[bytes], held: int) -> None:
        """Each message's jobs into slots: the `held` ones first, opened together, then a
        bundle's extra jobs one at a time as slots free; slots held for nothing (fewer jobs
        than slots, a message dropped) are given back. Once the worker drains, a job
        without a slot is left, like one Celery prefetched: the conductor sends it
        elsewhere."""
        jobs: list[Job] = []
        for raw in raws:
            try:
                jobs += wire.jobs_of(raw)
            except ValueError as exc:
                log.error("worker: a message on %s dropped: %s", self.queues, exc)
        if len(jobs) < held:
            self.slots.give_back(held - len(jobs))
            held = len(jobs)
        if held:
            self._launch([(self.slots.begin(), job) for job in jobs[:held]])
        for job in jobs[held:]:
            token = self.slots.enter()
            if token is None:
                break
            self._launch([(token, job)])

    def _launch(self, started: list[tuple[str, Job]]) -> None:
        """Open jobs that hold their slots, in one go, and run them; a slot whose job ended
        as it opened (cancelled, past its deadline) is free again."""
        try:
            works = self.open_jobs([job for _token, job in started])
        except Exception as exc:
            # Redis gone past its retries: the jobs are lost to this worker, as a
            # Celery task's are when it raises; their conductors retry them at timeout.
            log.error("worker: %d job(s) could not be started: %r", len(started), exc)
            works = [None] * len(started)
        running = []
        for (token, _job), work in zip(started, works, strict=True):
            if work is None:
                self.slots.leave(token, ran=False)
            else:
                running.append((token, work))
        if running:
            self.runner.start(running)


class ThreadSlots:
    """Runs jobs that hold their slots on the slots' threads (workers/slots.py)."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.pool = slots.pool()

    def start(self, jobs: list[tuple[str, Callable[[], bool]]]) -> None:
        for token, work in jobs:
            self.pool.submit(self.slots.run, token, work).add_done_callback(_said)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)


def one_by_one(execute: Callable[[Job], bool]) -> Opener:
    """An opener for a consumer whose jobs each run alone, start to end (`execute`)."""

    def open_jobs(jobs: list[Job]) -> list[Callable[[], bool] | None]:
        return [functools.partial(execute, job) for job in jobs]

    return open_jobs


def _said(future: Future[None]) -> None:
    """A job that raised (Redis gone past its retries, a malformed job) is said in the log,
    as Celery says a task's error; its conductor learns of it at the job's timeout."""
    error = future.exception()
    if error is not None:
        log.error("worker: a job failed: %r", error)
