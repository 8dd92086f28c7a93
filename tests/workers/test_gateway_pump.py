"""A gateway worker's pops (workers/gateway/server.py, workers/gateway/pump.py) when
something breaks between Redis taking a job off its queue and the worker being named its
holder: the session ends, the pop's reply is lost, the web server dies. Each job is then
still in the session's hands in Redis, and goes on: to this worker, or back on its queue.

Against the real Redis, through a proxy (frlm_web/netlab.DelayProxy) that holds the bytes
of the server's connection (`freeze`) to stretch the instant in which a reply is in flight;
the WebSocket side is a stand-in, since only the pump's Redis side is under test here
(tests/workers/test_gateway_faults.py drives whole sessions)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from frlm_web.netlab import DelayProxy
from workers.gateway import pump
from workers.gateway import server as gateway
from workers.jobs import results_stream
from workers.models import Venue, Worker
from workers.wire import job_message

pytestmark = [pytest.mark.usefixtures("stack"), pytest.mark.timeout(60)]

VENUE = "pumptest"  # served by no worker of the test stack: nothing else pops its queue
WORKER = "pumptest00000001"
OWN = f"worker.{WORKER}"
SHARED = f"venue.{VENUE}"


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
    for pattern in (f"*{VENUE}*", f"frlm:worker:{WORKER}:*"):
        for key in client.keys(pattern):
            client.delete(key)
    yield client
    for pattern in (f"*{VENUE}*", f"frlm:worker:{WORKER}:*"):
        for key in client.keys(pattern):
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
    return _via(settings.REDIS_URL, proxy.port)


def link(through: str, slots: int = 2) -> gateway.WorkerLink:
    """A session's link for a worker of VENUE whose clients, made as the server makes them
    (workers/gateway/aredis.py), reach Redis `through` the proxy. Only theirs: the
    process's other client (presence) is made once and kept."""
    worker = Worker(id=WORKER, name="pump", venue=Venue(name=VENUE), concurrency=slots)
    with override_settings(REDIS_URL=through):
        return gateway.WorkerLink(Socket(), worker, slots)  # type: ignore[arg-type]


async def until(check, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def blocked_pops(direct: redis.Redis) -> int:
    """The pump's blocking pops under way, blocked now (a BLMOVE per queue; before, one
    BRPOP): the test stack's workers pop under a Redis user of their own."""
    user = urlsplit(settings.REDIS_URL).username
    return sum(
        1
        for c in direct.client_list()
        if c.get("cmd") in ("brpop", "blmove") and "b" in c["flags"] and c["user"] == user
    )


def sent_jobs(one: gateway.WorkerLink) -> list[str]:
    """The sub-query ids of the jobs the link sent its worker."""
    return [
        job["sq_id"]
        for text in one.consumer.sent
        for message in [json.loads(text)]
        if message["type"] in ("job", "jobs")
        for job in (message["jobs"] if message["type"] == "jobs" else [message["job"]])
    ]


def leftovers(direct: redis.Redis) -> list[bytes]:
    """Every job still in some session's hands for the test's worker."""
    return [
        raw
        for key in direct.keys(f"frlm:worker:{WORKER}:hand:*")
        for raw in direct.lrange(key, 0, -1)
    ]


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
    """Redis has moved the job into the session's hand for the pump's blocking pop, and the
    reply is on its way when the worker is lost: before, the pump was cancelled mid-read,
    the reply went with its connection, and the job was on no queue and claimed by nobody,
    so its conductor waited out its timeout."""
    raw = message("1.1")

    async def go() -> list[bytes]:
        one = link(through)
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: blocked_pops(direct) >= 1, "the pump's blocking pop")
        proxy.freeze()
        direct.lpush(SHARED, raw)
        await until(lambda: direct.llen(SHARED) == 0, "Redis to pop the job for the pump")
        losing = asyncio.ensure_future(one.lost("the test ended its session"))
        await asyncio.sleep(0.2)
        assert not losing.done(), "the session's end did not wait for its pop"
        proxy.thaw()
        await losing
        assert one.tasks[0].done()
        assert not one.consumer.sent, "a job went to a worker that is gone"
        return direct.lrange(SHARED, 0, -1)

    assert asyncio.run(go()) == [raw]
    assert not leftovers(direct)


