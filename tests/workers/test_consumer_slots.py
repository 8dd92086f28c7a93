"""FRLM's own consumer (workers/consumer.py) keeps its slot count right when Redis fails a
pop: every slot it held is given back once, and it goes on (a real Redis cannot be made to
fail exactly between the two pops, so the client here is a stand-in)."""

from __future__ import annotations

import redis

from workers import consumer as consumer_module
from workers.consumer import QueueConsumer, one_by_one
from workers.slots import Slots


class FailingBrpop:
    """Nothing queued; the blocking pop fails `failures` times, then finds nothing."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.brpops = 0

    def eval(self, *_args, **_kwargs) -> list:
        return [[0, 0], []]  # wire.POP_LUA's reply: none from either queue

    def brpop(self, _queues, timeout: float):
        self.brpops += 1
        if self.brpops <= self.failures:
            raise redis.ConnectionError("Redis went away")
        return None


def free_slots(slots: Slots) -> int:
    taken = 0
    while slots.free.acquire(blocking=False):
        taken += 1
    slots.give_back(taken)
    return taken


def test_a_failed_pop_gives_back_each_slot_once_and_the_consumer_goes_on(monkeypatch):
    monkeypatch.setattr(consumer_module, "OUTAGE_PAUSE_S", 0.0)
    slots = Slots(4)
    client = FailingBrpop(failures=2)
    loop = QueueConsumer(
        client, ["worker.w1", "venue.v"], slots, one_by_one(lambda job: True), wait_s=0.01
    )
    # Before the fix the failed BRPOP gave back all four slots after three had gone back
    # already: the BoundedSemaphore raised ValueError and the worker stopped.
    loop.run(lambda: client.brpops >= 4)
    assert client.brpops >= 4
    assert free_slots(slots) == 4
