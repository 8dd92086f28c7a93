"""Counters in Redis over a window that starts with the first hit: failed authentications
to the worker API per address, failed sign-ins per address and per username, heartbeats per
worker. When Redis is away nobody is held up: the check behind each counter still stands."""

from __future__ import annotations

import logging
import math

import redis

from frlm_web.redis_client import get_redis

log = logging.getLogger(__name__)


def _window(window_s: float) -> int:
    return max(1, math.ceil(window_s))


def hit(key: str, window_s: float) -> tuple[int, int] | None:
    """Count one against `key`: the count in its window and the seconds the window has
    left, or None when Redis is unreachable."""
    try:
        pipe = get_redis().pipeline()  # MULTI: the count never outlives its window
        pipe.set(key, 0, ex=_window(window_s), nx=True)
        pipe.incr(key)
        pipe.ttl(key)
        _, count, ttl = pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not count %s: %s", key, exc)
        return None
    return int(count), _left(ttl, window_s)


def wait(key: str, limit: int, window_s: float) -> int | None:
    """The seconds to wait when `key` was hit `limit` times in its window, else None."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.get(key)
        pipe.ttl(key)
        count, ttl = pipe.execute()
    except redis.RedisError:
        return None
    if int(count or 0) < limit:
        return None
    return _left(ttl, window_s)


def forget(key: str) -> None:
    try:
        get_redis().delete(key)
    except redis.RedisError:
        pass


def _left(ttl: int | None, window_s: float) -> int:
    return int(ttl) if ttl and ttl > 0 else _window(window_s)
