"""A gateway worker's pops (workers/gateway/server.py's pump), which must lose no job
whatever fails between Redis taking it off its queue and the worker being named its holder.

A pop moves what it takes off the queues into the session's *hand*: one Redis list per
queue (`Hand`), in the same Lua step (`TAKE_LUA`), or with BLMOVE while it waits. A job
leaves the hand only in the round trip that claims it for the worker (`Hand.release`,
beside the claims). So whatever breaks in between, the job is still somewhere Redis keeps:
- a pop whose reply is lost to a broken connection: the next pop returns what is still in
  the hand first (`TAKE_LUA` tops it up and returns it whole);
- a session that ends while a pop is under way: the pop runs to its end (`Pops.pop`,
  shielded) and the session's hand is then emptied (`return_hands`): the venue's jobs go
  back on its queue, first in line; the worker's own are left to its conductors, which
  send a departed worker's jobs elsewhere (its queue is deleted when it deregisters);
- a web server killed with -9 between a pop and its claims: the worker's next session
  returns the hands of its sessions before (`recover`), its own jobs included.

The pump alone pops for a session, one step at a time, so its hand holds only what it took
and has not yet claimed, and a job a waiting BLMOVE moved in while the pump was busy is its
next pop's. (The result relay popped for the slots its results freed in the same round
trip; a second popper's jobs could sit in the other's hand while that one had no room.)
Pops go through a client that runs a command once (aredis.async_redis with
ride_out=False): run again after a lost reply, a pop would take jobs past its room.
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
HAND_TTL_S = 86400  # a hand nobody came back for (its worker never did) is let go

# KEYS = the queues, then a hand for each; ARGV = how many jobs the popper has room for.
# What is still in the hand counts against the room and is returned first.
TAKE_LUA = f"""
local n = #KEYS / 2
local have = 0
for i = 1, n do have = have + redis.call('LLEN', KEYS[n + i]) end
local want = tonumber(ARGV[1]) - have
for i = 1, n do
  if want <= 0 then break end
  local got = redis.call('RPOP', KEYS[i], want)
  if got then
    redis.call('RPUSH', KEYS[n + i], unpack(got))
    want = want - #got
  end
