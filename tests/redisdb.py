"""The `client` fixture of tests that run the emitter and a recorder of their own: a real
Redis, in a database of its own (5) so the stack's recorder does not compete, and a trace
folder of the test's."""

from __future__ import annotations

import pytest
import redis


@pytest.fixture(name="client")
def private_redis(stack, settings, tmp_path):
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    url = stack.redis_url.rsplit("/", 1)[0] + "/5"
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    yield conn
    conn.flushdb()
