"""The gateway's asyncio Redis client packs its commands with hiredis (server.PackedConnection):
the bytes on the wire are those redis-py's own packer writes, and a real Redis answers them."""

from __future__ import annotations

import asyncio

import pytest
import redis
from django.conf import settings

from workers.gateway.aredis import PackedConnection, async_redis

COMMANDS = [
    ("SET", "k", "v"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "x"),
    ("XADD", "s", "*", "f", "naïve ☃", "n", 7, "x", 2.5, "b", b"\x00\xff"),
    ("EVAL", "return 1", 2, "a", "b", -3, 1e-07),
    ("BRPOP", "q1", "q2", 0.5),
    ("SET", "big", "x" * 100_000),
    ("SET", "view", memoryview(b"bytes")),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[str(c[0]) for c in COMMANDS])
def test_it_packs_as_redis_py_does(command: tuple) -> None:
    packed = PackedConnection()
    python = redis.asyncio.Connection()
    assert b"".join(packed.pack_command(*command)) == b"".join(python.pack_command(*command))


def test_it_refuses_what_redis_py_refuses() -> None:
    with pytest.raises(redis.DataError):
        PackedConnection().pack_command("SET", "k", True)


@pytest.mark.usefixtures("stack")
def test_a_real_redis_answers_its_pipelines() -> None:
    async def go() -> list:
        client = async_redis()
        connection = await client.connection_pool.get_connection()
        assert isinstance(connection, PackedConnection)
        await client.connection_pool.release(connection)
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("frlm:test:packed", "naïve ☃" * 1000)
            pipe.get("frlm:test:packed")
            pipe.delete("frlm:test:packed")
            return await pipe.execute()

    assert settings.REDIS_URL
    done = asyncio.run(go())
    assert done[1].decode() == "naïve ☃" * 1000
