"""When to hedge a straggler: the latency a venue's sub-queries have taken in this run, and
the quantile past which one still running counts as straggling (policy.hedge)."""

from __future__ import annotations

import math
from collections import deque

# Replies per venue the quantile is taken over: recent enough to follow a venue that slows.
WINDOW = 256
# Fewer replies than this say too little about a venue to call anything a straggler.
MIN_SAMPLES = 8
QUANTILES = {"p90": 0.90, "p95": 0.95, "p99": 0.99}
# No sub-query straggles in less than this: a twin costs a dispatch and a reply read, and a
# venue answering in a few ms (a cassette replay, a cache) would otherwise hedge every
# scheduling hiccup of a loaded machine. A model's tail is far longer than this.
FLOOR_MS = 100.0


class LatencyWindows:
    """The latest WINDOW reply times (dispatch to reply, in ms) per venue."""

    def __init__(self, hedge: str) -> None:
        self.quantile = QUANTILES.get(hedge)  # None: hedging is off
        self._samples: dict[str, deque[float]] = {}
        self._cache: dict[str, float | None] = {}

    def add(self, venue: str, ms: float) -> None:
        self._samples.setdefault(venue, deque(maxlen=WINDOW)).append(ms)
        self._cache.pop(venue, None)

    def threshold_ms(self, venue: str) -> float | None:
        """The venue's latency quantile (at least FLOOR_MS), or None while hedging is off or
        samples are few."""
        if self.quantile is None:
            return None
        if venue not in self._cache:
            samples = sorted(self._samples.get(venue, ()))
            if len(samples) < MIN_SAMPLES:
                return None
            # Nearest rank: the smallest sample at or above the quantile.
            rank = max(0, math.ceil(self.quantile * len(samples)) - 1)
            self._cache[venue] = max(samples[rank], FLOOR_MS)
        return self._cache[venue]
