"""The recorder's lease on the trace store: a lock in Redis that makes it the one writer,
and the heartbeat that tells other processes a recorder is storing."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import redis

from frlm_web.redis_client import OUTAGE_ERRORS

log = logging.getLogger("traces.recorder")  # the name its log lines had before the split

LOCK_KEY = "frlm:recorder:lock"
HEARTBEAT_KEY = "frlm:recorder:alive"


class RecorderBusy(RuntimeError):
    pass


class Lease:
    """The lock and heartbeat of one recorder, held as "host:pid"."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.token = f"{socket.gethostname()}:{os.getpid()}"

    def acquire(self, ttl_s: int = 10) -> None:
        """Take the single-writer lock; a second recorder refuses to start. A lock left by
        a recorder of this machine that is dead (killed, crashed) is taken over at once."""
        if not self.client.set(LOCK_KEY, self.token, nx=True, ex=ttl_s):
            holder = self.client.get(LOCK_KEY)
            if _dead_here(holder) and self.client.delete(LOCK_KEY):
                self.client.set(LOCK_KEY, self.token, nx=True, ex=ttl_s)
                if self.client.get(LOCK_KEY) in (self.token, self.token.encode()):
                    log.warning("recorder: took over the lock of dead recorder %r", holder)
                    return
            raise RecorderBusy(
                f"another recorder holds the trace store ({holder!r}); stop it first, "
                f"or wait {ttl_s} s if it was killed"
            )

    def refresh(self, ttl_s: int = 10) -> None:
        """Extend the lock. One that lapsed while Redis was away (or that a Redis without
        persistence forgot) is taken again if nobody else took it meanwhile."""
        holder = self.client.get(LOCK_KEY)
        if holder is None and self.client.set(LOCK_KEY, self.token, nx=True, ex=ttl_s):
            holder = self.token
        if holder not in (self.token, self.token.encode()):
            raise RecorderBusy("lost the recorder lock; another recorder took over")
        pipe = self.client.pipeline()
        pipe.expire(LOCK_KEY, ttl_s)
        pipe.set(HEARTBEAT_KEY, self.token, ex=ttl_s)
        pipe.execute()

    def release(self) -> None:
        try:
            if self.client.get(LOCK_KEY) in (self.token, self.token.encode()):
                self.client.delete(LOCK_KEY)
            self.client.delete(HEARTBEAT_KEY)
        except OUTAGE_ERRORS:
            log.warning("recorder: Redis is away; its lock lapses by itself")


def _dead_here(holder: Any) -> bool:
    """Whether a lock holder ("host:pid") is a process of this machine that no longer runs."""
    if isinstance(holder, bytes):
        holder = holder.decode("utf-8", "replace")
    host, _, pid = str(holder or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