end
local counts, out = {{}}, {{}}
for i = 1, n do
  local held = redis.call('LRANGE', KEYS[n + i], 0, -1)
  counts[i] = #held
  for _, raw in ipairs(held) do out[#out + 1] = raw end
  if #held > 0 then redis.call('EXPIRE', KEYS[n + i], {HAND_TTL_S}) end
end
return {{counts, out}}
"""

# KEYS = a hand's lists, then the queue of each; ARGV = for each, 1 to put its jobs back on their
# queue (to be popped again first, in the order they were), 0 to let them go. Returns how
# many went back and how many were let go.
RETURN_LUA = """
local n = #KEYS / 2
local back, gone = 0, 0
for i = 1, n do
  local held = redis.call('LRANGE', KEYS[i], 0, -1)
  if #held > 0 then
    if ARGV[i] == '1' then
      for j = #held, 1, -1 do redis.call('RPUSH', KEYS[n + i], held[j]) end
      back = back + #held
    else
      gone = gone + #held
    end
    redis.call('DEL', KEYS[i])
  end
end
return {back, gone}
"""


class Hand:
    """Where a session holds what its pump popped until it is claimed: a list per queue,
    `frlm:worker:<id>:hand:<session>:<i>`, named in the worker's set of sessions with
    hands (`frlm:worker:<id>:hands`) so that its next session finds them; and the BLMOVE
    waiting on each queue, kept from one wait to the next (cancelled, one dropped its
    connection, and one Redis served meanwhile left a job for the next pop)."""

    def __init__(self, worker_id: str, session: str, queues: Sequence[str]):
        self.worker_id = worker_id
        self.session = session
        self.queues = list(queues)
        self.keys = [hand_key(worker_id, session, i) for i in range(len(queues))]
        self.moves: dict[int, asyncio.Future[Any]] = {}  # queue index: its BLMOVE

    def take_args(self, room: int) -> list[Any]:
        """TAKE_LUA's KEYS count and arguments for a pop with `room` free places."""
        return [2 * len(self.queues), *self.queues, *self.keys, max(0, room)]

    def release(self, pipe: Any, popped: Sequence[Popped]) -> None:
        """Queue on `pipe` the removal of what a pop returned (the round trip that claims
        it): it is the first of each list, in order; whatever a BLMOVE added since is after
        it and stays for the next pop."""
        for key, queue in zip(self.keys, self.queues, strict=True):
            count = sum(1 for source, _ in popped if source == queue)
            if count:
                pipe.ltrim(key, count, -1)


def hand_key(worker_id: str, session: str, index: int) -> str:
    return f"frlm:worker:{worker_id}:hand:{session}:{index}"


def hands_key(worker_id: str) -> str:
    """The sessions of a worker that may have hands left."""
    return f"frlm:worker:{worker_id}:hands"


async def take(redis: Any, hand: Hand, room: int) -> list[Popped]:
    """What is in `hand`, topped up from its queues to `room` jobs, without waiting."""
    reply = await redis.eval(TAKE_LUA, *hand.take_args(room))
    return wire.popped(hand.queues, reply)


async def wait(redis: Any, hand: Hand, timeout: float) -> bool:
    """Whether a job came on any of `hand`'s queues within about `timeout` seconds: the
    first to come is moved into the hand by a BLMOVE on its queue, one per queue, each
    left waiting when another's job came first."""
    for index, (queue, key) in enumerate(zip(hand.queues, hand.keys, strict=True)):
        if index not in hand.moves:
            move = asyncio.ensure_future(redis.blmove(queue, key, timeout, "RIGHT", "RIGHT"))
            move.add_done_callback(_quiet)
            hand.moves[index] = move
    await asyncio.wait(hand.moves.values(), return_when=asyncio.FIRST_COMPLETED)
    moved = False
    for index, move in list(hand.moves.items()):
        if move.done():
            del hand.moves[index]
            moved = move.result() is not None or moved  # a failed move raises here
    return moved


async def pop_some(redis: Any, hand: Hand, free: Callable[[], int], wait_s: float) -> list[Popped]:
    """As many jobs as `free()` says without waiting (with what the hand still held first);
    with none queued, the first to come within `wait_s` seconds and what came with it."""
    popped = await take(redis, hand, free())
    if not popped and await wait(redis, hand, wait_s):
        popped = await take(redis, hand, free())
    return popped


async def return_hands(
    redis: Any, worker_id: str, session: str, queues: Sequence[str], *, own_too: bool
) -> tuple[int, int]:
    """Empty a session's hand: the venue's jobs back on its queue, first in line, and the
    worker's own (`queues[0]`) too with `own_too`, else let go. (back, let go)."""
    keys = [hand_key(worker_id, session, i) for i in range(len(queues))]
    flags = ["1" if own_too or queue != queues[0] else "0" for queue in queues]
    pipe = redis.pipeline(transaction=False)
    pipe.eval(RETURN_LUA, len(keys) * 2, *keys, *queues, *flags)
    pipe.srem(hands_key(worker_id), session)
    (back, gone), _ = await pipe.execute()
    if back or gone:
        log.warning(
            "gateway: %d job(s) in the hand of worker %s's session %s: %d back on their "
            "queues, %d of its own left to their conductors",
            back + gone, worker_id, session, back, gone,
        )  # fmt: skip
    return int(back), int(gone)


async def recover(redis: Any, worker_id: str, session: str, queues: Sequence[str]) -> None:
    """A new session's first step: the hands its worker's sessions before left (their web
    server was killed between a pop and its claims), all back on their queues; and this
    session named among those with hands."""
    earlier = await redis.smembers(hands_key(worker_id))
    for old in sorted(s.decode() if isinstance(s, bytes) else s for s in earlier):
        if old != session:
            await return_hands(redis, worker_id, old, queues, own_too=True)
    await redis.sadd(hands_key(worker_id), session)
    await redis.expire(hands_key(worker_id), HAND_TTL_S)


class Pops:
    """A session's pops: in flight, shielded from its pump's cancellation; failed, tried
    again after a pause; at the session's end, its hand emptied once the last has run."""

    def __init__(self, hand: Hand, empty: Callable[[bool], Awaitable[Any]]) -> None:
        self.hand = hand
        self.empty = empty  # `return_hands` of the session, given `own_too`
        self.after: set[asyncio.Future[Any]] = set()  # pops under way
        self.failing = False

    async def next(self, pop: Callable[[], Awaitable[list[Popped]]]) -> list[Popped]:
        """What the next `pop()` that does not fail takes (said once in the log when
        Redis fails them and once when it is back). What a failed pop took is still in
        its hand, and the next returns it."""
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
        """What `pop` took. Cancelled while it runs, the pop goes on to its end."""
        step = asyncio.ensure_future(pop)
        self._keep(step)
        return await asyncio.shield(step)

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self.after.add(task)
        task.add_done_callback(self.after.discard)
        task.add_done_callback(_quiet)

    async def close(self, *, own_too: bool) -> None:
        """The session ended: once its pops under way and its BLMOVEs waiting have run,
        its hand is emptied (`return_hands`; run again, it finds it empty)."""
        under_way = {*self.after, *self.hand.moves.values()}
        if under_way:
            await asyncio.wait(under_way)
        try:
            await self.empty(own_too)
        except Exception:  # noqa: BLE001 - logged: the worker's next session returns them
            log.exception("gateway: could not empty a session's hands")


def _quiet(task: asyncio.Future[Any]) -> None:
    """A pop's failure is its caller's to hear; one nobody awaits any more is not an error."""
    if not task.cancelled():
        task.exception()
