"""The one way every process gets its Redis client."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    # Connections are shared by threads; the pool grows with them.
    return redis.Redis.from_url(settings.REDIS_URL, health_check_interval=30)


def redis_available() -> bool:
    try:
        return bool(get_redis().ping())
    except redis.RedisError:
        return False
