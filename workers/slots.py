"""A worker process's sub-query slots and their tally.

A broker worker runs at most its registered concurrency of jobs at once, whether they came
one per Celery message or several in one (a bundle, workers/wire.py): each job holds a slot
while it runs (`Slots.hold`), and a bundle's jobs beyond the first run on the slots' own
threads. The tally (also the gateway agent's) is what each heartbeat reports: jobs running,
the median of the recent ones' times, memory."""

from __future__ import annotations

import collections
import os
import resource
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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

    def end(self, key: str) -> None:
        with self.lock:
            began = self.started.pop(key, None)
            if began is None:
                return
            self.inflight = max(0, self.inflight - 1)
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
    def __init__(self, size: int) -> None:
        self.size = size
        self.free = threading.BoundedSemaphore(size)
        self.tally = Tally()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Run one job in a slot, waiting for one to free, and count it while it runs."""
        with self.free:
            self.tally.begin(key)
            try:
                yield
            finally:
                self.tally.end(key)

    def pool(self) -> ThreadPoolExecutor:
        """Threads for a bundle's jobs beyond the first (the first runs in the Celery pool's
        thread that took the bundle)."""
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
