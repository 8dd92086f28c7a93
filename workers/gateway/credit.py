"""How many jobs a gateway worker of an untrusted venue may hold at once: earned by answering.

A worker names its own slots (up to workers.services.MAX_CONCURRENCY), and its session pops
jobs off its own queue and its venue's while it has room. With `routing=shared` the venue's
queue is every run's: a hostile review's worker registered 1,024 slots, took every job the
queue had (and the retries of those it sat on), answered none, and its runs "succeeded"
with answers made of timeouts. So a worker of an untrusted venue holds at most its credit:
- START jobs at first, whatever slots it names (enough for an honest worker's slots and
  buffer as `make up` and the benches run them);
- one more for each job it answers with a reply (status ok), up to its slots and buffer;
- half as many for each job it still holds LATE_TIMES its timeout (and LATE_GRACE_S)
  after the session's watch first saw it: an honest worker's call ends within twice its
  timeout (one retry), and a job waiting in its buffer within one more call. Such a job is
  taken back (the conductor has long sent it elsewhere), so it holds no place any longer;
- kept in Redis for KEEP_S after its last change, so a new session starts where the last
  one left off, not at START again; a session that ends holding jobs past their timeout is
  halved for each (its runs are told at once, and send them elsewhere).
The conductor is told the credit as the worker's concurrency in presence, so routing sends
it no more than it may hold. A trusted venue's workers are not rationed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError

from workers.gateway.relay import Held
from workers.reputation import credit_key

log = logging.getLogger(__name__)

START = 32
KEEP_S = 3600
LATE_TIMES = 4
LATE_GRACE_S = 5.0


class Credit:
    def __init__(self, worker_id: str, *, trusted: bool) -> None:
        self.worker_id = worker_id
        self.trusted = trusted
        self.value = START
        self._changed = False

    def room(self, cap: int) -> int:
        """The most jobs the worker may hold: its slots and buffer (`cap`), within its credit."""
        return cap if self.trusted else min(cap, self.value)

    def answered(self, replies: int, cap: int) -> None:
        """It answered `replies` jobs with a reply: one more place for each, up to `cap`."""
        if replies and self.value < cap:
            self.value = min(cap, self.value + replies)
            self._changed = True

    def overdue(self, held: Iterable[Held], now: float) -> list[Held]:
        """The jobs held too long (see above; `now` from time.monotonic), its credit halved
        for each; the watch takes them back."""
        late = []
        for job in held:
            if not job.seen:
                job.seen = now
            elif now - job.seen > LATE_TIMES * job.timeout_s + LATE_GRACE_S:
                late.append(job)
                self._halve()
        return late

    def left_holding(self, held: Iterable[Held], now: float) -> None:
        """Its session ended: halved for each job it held past that job's timeout. Free, a
        hoarder dropped its socket just before its jobs went late, and took as many again
        on its next session, for ever (a review); an honest restart rarely holds any so old."""
        for job in held:
            if job.seen and now - job.seen > job.timeout_s:
                self._halve()

    def _halve(self) -> None:
        self.value = max(1, self.value // 2)
        self._changed = True

    async def load(self, redis: Any) -> None:
        """Where its last session left it, if within KEEP_S (a Redis error: START)."""
        try:
            kept = await redis.get(credit_key(self.worker_id))
        except RedisError as exc:
            log.warning("gateway: no credit read for worker %s: %s", self.worker_id, exc)
            return
        if kept is not None and kept.isdigit():
            self.value = max(1, int(kept))

    async def save(self, redis: Any) -> None:
        if not self._changed or self.trusted:
            return
        try:
            await redis.set(credit_key(self.worker_id), self.value, ex=KEEP_S)
            self._changed = False
        except RedisError as exc:  # kept in this session; said again at its next change
            log.warning("gateway: credit of worker %s not kept: %s", self.worker_id, exc)
