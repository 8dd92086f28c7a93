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


def _members_key(group: str) -> str:
    return f"frlm:presence:{group}"


def _info_key(group: str) -> str:
    return f"frlm:presence:{group}:info"


def announce(client: redis.Redis, group: str, name: str, info: dict[str, Any]) -> None:
    expires = time.time() + settings.FRLM_VENUE_HEARTBEAT_TTL_S
    pipe = client.pipeline()
    pipe.zadd(_members_key(group), {name: expires})
    pipe.hset(_info_key(group), name, json.dumps({**info, "name": name}))
    pipe.execute()


def withdraw(client: redis.Redis, group: str, name: str) -> None:
    pipe = client.pipeline()
    pipe.zrem(_members_key(group), name)
    pipe.hdel(_info_key(group), name)
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
        self.stopping.set()
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