def test_what_a_pop_took_beside_others_goes_back_in_its_order(direct, proxy, through) -> None:
    """The pump's non-blocking pop takes several jobs from the worker's own queue and its
    venue's at once, and the session ends while the reply is on its way: the venue's go
    back in the order they were in, for any worker; the worker's own stay in its hand (its
    queue is deleted when it deregisters: a put-back made it again, a review found), and
    its next session puts them back on its queue, in their order."""
    mine = [message(f"2.{i}") for i in range(2)]
    theirs = [message(f"3.{i}") for i in range(3)]
    was: dict[str, list[bytes]] = {}

    async def go() -> None:
        one = link(through, slots=8)
        await one.pop_redis.ping()  # its connection, made before the delay
        direct.lpush(OWN, *mine)
        direct.lpush(SHARED, *theirs)
        was[OWN], was[SHARED] = direct.lrange(OWN, 0, -1), direct.lrange(SHARED, 0, -1)
        proxy.delay_ms = 400  # each way: the pop lands, and its reply is long on its way
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: direct.llen(OWN) == 0 and direct.llen(SHARED) == 0, "the pop")
        await one.lost("the test ended its session")
        assert direct.lrange(SHARED, 0, -1) == was[SHARED]
        assert not direct.exists(OWN)
        assert sorted(leftovers(direct)) == sorted(mine), "the worker's own not kept for it"
        kept = direct.keys(f"frlm:worker:{WORKER}:hand:*")
        assert kept and all(0 < direct.ttl(key) <= pump.HAND_TTL_S for key in kept)
        assert 0 < direct.ttl(pump.hands_key(WORKER)) <= pump.HAND_TTL_S
        await pump.recover(one.redis, WORKER, "the-next-session", one.queues)

    asyncio.run(go())
    assert direct.lrange(OWN, 0, -1) == was[OWN]
    assert not direct.exists(results_stream("rpumptest0001"))
    assert not leftovers(direct)
    assert not direct.exists(pump.hands_key(WORKER))


def test_a_pop_whose_reply_was_lost_gives_its_jobs_to_the_worker_all_the_same(
    direct, proxy, through
) -> None:
    """The connection breaks while the pop's reply is on its way: Redis has taken the jobs
    off their queues, and the gateway never learns which. Before, they were on no queue
    and claimed by nobody, and each waited out its sub-query timeout (60 s by default);
    now the next pop, a second later, returns what the lost one took."""
    raws = [message(f"6.{i}") for i in range(3)]

    async def go() -> None:
        one = link(through, slots=4)
        await one.pop_redis.ping()
        await one.redis.ping()
        direct.lpush(SHARED, *raws)
        proxy.delay_ms = 400
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: direct.llen(SHARED) == 0, "Redis to pop the jobs")
        proxy.delay_ms = 0
        proxy.cut()  # the pop's reply is still on its way
        await until(lambda: len(sent_jobs(one)) == 3, "the jobs sent to the worker", timeout=8)
        one.tasks[0].cancel()

    asyncio.run(go())
    assert direct.llen(SHARED) == 0
    assert not leftovers(direct)


