"""The gateway's asyncio Redis client (workers/gateway/server.py): one per event loop, its
commands packed by hiredis, riding out outages as the process's other client does."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import HiredisRespSerializer

from frlm_web.redis_client import OUTAGE_ERRORS, RETRY_ATTEMPTS, RETRY_BACKOFF


class PackedConnection(aioredis.Connection):
    """redis-py's asyncio connection, with its commands packed by hiredis in C as its
    blocking one does: the asyncio one packs every argument in Python, 19% of the web
    process's gateway CPU (bench/federation.py --profile-web), each relayed result being
    a pipeline of long commands."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)


@functools.cache
def _async_redis(loop_id: int, ride_out: bool, url: str) -> aioredis.Redis:
    options: dict[str, Any] = {"connection_class": PackedConnection}
    if ride_out:
        # A Redis restart or a network blip is ridden out command by command, as by the
        # process's other client (frlm_web.redis_client.get_redis).
        base, cap = RETRY_BACKOFF
        retry = AsyncRetry(ExponentialBackoff(cap=cap, base=base), RETRY_ATTEMPTS)
        options.update(retry=retry, retry_on_error=list(OUTAGE_ERRORS))
    else:
        # Run once, as the blocking client with ride_out=False: the pump's pops
        # (workers/gateway/pump.py), whose caller pauses and tries again instead; a pop
        # the server ran whose reply was lost left its jobs in the session's hand, which
        # the next pop returns first.
        options.update(retry=AsyncRetry(NoBackoff(), 0), socket_timeout=30)
    return aioredis.Redis.from_url(url, **options)


def async_redis(*, ride_out: bool = True) -> aioredis.Redis:
    """One asyncio client (and pool) per event loop and kind: daphne runs one loop."""
    return _async_redis(id(asyncio.get_running_loop()), ride_out, settings.REDIS_URL)
