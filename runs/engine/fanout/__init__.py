"""The fanout of a run's sub-queries (see core.py for the life of a batch)."""

from __future__ import annotations

from runs.engine.fanout.core import Fanout
from runs.engine.fanout.liveness import NO_VENUE
from runs.engine.fanout.state import CALL_TIERS, FanoutAbort, LimitExceeded, Outcome, Totals

__all__ = ["CALL_TIERS", "NO_VENUE", "Fanout", "FanoutAbort", "LimitExceeded", "Outcome", "Totals"]