def test_jobs_a_killed_web_server_popped_and_never_claimed_go_to_the_workers_next_session(
    direct, proxy, through
) -> None:
    """The web server dies (kill -9: it runs no further line) after its pop took a job off
    the worker's own queue and before the round trip that names the worker its holder.
    Nobody claimed the job and no queue has it: the conductor, seeing the worker present
    again at once, waited out the job's sub-query timeout. The worker's next session now
    starts by putting back what its sessions before held unclaimed."""
    raw = message("7.1")
    frozen = DelayProxy(listen_host="127.0.0.1", target_port=proxy.target[1]).start()
    try:

        async def go() -> None:
            dead = link(through)
            # Its claims go through a path that stops carrying anything: the process is
            # gone between the pop and the claim.
            dead.redis = redis.asyncio.Redis.from_url(_via(through, frozen.port))
            dead._announce = _nothing  # presence is not under test (its worker is no row)
            await dead.start()
            frozen.freeze()
            direct.lpush(OWN, raw)
            await until(lambda: direct.llen(OWN) == 0, "the dead server's pop")
            await asyncio.sleep(0.3)  # its claims held on the frozen path
            for task in dead.tasks:
                task.cancel()  # and it runs nothing more: no lost(), no put-back
            assert not direct.exists(results_stream("rpumptest0001"))

            again = link(through)
            again._announce = _nothing
            await again.start()
            await until(lambda: sent_jobs(again) == ["7.1"], "the job on the next session")
            for task in again.tasks:
                task.cancel()

        asyncio.run(go())
    finally:
        frozen.stop()
    assert not leftovers(direct)


async def _nothing(*_args: Any) -> None:
    return None


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{port}"))


def test_emptying_a_hand_twice_puts_each_job_back_once(direct, proxy, through) -> None:
    """A session's hand is emptied at its end and again by the worker's next session (or
    after a reply lost on the way): the second finds nothing. Before, a put-back whose
    reply was lost was run again by the gateway's client, pushed its job twice, and two
    workers ran it (a review)."""
    raw = message("5.1")

    async def go() -> None:
        one = link(through)
        direct.lpush(SHARED, raw)
        assert await pump.take(one.pop_redis, one.hand, 1) == [(SHARED, raw)]
        await one.redis.ping()
        proxy.delay_ms = 400
        emptying = asyncio.ensure_future(one.pops.close())
        await until(lambda: direct.llen(SHARED) == 1, "the put-back to land")
        proxy.delay_ms = 0
        proxy.cut()  # its reply is still on the way
        await emptying  # its client rides out the cut: it runs the step again
        await one.pops.close()
        await pump.recover(one.redis, WORKER, "another", one.queues)

    asyncio.run(go())
    assert direct.lrange(SHARED, 0, -1) == [raw]
    assert not leftovers(direct)


def test_a_full_worker_takes_what_came_meanwhile_first_and_a_draining_one_takes_nothing(
    direct, proxy, through
) -> None:
    """The pump waits with a BLMOVE on each queue and keeps the other waiting when one
    brings a job. A job it then moves in while the worker is full waits in the hand, as in
    a work buffer, and is the first the pump takes once a slot frees; a worker that drains
    has them cancelled, and a job of the venue's queue stays there for a worker that has
    room (kept waiting, a BLMOVE took it into a draining worker's hand, a review)."""
    first, second, third = message("8.1"), message("8.2"), message("8.3")

    async def go() -> None:
        one = link(through, slots=1)
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: blocked_pops(direct) >= 2, "the pump's BLMOVEs")
        direct.lpush(OWN, first)
        await until(lambda: sent_jobs(one) == ["8.1"], "the first job sent")
        direct.lpush(SHARED, second)
        await until(lambda: direct.llen(SHARED) == 0, "the kept BLMOVE to take it")
        assert sent_jobs(one) == ["8.1"], "sent beyond the worker's room"
        one.held.clear()  # its result came: the slot is free
        one._update_room()
        await until(lambda: sent_jobs(one) == ["8.1", "8.2"], "the second job sent")
        one.held.clear()
        one._update_room()
        await until(lambda: blocked_pops(direct) >= 2, "the pump waiting again")
        one.draining = True
        one._update_room()
        await until(lambda: blocked_pops(direct) == 0, "the BLMOVEs cancelled")
        direct.lpush(SHARED, third)
        await asyncio.sleep(0.3)
        assert direct.lrange(SHARED, 0, -1) == [third], "a draining worker took a job"
        one.tasks[0].cancel()

    asyncio.run(go())
    assert not leftovers(direct)


