"""Who is alive: each long-running process (venue worker, conductor, recorder) refreshes
its entry in a sorted set of its group, scored by when the entry expires. A process killed
without warning drops out when its entry expires; no one has to notice the death."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
from django.conf import settings

from frlm_web.redis_client import within


def _members_key(group: str) -> str:
    return f"frlm:presence:{group}"


def _info_key(group: str) -> str:
    return f"frlm:presence:{group}:info"


def barred_key(group: str, name: str) -> str:
    """Set while the name may not announce itself (withdrawn with a bar: deregistered)."""
    return f"frlm:presence:{group}:barred:{name}"


# The entry is written only while no bar is set on the name (withdraw(bar_s=...)): one
# that beats after it was barred (a deregistered worker whose process has not heard yet)
# is not announced again. 1 when announced.
_ANNOUNCE_LUA = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


def announce(client: redis.Redis, group: str, name: str, info: dict[str, Any]) -> bool:
    """Refresh the name's entry for FRLM_VENUE_HEARTBEAT_TTL_S; False, and nothing written,
    while the name is barred."""
    expires = time.time() + settings.FRLM_VENUE_HEARTBEAT_TTL_S
    keys = [_members_key(group), _info_key(group), barred_key(group, name)]
    args = [expires, name, json.dumps({**info, "name": name})]
    return bool(client.eval(_ANNOUNCE_LUA, len(keys), *keys, *args))


def withdraw(client: redis.Redis, group: str, name: str, *, bar_s: float = 0) -> None:
    """Take the name's entry out; with `bar_s`, keep it out that long, whatever it
    announces meanwhile."""
    pipe = client.pipeline()
    pipe.zrem(_members_key(group), name)
    pipe.hdel(_info_key(group), name)
    if bar_s > 0:
        pipe.set(barred_key(group, name), "1", px=int(bar_s * 1000))
    pipe.execute()


def alive(client: redis.Redis, group: str) -> list[dict[str, Any]]:
    names = client.zrangebyscore(_members_key(group), time.time(), "+inf")
    if not names:
        return []
    return [json.loads(info) for info in client.hmget(_info_key(group), names) if info]


def entry(client: redis.Redis, group: str, name: str) -> tuple[float, dict[str, Any]] | None:
    """A member's entry: when it expires (or expired) and what it announced; None if absent."""
    pipe = client.pipeline()
    pipe.zscore(_members_key(group), name)
    pipe.hget(_info_key(group), name)
    score, info = pipe.execute()
    if score is None:
        return None
    return float(score), json.loads(info) if info else {}


WITHDRAW_WAIT_S = 2.0


class PresenceThread(threading.Thread):
    """Keeps one process's entry fresh until stopped."""

    def __init__(
        self, client: redis.Redis, group: str, name: str, info: dict[str, Any], every_s: float = 1.0
    ) -> None:
        super().__init__(name=f"frlm-presence-{group}", daemon=True)
        self.client = client
        self.group = group
        self.member = name
        self.info = {**info, "pid": os.getpid()}
        self.every_s = every_s
        self.stopping = threading.Event()

    def beat(self) -> None:
        try:
            announce(self.client, self.group, self.member, self.info)
        except redis.RedisError:
            pass  # Redis away for a moment: the next beat tries again.

    def run(self) -> None:
        while not self.stopping.is_set():
            self.beat()
            self.stopping.wait(self.every_s)

    def stop(self) -> None:
        """Stop beating and take the entry out, waiting WITHDRAW_WAIT_S at most: with Redis
        away the process's client rides the outage out for about a minute, and a conductor
        told to stop waited that out in its shutdown (the stack then killed it 15 s on).
        Not withdrawn, the entry lapses by itself."""
        self.stopping.set()
        within(WITHDRAW_WAIT_S, self._withdraw, "frlm-presence-withdraw")

    def _withdraw(self) -> None:
        try:
            withdraw(self.client, self.group, self.member)
        except redis.RedisError:
            pass


def from_environment(client: redis.Redis) -> PresenceThread | None:
    """The presence a Celery worker process was given by its management command."""
    group = os.environ.get("FRLM_PRESENCE_GROUP")
    if not group:
        return None
    name = os.environ.get("FRLM_PRESENCE_NAME", f"{group}-{os.getpid()}")
    info = json.loads(os.environ.get("FRLM_PRESENCE_INFO", "{}"))
    return PresenceThread(client, group, name, info)
