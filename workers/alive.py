"""A broker worker's death known from its connection, not from a heartbeat's TTL.

Each broker worker process holds one Redis connection subscribed to its own channel
`frlm:alive:<worker id>` for as long as it lives. The kernel closes that connection the
moment the process dies, however it dies (kill -9 included), and Redis drops the
subscription with it; `PUBSUB NUMSUB` on the channel then answers 0. A conductor holding
work of that worker asks once per collect round (a fraction of a millisecond, one round
trip for all its workers) and sends the work elsewhere at once. NUMSUB needs no admin
rights (CLIENT LIST would: `@admin @dangerous`, which no role but admin has, see
frlm_web/redis_acl.py); the worker's role may subscribe to its channels, never publish."""

from __future__ import annotations

import logging
import threading

import redis

log = logging.getLogger(__name__)

CHANNEL_PREFIX = "frlm:alive:"
# Set in a worker process whose line is up: its jobs' "started" say it can be watched.
ALIVE_ENV = "FRLM_WORKER_ALIVE"


def channel(worker_id: str) -> str:
    return f"{CHANNEL_PREFIX}{worker_id}"


def connected(client: redis.Redis, worker_ids: list[str]) -> set[str]:
    """Those of `worker_ids` whose alive line is up now."""
    if not worker_ids:
        return set()
    counts = client.pubsub_numsub(*[channel(wid) for wid in worker_ids])
    up = set()
    for name, count in counts:
        name = name.decode() if isinstance(name, bytes) else name
        if count:
            up.add(name.removeprefix(CHANNEL_PREFIX))
    return up


class AliveLine(threading.Thread):
    """Holds this process's subscription until the process ends. Reading it keeps the
    connection serviced; redis-py subscribes again by itself after a reconnect."""

    def __init__(self, client: redis.Redis, worker_id: str) -> None:
        super().__init__(name="frlm-alive-line", daemon=True)
        # Held for the line's life: a redis-py client that made its own pool closes the
        # pool's connections, the subscribed one included, when it is collected (seen: a
        # caller's temporary client dropped the line just after it was confirmed, and
        # redis-py quietly subscribed again a few milliseconds later).
        self.client = client
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(channel(worker_id))
        # The confirmation, or the refusal raised (a role without the channel).
        reply = self.pubsub.get_message(timeout=5.0)
        if not reply or reply.get("type") != "subscribe":
            self.pubsub.close()
            raise redis.ConnectionError(f"no confirmation of the subscription: {reply!r}")
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self.pubsub.get_message(timeout=1.0)
                except Exception as exc:
                    # Redis restarted, or the client's socket went bad: redis-py connects and
                    # subscribes again at the next read. Only this process's end ends the line.
                    log.warning("the alive line dropped (%s); reconnecting", exc)
                    self.stopping.wait(0.5)
        finally:
            # Closed by the thread that reads it, never under a read in progress.
            self.pubsub.close()

    def stop(self) -> None:
        """Unsubscribed within a second (a process that ends closes it anyway)."""
        self.stopping.set()