def test_a_session_ended_while_it_starts_starts_no_pump(direct, proxy, through) -> None:
    """A newer connection of the worker ends this session while its start is still
    awaiting Redis (two hellos back to back, a review): before, the start went on,
    announced the worker just withdrawn and started a pump nobody would stop, which took
    jobs and put them back for ever."""

    async def go() -> None:
        one = link(through)
        announced: list[str] = []

        async def announce(_figures: Any) -> None:
            await one.lost("a newer connection of this worker took its place")
            announced.append("once")

        one._announce = announce
        await one.start()
        assert announced == ["once"] and not one.tasks, one.tasks
        direct.lpush(SHARED, message("9.1"))
        await asyncio.sleep(1.2)
        assert direct.llen(SHARED) == 1 and not sent_jobs(one)

    asyncio.run(go())
    assert not leftovers(direct)


def test_a_malformed_job_is_dropped_not_put_back_for_the_next_session(
    direct, proxy, through
) -> None:
    """A message that parses but lacks what the pump reads (here a job with no run id)
    broke the pump, whose session then ended; with the hand, that put the message back
    first in line for the next session, which broke the same way, and so on. It is
    dropped, said in the log, and the jobs after it go on."""
    no_run = {k: v for k, v in job("10.1", "rpumptest0001").items() if k != "run_id"}
    bad = job_message(no_run, task_id="bad", queue=SHARED, expires_s=60, argsrepr="(test)",
                      reply_to="", sender="test").encode()  # fmt: skip
    good = message("10.2")

    async def go() -> None:
        one = link(through)
        direct.lpush(SHARED, bad, good)
        one._update_room()
        one.tasks = [asyncio.ensure_future(one._pump())]
        await until(lambda: sent_jobs(one) == ["10.2"], "the good job sent")
        assert not one.tasks[0].done()
        one.tasks[0].cancel()

    asyncio.run(go())
    assert direct.llen(SHARED) == 0
    assert not leftovers(direct)


def test_a_silent_workers_socket_is_closed_by_the_watch_that_found_it(
    direct, proxy, through
) -> None:
    """The watch finds the worker silent, ends its session and closes its socket (4408).
    With the session's end a task of its own, the end cancelled the watch that asked for
    it before the close (a review): the socket stayed open on a session that served
    nothing."""

    async def go() -> None:
        one = link(through)
        one._announce = _nothing
        await one.start()
        one.heard = time.monotonic() - 3600
        await until(lambda: one.consumer.closed == 4408, "the socket closed", timeout=8)

    asyncio.run(go())


def test_a_hand_kept_for_the_next_session_lapses(direct, proxy, through) -> None:
    """What a session's end keeps (its own queue's jobs) is given a day to live: a list a
    BLMOVE made has none. (The step that keeps them named its TTL as text Lua could not
    read, and failed: a review.)"""

    async def go() -> None:
        one = link(through)
        key = one.hand.keys[0]
        direct.rpush(key, message("11.1"))  # as a BLMOVE leaves it: no TTL
        direct.sadd(pump.hands_key(WORKER), one.session)
        assert await pump.return_hand(
            one.redis, WORKER, one.session, one.queues, own_too=False
        ) == (0, 1)
        assert 0 < direct.ttl(key) <= pump.HAND_TTL_S
        assert 0 < direct.ttl(pump.hands_key(WORKER)) <= pump.HAND_TTL_S

    asyncio.run(go())


def test_a_session_end_that_fails_still_empties_its_hand_and_fails_no_caller(
    direct, proxy, through, monkeypatch
) -> None:
    """Redis fails the session's end past its ride-out (here its withdrawal from presence):
    the end is logged, its hand still emptied, and no caller fails. Before, every later
    caller got the end's error again, among them each newer connection of the worker,
    which then could not start (a review)."""
    raw = message("12.1")

    def away(*_args: Any) -> None:
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(gateway.services, "presence_withdraw", away)

    async def go() -> None:
        one = link(through)
        direct.lpush(SHARED, raw)
        assert await pump.take(one.pop_redis, one.hand, 1) == [(SHARED, raw)]
        await one.lost("the test ended its session")
        await one.lost("a newer connection of this worker took its place")

    asyncio.run(go())
    assert direct.lrange(SHARED, 0, -1) == [raw]
    assert not leftovers(direct)
