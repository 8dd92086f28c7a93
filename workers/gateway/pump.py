"""A gateway worker's pops (workers/gateway/server.py's pump), which must finish once begun
and must not be run twice.

A session that ends cancels its pump. Redis removes a job as it answers a pop, so a pop
cancelled while its reply was on the way (redis-py drops the connection) left the job on no
queue and claimed by nobody, and its conductor waited out the job's timeout. A pop now runs
to its end whatever happens to the pump, and what it took for a session that is over goes
back on the venue's queue, first in line again (`put_back`). Once a pop's reply is in, the
pump holds its jobs before its next await, so a session that ends from then on reports them
lost (WorkerLink.lost) and their conductors send them elsewhere.

Pops and put-backs go through a client that runs a command once (aredis.async_redis with
ride_out=False): run again after a lost reply, a pop took other jobs and a put-back pushed a
job twice. A failed pop is tried again after OUTAGE_PAUSE_S (`Pops.next`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from workers import wire

log = logging.getLogger(__name__)

Popped = tuple[str, bytes]  # the queue a message came from, and the message
OUTAGE_PAUSE_S = 1.0  # after Redis failed a pop


async def pop_now(redis: Any, queues: Sequence[str], count: int) -> list[Popped]:
    """Up to `count` messages off `queues` without waiting, the first queue first."""
    if count < 1:
        return []
    reply = await redis.eval(wire.POP_LUA, len(queues), *queues, count)
    return wire.popped(queues, reply)


async def pop_wait(redis: Any, queues: Sequence[str], timeout: float) -> list[Popped]:
    """The first message to come on `queues` within `timeout` seconds, or none."""
    popped = await redis.brpop(list(queues), timeout=timeout)
    if popped is None:
        return []
    queue, raw = popped
    return [(queue.decode() if isinstance(queue, bytes) else queue, raw)]


async def pop_some(
    redis: Any, queues: Sequence[str], free: Callable[[], int], wait_s: float
) -> list[Popped]:
    """As many messages as `free()` says without waiting; with none queued, the first to
    come within `wait_s` seconds, and what was queued with it."""
    popped = await pop_now(redis, queues, free())
    if not popped:
        popped = await pop_wait(redis, queues, wait_s)
        if popped:
            try:
                popped += await pop_now(redis, queues, free() - 1)
            except RedisError as exc:  # what the wait took is held: it goes out alone
                log.warning("gateway: a pop failed (%s); the job already taken goes on", exc)
    return popped


async def put_back(redis: Any, popped: Sequence[Popped], *, shared: str) -> None:
    """Messages popped for a session that ended, back on the venue's queue `shared` where
    the next pop finds them. Those of the worker's own queue are not: they were given to
    that worker by name, its conductor sends them elsewhere once the worker is out of
    presence, and its queue is deleted when it deregisters."""
    back = [(queue, raw) for queue, raw in popped if queue == shared]
    if back:
        pipe = redis.pipeline(transaction=False)
        for queue, raws in wire.unpopped(back).items():
            pipe.rpush(queue, *raws)
        await pipe.execute()
    log.warning(
        "gateway: %d job(s) popped for a session that ended: %d back on %s, %d of the "
        "worker's own left to their conductors",
        len(popped),
        len(back),
        shared,
        len(popped) - len(back),
    )


class Pops:
    """A session's pops: in flight, shielded from its pump's cancellation; failed, tried
    again after a pause."""

    def __init__(self, put_back: Callable[[list[Popped]], Awaitable[None]]) -> None:
        self.put_back = put_back  # `put_back` on the session's client and venue queue
        self.after: set[asyncio.Future[Any]] = set()  # pops and put-backs under way
        self.failing = False

    async def next(self, pop: Callable[[], Awaitable[list[Popped]]]) -> list[Popped]:
        """What the next `pop()` that does not fail takes (said once in the log when
        Redis fails them and once when it is back)."""
        while True:
            try:
                popped = await self.pop(pop())
            except RedisError as exc:
                if not self.failing:
                    log.warning("gateway: a pop failed (%s); trying again every %g s", exc,
                                OUTAGE_PAUSE_S)  # fmt: skip
                self.failing = True
                await asyncio.sleep(OUTAGE_PAUSE_S)
                continue
            if self.failing:
                log.warning("gateway: pops work again")
                self.failing = False
            return popped

    async def pop(self, pop: Awaitable[list[Popped]]) -> list[Popped]:
        """What `pop` took. Cancelled while it runs, the pop goes on, and whatever it takes
        goes back on its queue."""
        step = asyncio.ensure_future(pop)
        self._keep(step)
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            step.add_done_callback(self._put_back_when_done)
            raise

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self.after.add(task)
        task.add_done_callback(self.after.discard)

    def _put_back_when_done(self, step: asyncio.Future[list[Popped]]) -> None:
        if step.cancelled():
            return
        if step.exception() is not None:
            log.warning("gateway: a pop of a session that ended failed: %s", step.exception())
            return
        if step.result():
            self._keep(asyncio.ensure_future(self._put_back(step.result())))

    async def _put_back(self, popped: list[Popped]) -> None:
        try:
            await self.put_back(popped)
        except Exception:  # noqa: BLE001 - logged: the jobs' conductors time them out
            log.exception("gateway: could not put %d popped job(s) back", len(popped))
