"""A gateway worker's pops (workers/gateway/server.py's pump), which must finish once begun.

A session that ends cancels its pump. Redis removes a job as it answers a pop, so a pop
cancelled while its reply was on the way (redis-py drops the connection) left the job on no
queue and claimed by nobody, and its conductor waited out the job's timeout. A pop now runs
to its end whatever happens to the pump, and what it took for a session that is over goes
back on the queue it came from, first in line again (`put_back`). Once a pop's reply is in,
the pump holds its jobs before its next await, so a session that ends from then on reports
them lost (WorkerLink.lost) and their conductors send them elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from workers import wire

log = logging.getLogger(__name__)

Popped = tuple[str, bytes]  # the queue a message came from, and the message


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
            popped += await pop_now(redis, queues, free() - 1)
    return popped


async def put_back(redis: Any, popped: Sequence[Popped]) -> None:
    """Messages popped for nothing, back on their queues where the next pop finds them."""
    if not popped:
        return
    pipe = redis.pipeline(transaction=False)
    for queue, raws in wire.unpopped(popped).items():
        pipe.rpush(queue, *raws)
    await pipe.execute()
    log.warning("gateway: %d job(s) popped for a session that ended went back", len(popped))


class Pops:
    """A session's pops in flight, shielded from its pump's cancellation."""

    def __init__(self, put_back: Callable[[list[Popped]], Awaitable[None]]) -> None:
        self.put_back = put_back  # `put_back` on the session's client
        self.after: set[asyncio.Task[None]] = set()  # put-backs under way

    async def pop(self, pop: Awaitable[list[Popped]]) -> list[Popped]:
        """What `pop` took. Cancelled while it runs, the pop goes on, and whatever it takes
        goes back on its queue."""
        step = asyncio.ensure_future(pop)
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            step.add_done_callback(self._put_back_when_done)
            raise

    def _put_back_when_done(self, step: asyncio.Future[list[Popped]]) -> None:
        if step.cancelled() or step.exception() is not None or not step.result():
            return
        task = asyncio.ensure_future(self._put_back(step.result()))
        self.after.add(task)
        task.add_done_callback(self.after.discard)

    async def _put_back(self, popped: list[Popped]) -> None:
        try:
            await self.put_back(popped)
        except Exception:  # noqa: BLE001 - logged: the jobs' conductors time them out
            log.exception("gateway: could not put %d popped job(s) back", len(popped))
