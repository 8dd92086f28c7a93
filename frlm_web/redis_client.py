"""The one way every process gets its Redis client."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry


@functools.cache
def get_redis(*, ride_out: bool = True) -> redis.Redis:
    """The process's client; connections are shared by threads, the pool grows with them.

    `ride_out`: a command that meets a Redis restarting or a network blip is tried again
    on a new connection, waiting longer each time (RETRY_BACKOFF, about a minute in all),
    and the process's log says once that Redis went away and once that it is back. A
    command the server ran whose reply was lost is then run twice: a loop whose reads must
    not be repeated blindly (the recorder's and forwarder's consumer-group reads) takes a
    client without it and rides out the outage itself (Outage)."""
    options: dict = {"health_check_interval": 30, "socket_keepalive": True}
    if ride_out:
        options.update(retry=RidingRetry(settings.REDIS_URL), retry_on_error=list(OUTAGE_ERRORS))
    else:
        # Its loops block for a fraction of a second at most: a reply 30 s late is a
        # connection that died without a word (a network cut, not a refusal). No retry at
        # all, said outright: redis-py 8 gives a client made by from_url none, but one made
        # by Redis() ten, the blind repeat this client is for avoiding.
        options.update(socket_timeout=30, retry=Retry(NoBackoff(), 0))
    return redis.Redis.from_url(settings.REDIS_URL, **options)


def within(seconds: float, step: Callable[[], None], name: str) -> bool:
    """Run `step` on a daemon thread and wait for it at most `seconds`: False if it is
    still running then (left to the process's exit). A stopping process's last calls go
    through it, so a Redis (or server) that does not answer, which `get_redis()`'s client
    would ride out for about a minute, cannot hold the exit."""
    thread = threading.Thread(target=step, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


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
    """Whether Redis answers now: one try, no riding out (a command's check before it makes
    anything; the riding client retried for a while and logged the outage over the
    command's own one-line answer)."""
    client = get_redis(ride_out=False)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


# What a Redis that restarts or a network that blips raises: refused or reset
# connections, a server still loading its AOF (BusyLoadingError is a ConnectionError),
# a read that timed out. Anything else is a bug or a refusal and is not ridden out.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)


class Outage:
    """One long-lived loop's view of Redis going away and coming back.

    `lost(exc)` is called on each failed attempt: the first logs one line and each returns
    the delay before the next attempt (doubling from first_s up to max_s, so a Redis that
    stays down costs two tries a second, never a tight loop, and one that is back is found
    within half a second). `back()` is called after
    a successful attempt: it logs one line, with how long Redis was away, if it was."""

    def __init__(
        self, log: logging.Logger, what: str, *, first_s: float = 0.1, max_s: float = 0.5
    ) -> None:
        self.log = log
        self.what = what
        self.first_s = first_s
        self.max_s = max_s
        self.since: float | None = None
        self.delay = first_s
        self.tries = 0

    @property
    def away(self) -> bool:
        return self.since is not None

    def lost(self, exc: BaseException) -> float:
        if self.since is None:
            self.since = time.monotonic()
            self.delay = self.first_s
            self.log.warning(
                "%s: lost Redis (%s); reconnecting with backoff", self.what, _one_line(exc)
            )
        else:
            self.delay = min(self.max_s, self.delay * 2)
        self.tries += 1
        return self.delay

    def back(self) -> None:
        if self.since is None:
            return
        self.log.warning(
            "%s: Redis is back after %.1f s (%d attempt(s)); resuming",
            self.what,
            time.monotonic() - self.since,
            self.tries,
        )
        self.since = None
        self.tries = 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


RETRY_ATTEMPTS = 60
RETRY_BACKOFF = (0.05, 1.0)  # the first wait doubles up to the cap: about 55 s in all


class RidingRetry(Retry):
    """redis-py's retry of a command over a new connection, which also says in the log,
    once per outage and for the whole process, that Redis went away and that it is back.

    A Redis that restarts answers some commands (PUBLISH, AUTH, INFO) while it is still
    loading its data and refuses the rest with LOADING, so a command going through proves
    nothing: while away, each success is confirmed by a PING of its own, which the server
    refuses until it has loaded (so an outage costs a PING per command, and only then)."""

    _outage = Outage(logging.getLogger("frlm_web.redis"), "redis client")
    _lock = threading.Lock()

    def __init__(self, url: str) -> None:
        base, cap = RETRY_BACKOFF
        super().__init__(ExponentialBackoff(cap=cap, base=base), RETRY_ATTEMPTS, OUTAGE_ERRORS)
        self.url = url
        self._probe: redis.Redis | None = None

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        def failed(error: Exception, *more: Any) -> Any:
            with self._lock:
                self._outage.lost(error)
            return fail(error, *more)

        result = super().call_with_retry(do, failed, *args, **kwargs)
        if self._outage.away:
            self._confirm_back()
        return result

    def _confirm_back(self) -> None:
        with self._lock:
            if self._probe is None:
                # Its own client, not retried: one PING, one answer.
                self._probe = redis.Redis.from_url(
                    self.url, retry=Retry(NoBackoff(), 0), socket_timeout=2
                )
        try:
            self._probe.ping()
        except redis.RedisError:
            return
        with self._lock:
            self._outage.back()
