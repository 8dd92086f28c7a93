"""The simulated device a worker process plays: its latency, stragglers, failures and lies,
set by `frlm_worker --sim-...` (a swarm gives each member its own) and carried to the task
in FRLM_SIM_PROFILE. The worker task hands every model spec to `on_device`, which leaves
any other model alone and gives a simulated one this device's profile."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from typing import Any

from workers.backends import ModelSpec

_STARTED = time.monotonic()


# A gate-aware liar (honest_first) takes a pause this long between the jobs it begins for
# the start of a new batch.
BATCH_PAUSE_S = 0.3
_OPENING = {"last": -float("inf"), "count": 0}  # the latest job begun; jobs since a pause
_OPENING_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _parsed(raw: str) -> dict[str, Any]:
    """FRLM_SIM_PROFILE's value, parsed once (it was parsed per job: 1.6% of a worker's CPU
    at 1 ms model latency). Callers copy it."""
    return json.loads(raw) if raw else {}


def device_profile() -> dict[str, Any]:
    """This worker's simulated device, for a job it begins now. A turncoat (lie_after_s)
    answers honestly until that many seconds after it started, then lies at its lie_rate:
    how a worker that has earned trust is caught when it goes bad. A liar that knows the
    check gate (honest_first) answers honestly the first jobs it begins after a pause of
    BATCH_PAUSE_S, a batch's first (so its first answer of the batch is honest, whichever
    comes back first), and lies on the others."""
    profile = dict(_parsed(os.environ.get("FRLM_SIM_PROFILE") or ""))
    lie_after = profile.pop("lie_after_s", None)
    if lie_after is not None and time.monotonic() - _STARTED < float(lie_after):
        profile["lie_rate"] = 0.0
    honest_first = int(profile.pop("honest_first", 0) or 0)
    if honest_first:
        with _OPENING_LOCK:
            now = time.monotonic()
            if now - float(_OPENING["last"]) >= BATCH_PAUSE_S:
                _OPENING["count"] = 0
            _OPENING["last"] = now
            _OPENING["count"] += 1
            opening = _OPENING["count"] <= honest_first
        if opening:
            profile["lie_rate"] = 0.0
    return profile


def on_device(spec: ModelSpec, *, attempt: int) -> ModelSpec:
    """`spec` as this worker runs it for the job's `attempt` (1 for the first): a simulated
    model gets the device's profile under the run's own sim fields, and the attempt, so a
    retry is an independent draw; any other model is returned as it is."""
    if spec.kind != "sim":
        return spec
    profile = {**device_profile(), **spec.sim, "attempt": attempt - 1}
    return ModelSpec(spec.kind, spec.model, spec.base_url, profile)
