"""A gateway worker's pump (workers/gateway/server.py) when its session ends while a pop is
on its way back from Redis: the jobs Redis has already popped for it go back on their queues
(workers/gateway/pump.py).

Against the real Redis, through a proxy (frlm_web/netlab.DelayProxy) that holds the bytes
of the server's connection (`freeze`) to stretch the instant in which a reply is in flight;
the WebSocket side is a stand-in, since only the pump's Redis side is under test here
(tests/workers/test_gateway_faults.py drives whole sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from frlm_web.netlab import DelayProxy
from workers.gateway import server as gateway
from workers.jobs import results_stream
from workers.models import Venue, Worker
from workers.wire import job_message

pytestmark = [pytest.mark.usefixtures("stack"), pytest.mark.timeout(60)]

VENUE = "pumptest"  # served by no worker of the test stack: nothing else pops its queue


class Socket:
    """The worker's side as the pump sees it: what was sent to it."""

    address = "127.0.0.1:0 (test)"

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed: int | None = None

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int = 1000) -> None:
        self.closed = code


@pytest.fixture
def direct() -> redis.Redis:
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.keys(f"*{VENUE}*"):
        client.delete(key)
    yield client
    for key in client.keys(f"*{VENUE}*"):
        client.delete(key)


@pytest.fixture
def proxy(direct: redis.Redis) -> DelayProxy:
    port = direct.connection_pool.connection_kwargs["port"]
    proxy = DelayProxy(listen_host="127.0.0.1", target_port=port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def through(proxy: DelayProxy) -> str:
    """The Redis URL through `proxy`."""
    url = urlsplit(settings.REDIS_URL)
    via = url._replace(netloc=f"{url.netloc.rpartition('@')[0]}@127.0.0.1:{proxy.port}")
    return urlunsplit(via)


def link(through: str, slots: int = 2) -> gateway.WorkerLink:
    """A session's link for a worker of VENUE whose clients, made as the server makes them
    (workers/gateway/aredis.py), reach Redis `through` the proxy. Only theirs: the
    process's other client (presence) is made once and kept."""
    worker = Worker(id="pumptest00000001", name="pump", venue=Venue(name=VENUE), concurrency=slots)
    with override_settings(REDIS_URL=through):
        return gateway.WorkerLink(Socket(), worker, slots)  # type: ignore[arg-type]


async def until(check, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def blocked_pops(direct: redis.Redis) -> int:
    """The pump's blocking pops under way: the test stack's workers pop under a Redis user
    of their own."""
    user = urlsplit(settings.REDIS_URL).username
    return sum(1 for c in direct.client_list() if c.get("cmd") == "brpop" and c["user"] == user)


def message(sq_id: str, run_id: str = "rpumptest0001") -> bytes:
    """A queue's message for one sub-query, as a conductor sends it."""
    return job_message(
        job(sq_id, run_id),
        task_id=f"{run_id}-{sq_id}",
        queue=f"venue.{VENUE}",
        expires_s=60,
        argsrepr="(test)",
        reply_to="",
        sender="test",
    ).encode()


def job(sq_id: str, run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "sq_id": sq_id,
        "submit_span": "0123456789abcdef",
        "depth": 1,
        "model": {"kind": "sim", "model": "frlm-sim-worker", "base_url": "", "sim": {}},
        "prompt": f"question {sq_id}",
        "deadline": time.time() + 60,
        "timeout_s": 30,
        "attempt": 1,
    }


def test_a_job_popped_while_the_session_ends_goes_back_on_its_queue(direct, proxy, through) -> None:
    """Redis has popped the job for the pump's blocking pop, and the reply is on its way
    when the worker is lost: before, the pump was cancelled mid-read, the reply went with
    its connection, and the job was on no queue and claimed by nobody, so its conductor
    waited out its timeout."""
    queue = f"venue.{VENUE}"
    raw = message("1.1")

    async def go() -> list[bytes]:
        one = link(through)
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: blocked_pops(direct) >= 1, "the pump's blocking pop")
        proxy.freeze()
        direct.lpush(queue, raw)
        await until(lambda: direct.llen(queue) == 0, "Redis to pop the job for the pump")
        await one.lost("the test ended its session")
        proxy.thaw()
        await until(lambda: direct.llen(queue) > 0, "the job back on its queue", timeout=5)
        assert one.tasks[0].done()
        assert not one.consumer.sent, "a job went to a worker that is gone"
        return direct.lrange(queue, 0, -1)

    assert asyncio.run(go()) == [raw]


def test_what_a_pop_took_beside_others_goes_back_in_its_order(direct, proxy, through) -> None:
    """The pump's non-blocking pop takes several jobs from the worker's own queue and its
    venue's at once: the venue's go back in the order they were in; the worker's own are
    its conductors' to send elsewhere once it is out of presence (its queue is deleted
    when it deregisters: a put-back made it again, a review found)."""
    own, shared = "worker.pumptest00000001", f"venue.{VENUE}"
    mine = [message(f"2.{i}") for i in range(2)]
    theirs = [message(f"3.{i}") for i in range(3)]
    was: dict[str, list[bytes]] = {}

    async def go() -> None:
        one = link(through, slots=8)
        await one.pop_redis.ping()  # its connection, made before the delay
        direct.lpush(own, *mine)
        direct.lpush(shared, *theirs)
        was[shared] = direct.lrange(shared, 0, -1)
        proxy.delay_ms = 400  # each way: the pop lands, and its reply is long on its way
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: direct.llen(own) == 0 and direct.llen(shared) == 0, "the pop")
        await one.lost("the test ended its session")
        await until(lambda: direct.llen(shared) == 3, "the jobs back on their queue", 5)

    asyncio.run(go())
    assert direct.lrange(shared, 0, -1) == was[shared]
    assert not direct.exists(own)
    assert not direct.exists(results_stream("rpumptest0001"))


def test_a_put_back_whose_reply_was_lost_is_not_pushed_twice(direct, proxy, through) -> None:
    """The gateway's client ran a command again on a new connection when its reply was
    lost: a put-back pushed its job twice, and two workers ran it (a review). Pops and
    put-backs run once."""
    shared = f"venue.{VENUE}"
    raw = message("5.1")

    async def go() -> None:
        one = link(through)
        await one.pop_redis.ping()
        proxy.delay_ms = 400
        putting = asyncio.ensure_future(one.pops.put_back([(shared, raw)]))
        await until(lambda: direct.llen(shared) == 1, "the push to land")
        proxy.delay_ms = 0
        proxy.cut()  # its reply is still on the way
        with contextlib.suppress(redis.RedisError):
            await putting
        await asyncio.sleep(0.5)

    asyncio.run(go())
    assert direct.lrange(shared, 0, -1) == [raw]


def test_jobs_popped_beside_results_after_the_session_ended_go_back(direct, proxy, through) -> None:
    """A worker's results free its slots, and the same round trip pops jobs to fill them
    (WorkerLink._results); if the session ended while that trip was out, the jobs are
    put back, not claimed for a worker that is gone."""
    queue = f"venue.{VENUE}"
    raw = message("4.1", "rpumptest0002")

    async def go() -> None:
        one = link(through)
        await one.lost("the test ended its session")
        await one._take([(queue, raw)])
        assert not one.held and not one.consumer.sent

    asyncio.run(go())
    assert direct.lrange(queue, 0, -1) == [raw]
    assert not direct.exists(results_stream("rpumptest0002"))
