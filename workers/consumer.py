"""FRLM's own consumer of a broker worker's queues (`frlm_worker --consumer frlm`).

Celery's consumer costs a broker worker about a third of its CPU per job (issue 18's
profile: kombu's read and decode, the request, the task's tracing), and for an untrusted
worker its prefetch counts messages, so such a worker takes one job per message. This
loop takes jobs off the worker's queues (its own `worker.<id>` first, then `venue.<name>`)
only for slots that are free: as many as are free in one round trip (wire.POP_LUA), or,
with none queued, the first to come (BRPOP). It therefore never holds a job it does not
run, trusted or not: what a kill -9 loses is what runs, as with Celery's at-most-once
delivery, and the conductor sends that elsewhere when the worker's alive line drops.

The jobs run in the worker's slots (workers/slots.py) through the same `execute` as the
Celery task; a bundle's extra jobs wait for slots as they do there. Celery's remote
control does not reach this loop: a revoked job is found in its run's cancelled set as it
starts, as every job is. A message that is not a sub-query task is dropped, and said."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import redis

from frlm_web.redis_client import LuaScript
from workers import wire
from workers.jobs import Job
from workers.slots import Slots

log = logging.getLogger(__name__)

_POP = LuaScript(wire.POP_LUA)
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
        execute: Callable[[Job], bool],
        *,
        wait_s: float = WAIT_S,
    ) -> None:
        self.client = client
        self.queues = queues
        self.slots = slots
        self.execute = execute
        self.wait_s = wait_s

    def run(self, stopping: Callable[[], bool]) -> None:
        """Take and run jobs until `stopping()` says so, then wait for the ones running.
        A flag, not an Event: a signal handler that set an Event while this thread held
        its lock (in a wait) would deadlock."""
        pool = self.slots.pool()
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
                self._start(pool, raws, held)
        finally:
            pool.shutdown(wait=True)

    def _take(self, held: int) -> tuple[list[bytes], int]:
        """Up to `held` messages at once; with none queued, the first to come within
        wait_s, for which one slot stays held (the others are given back meanwhile). The
        messages, and how many slots are still held for them; on a Redis error every
        slot is given back before it is raised."""
        try:
            raws = _POP(keys=self.queues, args=[held], client=self.client)
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

    def _start(self, pool: ThreadPoolExecutor, raws: list[bytes], held: int) -> None:
        """Each message's jobs into slots: the `held` ones first, then a bundle's extra
        jobs as slots free; slots held for nothing (fewer jobs than slots, a message
        dropped) are given back. Once the worker drains, a job without a slot is left,
        like one Celery prefetched: the conductor sends it elsewhere."""
        jobs: list[Job] = []
        for raw in raws:
            try:
                jobs += wire.jobs_of(raw)
            except ValueError as exc:
                log.error("worker: a message on %s dropped: %s", self.queues, exc)
        if len(jobs) < held:
            self.slots.give_back(held - len(jobs))
            held = len(jobs)
        for index, job in enumerate(jobs):
            token = self.slots.begin() if index < held else self.slots.enter()
            if token is None:
                break
            pool.submit(self.slots.run, token, job, self.execute).add_done_callback(_said)


def _said(future: Future[None]) -> None:
    """A job that raised (Redis gone past its retries, a malformed job) is said in the log,
    as Celery says a task's error; its conductor learns of it at the job's timeout."""
    error = future.exception()
    if error is not None:
        log.error("worker: a job failed: %r", error)
