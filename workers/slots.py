"""A worker process's sub-query slots and their tally.

A broker worker runs at most its registered concurrency of jobs at once, whether they came
one per Celery message, several in one (a bundle, workers/wire.py) or off its queues through
FRLM's own consumer (workers/consumer.py): each job holds a slot
while it runs (`Slots.enter` .. `Slots.leave`); a bundle's jobs take their slots in the
bundle's order and run on the slots' own threads. The tally (also the gateway agent's) is
what each heartbeat reports: jobs running, the median of the recent ones' times, memory."""

from __future__ import annotations

import collections
import itertools
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workers.services import Figures

LATENCY_WINDOW = 50  # sub-queries the reported latency is the median of
# Slots of a process whose runtime did not say how many it has (a Celery worker started
# without frlm_worker): Celery's own pool is then the only limit.
UNCONFIGURED = 64


def rss_mb() -> float:
    """This process's resident memory now (peak where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Tally:
    """Sub-queries running now and how long the recent ones took."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inflight = 0
        self.started: dict[str, float] = {}
        self.recent: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)

    def begin(self, key: str) -> None:
        with self.lock:
            self.inflight += 1
            self.started[key] = time.monotonic()

    def end(self, key: str, *, record: bool = True) -> None:
        with self.lock:
            began = self.started.pop(key, None)
            if began is None:
                return
            self.inflight = max(0, self.inflight - 1)
            if record:
                self.recent.append((time.monotonic() - began) * 1000)

    def figures(self, *, draining: bool) -> Figures:
        with self.lock:
            latency = statistics.median(self.recent) if self.recent else None
            return {
                "inflight": self.inflight,
                "memory_mb": round(rss_mb(), 1),
                "latency_ms": round(latency, 1) if latency is not None else None,
                "pid": os.getpid(),
                "draining": draining,
            }


class Slots:
    """At most `size` jobs run at once in this process. A job enters (waiting for a slot),
    runs on the slots' threads or in its own, and leaves; once the worker drains (SIGTERM),
    a job that has no slot yet is not run: like one Celery prefetched and never started,
    the conductor sends it elsewhere when the worker deregisters."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = threading.BoundedSemaphore(size)
        self.tally = Tally()
        self.draining = False
        self._tokens = itertools.count()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def enter(self) -> str | None:
        """Wait for a slot; its token, or None when the worker drains."""
        self.free.acquire()
        if self.draining:
            self.free.release()
            return None
        return self.begin()

    def take(self, most: int, timeout: float) -> int:
        """Hold up to `most` free slots, waiting at most `timeout` for the first; how many
        are held (0 when none freed or the worker drains). Each then starts a job
        (`begin`) or is given back (`give_back`): FRLM's own consumer takes off its queues
        only as many jobs as it holds slots for (workers/consumer.py)."""
        if most < 1 or not self.free.acquire(timeout=timeout):
            return 0
        held = 1
        while held < most and self.free.acquire(blocking=False):
            held += 1
        if self.draining:
            self.give_back(held)
            return 0
        return held

    def give_back(self, count: int) -> None:
        for _ in range(count):
            self.free.release()

    def begin(self) -> str:
        """A job starts in a slot already held (`take`): its token."""
        token = str(next(self._tokens))
        self.tally.begin(token)
        return token

    def leave(self, token: str, *, ran: bool) -> None:
        """The job is done; only one that called its model counts in the recent latency
        (one found cancelled as it started took no time worth reporting)."""
        self.tally.end(token, record=ran)
        self.free.release()

    def run(self, token: str, work: Callable[[], bool]) -> None:
        """Run a job's `work` (whether it called its model) in the slot `token` holds, then
        free it."""
        ran = False
        try:
            ran = work()
        finally:
            self.leave(token, ran=ran)

    def pool(self) -> ThreadPoolExecutor:
        """Threads for a bundle's jobs, each of which already holds its slot."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="frlm-slot")
            return self._pool


_current: Slots | None = None
_current_lock = threading.Lock()


def configure(size: int) -> Slots:
    """This process's slots: its registered concurrency (frlm_worker's runtime)."""
    global _current
    with _current_lock:
        _current = Slots(max(1, size))
        return _current


def current() -> Slots:
    global _current
    with _current_lock:
        if _current is None:
            _current = Slots(UNCONFIGURED)
        return _current
