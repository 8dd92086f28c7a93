"""The pieces of a broker worker's own consumer, against the stack's real Redis: jobs taken
together open in one round trip (workers/jobrun.py), finished jobs are delivered together
and all of them on a drain (workers/delivery.py), and slots run as tasks of one event loop
(workers/aslots.py). A worker running them end to end is in test_worker_runtime.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid

import pytest
import redis

from frlm_web.redis_client import get_redis
from tests.workers.test_worker_runtime import job
from workers.aslots import LoopSlots
from workers.delivery import Delivery
from workers.jobrun import open_jobs
from workers.jobs import cancelled_key, decode_result, results_stream
from workers.slots import Slots


class Counting:
    """A client whose pipelines are counted, and whose `hold`-th execute waits for `go`."""

    def __init__(self, client: redis.Redis, *, hold: int = 0, fail: int = 0) -> None:
        self.client = client
        self.executes = 0
        self.hold, self.fail = hold, fail
        self.held = threading.Event()
        self.go = threading.Event()

    def pipeline(self, **kwargs):
        pipe = self.client.pipeline(**kwargs)
        run = pipe.execute

        def execute():
            self.executes += 1
            if self.executes == self.hold:
                self.held.set()
                self.go.wait(10)
            if self.executes == self.fail:
                raise redis.ConnectionError("Redis went away")
            return run()

        pipe.execute = execute
        return pipe


def answered(run_id: str, sq_id: str) -> dict:
    return {"run_id": run_id, "sq_id": sq_id, "venue": "v", "worker_id": "w", "status": "ok"}


def entries(run_id: str) -> list[dict]:
    return [decode_result(f) for _i, f in get_redis().xrange(results_stream(run_id))]


def test_jobs_taken_together_open_in_one_round_trip_and_each_ends_as_it_should(stack):
    run_id = "jl" + uuid.uuid4().hex[:10]
    late, gone, live = (job(run_id, f"{i}.1", "Say hi.") for i in (1, 2, 3))
    late["deadline"] = time.time() - 1
    get_redis().sadd(cancelled_key(run_id), gone["sq_id"])
    delivered = []
    client = Counting(get_redis())

    opened = open_jobs(client, [late, gone, live], lambda *item: delivered.append(item))

    assert [o is None for o in opened] == [True, True, False]
    assert client.executes == 1  # the cancel checks, the spans' starts and "started", at once
    assert [(r["sq_id"], r["status"]) for _e, _s, r in delivered] == [
        ("1.1", "cancelled"),  # past its deadline: no span opened
        ("2.1", "cancelled"),
    ]
    ends = delivered[1][0]
    assert [(e["name"], e["phase"], e["status"]) for e in ends] == [
        ("SubQuery.Execute", "end", "cancelled")
    ]
    started = [(r["sq_id"], r["span"]) for r in entries(run_id) if r["status"] == "started"]
    assert started == [("2.1", ends[0]["span_id"]), ("3.1", opened[2].start["span_id"])]


def test_delivery_sends_what_was_handed_over_meanwhile_in_one_round_trip(stack):
    run_id = "jl" + uuid.uuid4().hex[:10]
    stream = results_stream(run_id)
    client = Counting(get_redis(), hold=1)
    delivery = Delivery(client)
    delivery([], stream, answered(run_id, "0.1"))
    assert client.held.wait(10)  # the first round trip is under way: the rest wait for it
    for i in range(1, 21):
        delivery([], stream, answered(run_id, f"{i}.1"))
    client.go.set()
    assert delivery.close(10)
    assert client.executes == 2
    assert [r["sq_id"] for r in entries(run_id)] == [f"{i}.1" for i in range(21)]


def test_an_open_shares_a_round_trip_with_the_results_handed_over_before_it(stack):
    """A slot's result is handed over before the slot is free, and the job that takes the
    slot opens after: in the run's stream the result comes first, so a worker never shows
    more jobs running than it has slots; and both go in one round trip."""
    run_id = "jl" + uuid.uuid4().hex[:10]
    stream = results_stream(run_id)
    client = Counting(get_redis(), hold=1)
    delivery = Delivery(client)
    delivery([], stream, answered(run_id, "0.1"))
    assert client.held.wait(10)
    delivery([], stream, answered(run_id, "1.1"))
    delivery([], stream, answered(run_id, "2.1"))
    opened = []
    opening = threading.Thread(
        target=lambda: opened.extend(
            open_jobs(get_redis(), [job(run_id, "3.1", "Say hi.")], delivery, delivery.round_trip)
        )
    )
    opening.start()
    time.sleep(0.2)  # the open waits behind the first round trip, with 1.1 and 2.1
    client.go.set()
    opening.join(10)
    assert delivery.close(10)
    assert client.executes == 2 and opened[0] is not None
    said = [(r["sq_id"], r["status"]) for r in entries(run_id)]
    assert said == [("0.1", "ok"), ("1.1", "ok"), ("2.1", "ok"), ("3.1", "started")]


def test_a_failed_round_trip_fails_the_open_waiting_on_it(stack):
    client = Counting(get_redis(), fail=1)
    delivery = Delivery(client)
    run_id = "jl" + uuid.uuid4().hex[:10]
    with pytest.raises(redis.ConnectionError):
        open_jobs(get_redis(), [job(run_id, "1.1", "Say hi.")], delivery, delivery.round_trip)
    assert delivery.close(10)


def test_a_failed_delivery_is_said_and_the_next_ones_still_go(stack, caplog):
    run_id = "jl" + uuid.uuid4().hex[:10]
    stream = results_stream(run_id)
    client = Counting(get_redis(), hold=1, fail=1)
    delivery = Delivery(client)
    with caplog.at_level(logging.ERROR):
        delivery([], stream, answered(run_id, "lost.1"))
        assert client.held.wait(10)
        client.go.set()
        delivery([], stream, answered(run_id, "kept.1"))
        assert delivery.close(10)
    assert "1 result(s) could not be delivered" in caplog.text
    assert [r["sq_id"] for r in entries(run_id)] == ["kept.1"]


def test_loop_slots_run_jobs_together_free_each_slot_and_wait_for_them_on_shutdown(caplog):
    slots = Slots(4)
    threads: list[str] = []

    def work(fails: bool):
        async def run() -> bool:
            threads.append(threading.current_thread().name)
            await asyncio.sleep(0.2)
            if fails:
                raise RuntimeError("a bug in a job")
            return True

        return run

    loop = LoopSlots(slots)
    started = time.monotonic()
    held = slots.take(4, 1.0)
    assert held == 4
    with caplog.at_level(logging.ERROR):
        loop.start([(slots.begin(), work(fails=i == 3)) for i in range(4)])
        loop.shutdown()  # waits for the four
    elapsed = time.monotonic() - started
    assert threads == ["frlm-slots"] * 4
    assert elapsed < 0.6, "the four ran one after another, not together"
    assert slots.tally.inflight == 0 and len(slots.tally.recent) == 3  # the failed one: not timed
    assert slots.take(4, 0.1) == 4  # every slot was freed, the failed job's too
    assert "a bug in a job" in caplog.text


def test_an_idle_loop_slots_shuts_down_at_once():
    loop = LoopSlots(Slots(2))
    started = time.monotonic()
    loop.shutdown()
    assert time.monotonic() - started < 1.0
    assert not loop._thread.is_alive()


def test_a_jobs_fragments_are_read_off_the_loop_and_reach_the_model(stack, tmp_path, monkeypatch):
    """A fragment of a large context takes milliseconds to read and hash: on the loop, the
    other jobs' replies would wait for it."""
    import hashlib

    from workers import jobrun
    from workers.fragments import MARKER_TEXT

    text = "The launch window opens at 0600 on Tuesday. " * 200
    path = tmp_path / "context.txt"
    path.write_text(text)
    data = text.encode()
    ref = {
        "path": str(path),
        "chars": [0, len(text)],
        "bytes": [0, len(data)],
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    marker = MARKER_TEXT.format(json.dumps(ref))
    run_id = "jl" + uuid.uuid4().hex[:10]
    readers: list[str] = []
    load = jobrun.Opened._load_fragments

    def spied(self):
        readers.append(threading.current_thread().name)
        return load(self)

    monkeypatch.setattr(jobrun.Opened, "_load_fragments", spied)
    delivered = []
    deliver = lambda *item: delivered.append(item)  # noqa: E731
    (opened,) = open_jobs(
        get_redis(), [job(run_id, "1.1", f"When does it open? {marker}")], deliver
    )
    loop = LoopSlots(Slots(1))
    assert loop.slots.take(1, 1.0) == 1
    loop.start([(loop.slots.begin(), lambda: opened.awork(deliver))])
    loop.shutdown()
    assert readers and readers[0] != "frlm-slots"
    ((events, _stream, result),) = delivered
    assert result["status"] == "ok", result
    assert [e["name"] for e in events] == ["Env.LoadFragment", "SubQuery.Execute"]
    assert events[0]["bytes"] == len(data)
