"""The one way every process gets its Redis client."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    # Connections are shared by threads; the pool grows with them.
    return redis.Redis.from_url(settings.REDIS_URL, health_check_interval=30)


class LuaScript:
    """A Lua script run with EVAL, alone or queued on a pipeline.

    redis-py's registered scripts run EVALSHA, and a pipeline holding one first asks the
    server SCRIPT EXISTS, in a round trip of its own, every time it executes: a worker
    paid it twice per sub-query. EVAL sends the body (a few hundred bytes) instead, which
    the server looks up compiled by its hash; one round trip, and nothing to reload after
    a restart flushed the script cache."""

    def __init__(self, body: str) -> None:
        self.body = body

    def __call__(
        self, *, keys: list[str], args: list, client: redis.Redis | redis.client.Pipeline
    ) -> object:
        return client.eval(self.body, len(keys), *keys, *args)


def redis_available() -> bool:
    try:
        return bool(get_redis().ping())
    except redis.RedisError:
        return False
