"""Python's cycle collector in FRLM's long-running processes (web server, conductor, workers,
recorder, forwarder, simulated model server).

Each such process holds Django, the model client and their libraries: some 130,000 objects
that live as long as it does. A full collection walks all of them, 60-100 ms on this
machine, with the interpreter stopped: every slot of a worker waits, its sub-queries end
that much late, and a fanout's wave waits for its last one (bench/fanout.py). Once the
process has loaded what it runs on, `settle` moves what is alive into the permanent
generation, which no collection walks again; what a job allocates is collected as before.
FRLM_GC_FREEZE=0 leaves the collector as Python sets it, to measure the difference."""

from __future__ import annotations

import gc

from django.conf import settings


def settle(*, threshold: int | None = None) -> None:
    """Freeze what the process has loaded so far (gc.freeze, after a full collection so no
    garbage is frozen with it). `threshold` raises the youngest generation's: for a process
    that makes many short-lived containers per step (the recorder's stream replies)."""
    if not settings.FRLM_GC_FREEZE:
        return
    gc.collect()
    gc.freeze()
    if threshold is not None:
        gc.set_threshold(threshold, *gc.get_threshold()[1:])
