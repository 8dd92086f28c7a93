"""A gateway worker's pops (workers/gateway/server.py: its pump, and its result relay, which
pops for the slots its results free), which must lose no job whatever fails between Redis
taking it off its queue and the worker being named its holder.

A pop moves what it takes off the queues into the session's *hand*: one Redis list per
queue (`Hand`), in the same Lua step (`TAKE_LUA`), or with BLMOVE while the pump waits. A
job leaves the hand only in the transaction that claims it for the worker (`Hand.release`,
beside the claims, MULTI/EXEC: nothing else runs between them). So whatever breaks in
between, the job is still somewhere Redis keeps:
- a pop whose reply is lost to a broken connection: the next pop returns what is still in
  the hand first (`TAKE_LUA` tops it up, and returns at most the room it is given);
- a session that ends: its pops, BLMOVEs and claims under way run to their end (`Pops`,
  shielded) and, if they all have within SETTLE_S, its hand is then emptied
  (`return_hand`): the venue's jobs go back on its queue, first in line; the worker's own
  stay in the hand for its next session (its conductors send a departed worker's jobs
  elsewhere, and a worker back at once gets them from its next session instead of after
  their timeout); past SETTLE_S, all of it is left to the next session;
- a web server killed with -9 between a pop and its claims: the worker's next session
  puts back what the hands of its sessions before hold (`recover`), its own jobs included.

The pump and the relay pop in turn, each from its pop to its claims (WorkerLink.popping),
so what one takes is claimed before the other pops. While the pump waits, a BLMOVE waits
on each queue and is kept when another's job came first: cancelled, each dropped its
connection, and a new one a job cost the web server a fifth more CPU (bench/federation.py).
So a worker whose slots filled meanwhile may find one job of each queue in its hand, as a
work buffer holds it; every pop returns what the hand holds first. They are cancelled for
a worker that drains, which takes nothing more (one Redis served in that instant is
returned at the session's end). The pump's pops go through a client that runs a command
once (aredis.async_redis with ride_out=False): a failed pop is tried again after a pause;
the relay's pop rides in its round trip, whose client runs it again after a lost reply,
and a pop run again returns the hand it left, topped up to the same room.
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
# A session's end waits no longer for its pops and claims under way: longer than the
# riding client rides out an outage (about a minute, frlm_web.redis_client), or a claim it
# still retries could land after the runs were told the worker is lost.
SETTLE_S = 90.0
HAND_TTL_S = 86400  # a hand nobody came back for (its worker never did) lapses

# KEYS = the queues, the hand's list for each, and the worker's set of sessions with hands;
# ARGV = the pump's room, the session. What the hand still holds counts against the room
# and is returned first; never more than the room.
TAKE_LUA = f"""
local n = (#KEYS - 1) / 2
local room = tonumber(ARGV[1])
local have = 0
for i = 1, n do have = have + redis.call('LLEN', KEYS[n + i]) end
local want = room - have
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
  local held = {{}}
  if room > 0 then held = redis.call('LRANGE', KEYS[n + i], 0, room - 1) end
  counts[i] = #held
  room = room - #held
  for _, raw in ipairs(held) do out[#out + 1] = raw end
  redis.call('EXPIRE', KEYS[n + i], {HAND_TTL_S})
end
redis.call('SADD', KEYS[#KEYS], ARGV[2])
redis.call('EXPIRE', KEYS[#KEYS], {HAND_TTL_S})
return {{counts, out}}
"""

# KEYS = a hand's lists, the queue of each, and the worker's set of sessions with hands;
# ARGV = for each list, 1 to put its jobs back on their queue (to be popped again first,
# in the order they were) or 0 to keep them, then the session, named no more among those
# with hands once its hand is empty. Returns how many went back and how many were kept.
RETURN_LUA = f"""
local n = (#KEYS - 1) / 2
local back, kept = 0, 0
for i = 1, n do
  local held = redis.call('LRANGE', KEYS[i], 0, -1)
  if #held > 0 then
    if ARGV[i] == '1' then
      for j = #held, 1, -1 do redis.call('RPUSH', KEYS[n + i], held[j]) end
      redis.call('DEL', KEYS[i])
      back = back + #held
    else
      kept = kept + #held
    end
  end
end
if kept == 0 then
  redis.call('SREM', KEYS[#KEYS], ARGV[n + 1])
else
  for i = 1, n do redis.call('EXPIRE', KEYS[i], {HAND_TTL_S}) end
  redis.call('EXPIRE', KEYS[#KEYS], {HAND_TTL_S})
end
return {{back, kept}}
"""


class Hand:
    """Where a session holds what its pump popped until it is claimed: a list per queue,
    `frlm:worker:<id>:hand:<session>:<i>`, the session named in the worker's set of
    sessions with hands (`frlm:worker:<id>:hands`) so that its next session finds it; and
    the BLMOVE waiting on each queue."""

    def __init__(self, worker_id: str, session: str, queues: Sequence[str]):
        self.worker_id = worker_id
        self.session = session
        self.queues = list(queues)
        self.keys = [hand_key(worker_id, session, i) for i in range(len(queues))]
        self.moves: dict[int, asyncio.Future[Any]] = {}  # queue index: its BLMOVE
        self.stopped: set[asyncio.Future[Any]] = set()  # BLMOVEs cancelled, not yet done
        self.closing = False  # its session ended: no BLMOVE starts any more

    def take_args(self, room: int) -> list[Any]:
        """TAKE_LUA's KEYS count and arguments for a pop with `room` free places."""
        keys = [*self.queues, *self.keys, hands_key(self.worker_id)]
        return [len(keys), *keys, max(0, room), self.session]

    def release(self, pipe: Any, popped: Sequence[Popped]) -> None:
        """Queue on `pipe` (the transaction that claims them) the removal of what a pop
        returned. By value: run twice (a retried transaction), it removes nothing more."""
        key_of = dict(zip(self.queues, self.keys, strict=True))
        for queue, raw in popped:
            pipe.lrem(key_of[queue], 1, raw)


def hand_key(worker_id: str, session: str, index: int) -> str:
    return f"frlm:worker:{worker_id}:hand:{session}:{index}"


def hands_key(worker_id: str) -> str:
    """The sessions of a worker whose hands may hold jobs."""
    return f"frlm:worker:{worker_id}:hands"


async def take(redis: Any, hand: Hand, room: int) -> list[Popped]:
    """What is in `hand`, topped up from its queues to `room` jobs, without waiting."""
    reply = await redis.eval(TAKE_LUA, *hand.take_args(room))
    return wire.popped(hand.queues, reply)


async def wait(redis: Any, hand: Hand, timeout: float) -> bool:
    """Whether a job came on any of `hand`'s queues within about `timeout` seconds: the
    first to come is moved into the hand by a BLMOVE on its queue, one per queue, each
    left waiting when another's job came first (cancelled, one drops its connection)."""
    if hand.closing:
        return False
    moved, _ = _harvest(hand)  # kept moves that ended while nobody waited (failed: again)
    if moved:
        return True
    for index, (queue, key) in enumerate(zip(hand.queues, hand.keys, strict=True)):
        if index not in hand.moves:
            move = asyncio.ensure_future(redis.blmove(queue, key, timeout, "RIGHT", "RIGHT"))
            move.add_done_callback(_quiet)
            hand.moves[index] = move
    await asyncio.wait(list(hand.moves.values()), return_when=asyncio.FIRST_COMPLETED)
    moved, failed_now = _harvest(hand)
    if not moved and failed_now:
        raise failed_now[0]  # Pops.next pauses and tries again
    return moved


def _harvest(hand: Hand) -> tuple[bool, list[BaseException]]:
    """The moves that have ended, taken out of `hand.moves`: whether one brought a job,
    and the errors of those that failed. (A move stop_waiting cancelled is no longer
    there.)"""
    moved, failed = False, []
    for index, move in list(hand.moves.items()):
        if move.done():
            del hand.moves[index]
            if move.cancelled():
                continue
            if move.exception() is not None:
                failed.append(move.exception())
            elif move.result() is not None:
                moved = True
    return moved, failed


def stop_waiting(hand: Hand) -> None:
    """The BLMOVEs waiting on `hand`'s queues, cancelled: the worker drains. One that
    Redis served in that instant left its job in the hand; the session's end waits for
    them all the same (`Hand.stopped`) and then returns it."""
    for move in hand.moves.values():
        move.cancel()
        hand.stopped.add(move)
        move.add_done_callback(hand.stopped.discard)
    hand.moves.clear()


async def return_hand(
    redis: Any, worker_id: str, session: str, queues: Sequence[str], *, own_too: bool
) -> tuple[int, int]:
    """Empty a session's hand: the venue's jobs back on its queue, first in line, and the
    worker's own (`queues[0]`) too with `own_too`, else kept for its next session.
    Run again, it finds nothing more. (back, kept)."""
    keys = [hand_key(worker_id, session, i) for i in range(len(queues))]
    flags = ["1" if own_too or queue != queues[0] else "0" for queue in queues]
    all_keys = [*keys, *queues, hands_key(worker_id)]
    back, kept = await redis.eval(RETURN_LUA, len(all_keys), *all_keys, *flags, session)
    if back or kept:
        log.warning(
            "gateway: %d job(s) in the hand of worker %s's session %s: %d back on their "
            "queues, %d of its own kept for its next session",
            back + kept, worker_id, session, back, kept,
        )  # fmt: skip
    return int(back), int(kept)


async def recover(redis: Any, worker_id: str, session: str, queues: Sequence[str]) -> None:
    """A new session's first step: what the hands of its worker's sessions before still
    hold (its own queue's jobs kept for it, or all of a session whose web server was
    killed between a pop and its claims), back on their queues."""
    earlier = await redis.smembers(hands_key(worker_id))
    for old in sorted(s.decode() if isinstance(s, bytes) else s for s in earlier):
        if old != session:
            await return_hand(redis, worker_id, old, queues, own_too=True)


class Pops:
    """A session's pops and claims: in flight, shielded from its pump's cancellation;
    failed pops tried again after a pause; at the session's end, its hand emptied once the
    last of them has run."""

    def __init__(self, hand: Hand, empty: Callable[[], Awaitable[Any]]) -> None:
        self.hand = hand
        self.empty = empty  # `return_hand` of the session's end
        self.after: set[asyncio.Future[Any]] = set()  # pops and claims under way
        self.deadline: float | None = None  # of the session's end: SETTLE_S after it began
        self.failing = False

    async def next(self, pop: Callable[[], Awaitable[list[Popped]]]) -> list[Popped]:
        """What the next `pop()` that does not fail takes (said once in the log when
        Redis fails them and once when it is back). What a failed pop took is still in
        the hand, and the next returns it."""
        while True:
            try:
                popped = await self.guard(pop())
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

    async def guard(self, step: Awaitable[Any]) -> Any:
        """What `step` (a pop, or a transaction that claims popped jobs) returns. Cancelled
        while it runs, it goes on to its end, and the session's hand is emptied only
        after it."""
        future = asyncio.ensure_future(step)
        self.after.add(future)
        future.add_done_callback(self.after.discard)
        future.add_done_callback(_quiet)
        return await asyncio.shield(future)

    async def settle(self, *, moves: bool = False) -> bool:
        """Wait for every pop and claim under way (and BLMOVE, with `moves`) to have run,
        until SETTLE_S after the session's end began (one deadline for all its waits):
        whether they all did."""
        loop = asyncio.get_running_loop()
        if self.deadline is None:
            self.deadline = loop.time() + SETTLE_S
        deadline = self.deadline
        while True:
            under_way = {f for f in self.after if not f.done()}
            if moves:
                under_way |= {f for f in (*self.hand.moves.values(), *self.hand.stopped)}
                under_way = {f for f in under_way if not f.done()}
            left = deadline - loop.time()
            if not under_way:
                return True
            if left <= 0:
                return False
            await asyncio.wait(under_way, timeout=left)

    async def close(self) -> None:
        """The session ended: no BLMOVE starts any more, and once every pop, claim and
        BLMOVE under way has run (a BLMOVE within its second), the hand is emptied. Past
        SETTLE_S (Redis away), it is left to the worker's next session (`recover`)."""
        self.hand.closing = True
        if not await self.settle(moves=True):
            log.warning("gateway: a session's pops still ran after %g s; its hand is left to "
                        "its worker's next session", SETTLE_S)  # fmt: skip
            return
        try:
            await self.empty()
        except Exception:  # noqa: BLE001 - logged: the worker's next session returns them
            log.exception("gateway: could not empty a session's hand")


def _quiet(task: asyncio.Future[Any]) -> None:
    """A failure is its caller's to hear; one nobody awaits any more is not an error."""
    if not task.cancelled():
        task.exception()
