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
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis

from frlm_web.redis_client import LuaScript
from workers import wire
from workers.jobs import Job
from workers.slots import Slots

log = logging.getLogger(__name__)

_POP = LuaScript(wire.POP_LUA)
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
        self.taken = 0  # messages taken off the queues
        self.trips = 0  # round trips that took them

    def run(self, stop: threading.Event) -> None:
        """Take and run jobs until `stop` is set, then wait for the ones running."""
        pool = self.slots.pool()
        try:
            while not stop.is_set():
                held = self.slots.take(self.slots.size, self.wait_s)
                if not held:
                    continue
                try:
                    raws, held = self._take(held)
                except redis.RedisError as exc:
                    self.slots.give_back(held)
                    log.warning("worker: could not take jobs off %s: %s", self.queues, exc)
                    stop.wait(OUTAGE_PAUSE_S)
                    continue
                self._start(pool, raws, held)
        finally:
            pool.shutdown(wait=True)

    def _take(self, held: int) -> tuple[list[bytes], int]:
        """Up to `held` messages at once; with none queued, the first to come within
        wait_s, for which one slot stays held (the others are given back meanwhile). The
        messages, and how many slots are still held for them."""
        raws = _POP(keys=self.queues, args=[held], client=self.client)
        if raws:
            self.trips += 1
            self.taken += len(raws)  # type: ignore[arg-type]
            return list(raws), held  # type: ignore[arg-type]
        self.slots.give_back(held - 1)
        popped = self.client.brpop(self.queues, timeout=self.wait_s)
        if popped is None:
            self.slots.give_back(1)
            return [], 0
        self.trips += 1
        self.taken += 1
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
            pool.submit(self.slots.run, token, job, self.execute)
