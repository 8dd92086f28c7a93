"""When a running sub-query counts as a straggler: its venue's latency quantile."""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace

from runs.engine.fanout.hedging import (
    FLOOR_MS,
    MIN_SAMPLES,
    Hedger,
    LatencyWindows,
    time_to_end,
)
from runs.engine.fanout.state import Flight, Outcome, Wave
from workers.fragments import MARKER_TEXT, prompt_tokens


def test_it_says_nothing_until_a_venue_has_enough_replies():
    windows = LatencyWindows("p95")
    for ms in range(MIN_SAMPLES - 1):
        windows.add("edge", 100 + ms)
    assert windows.threshold_ms("edge") is None
    windows.add("edge", 100)
    assert windows.threshold_ms("edge") is not None
    assert windows.threshold_ms("local") is None


def test_it_takes_the_quantile_of_each_venue_by_nearest_rank():
    windows = LatencyWindows("p90")
    for ms in range(1, 101):
        windows.add("edge", float(ms) * 10)
        windows.add("dc", float(ms) * 2)
    assert windows.threshold_ms("edge") == 900.0
    assert windows.threshold_ms("dc") == 180.0
    windows.add("edge", 10_000.0)  # the newest reply counts at once
    assert windows.threshold_ms("edge") == 910.0


def test_a_venue_answering_in_a_few_ms_does_not_hedge_on_jitter():
    # A cassette replay answers in milliseconds: a hiccup of a loaded machine is not a
    # straggler worth a twin.
    windows = LatencyWindows("p95")
    for _ in range(50):
        windows.add("replayed", 4.0)
    assert windows.threshold_ms("replayed") == FLOOR_MS


def test_it_never_hedges_when_off():
    windows = LatencyWindows("off")
    for _ in range(50):
        windows.add("edge", 10.0)
    assert windows.threshold_ms("edge") is None


def test_a_workers_usual_time_is_its_median_once_it_has_two_replies():
    windows = LatencyWindows("p95")
    windows.add("edge", 1200.0, "w-slow")
    assert windows.worker_ms("w-slow") is None
    windows.add("edge", 1100.0, "w-slow")
    windows.add("edge", 5000.0, "w-slow")
    assert windows.worker_ms("w-slow") == 1200.0
    assert windows.worker_ms("w-other") is None


def test_the_job_expected_to_end_last_is_the_one_past_its_workers_usual_time_longest():
    assert time_to_end(10.0, 1200.0) == 1190.0  # a slow worker's job, just started
    assert time_to_end(150.0, 60.0) == 150.0  # a fast worker's, already past its usual
    assert time_to_end(150.0, None) == 150.0


def flight(index: int, worker: str, ran_ms: float) -> Flight:
    return Flight(
        Outcome(index),
        "q",
        sq_id=f"sq{index}",
        venue="edge",
        worker_id=worker,
        assigned=worker,
        started_at=time.time() - ran_ms / 1000 if ran_ms else 0.0,
    )


def hedger_over(samples: dict[str, list[float]]) -> Hedger:
    windows = LatencyWindows("p95")
    for worker, times in samples.items():
        for ms in times:
            windows.add("edge", ms, worker)
    noop = lambda *_: None  # noqa: E731
    return Hedger(
        scope=SimpleNamespace(book=None),
        emitter=None,
        latency=windows,
        abandon=noop,
        release=noop,
    )


def test_its_one_hedge_goes_to_the_slow_workers_job_not_a_fast_one_that_hiccuped():
    """Seen in CI on a loaded machine: a batch's few hedges went to fast workers' jobs that
    had run a little past the venue's p95 before the slow worker's job had, and the job that
    would end last went unhedged."""
    hedger = hedger_over({"w-fast": [60.0] * 40, "w-slow": [1200.0, 1200.0]})
    assert hedger.latency.threshold_ms("edge") == FLOOR_MS
    hiccup, slow, fresh = flight(0, "w-fast", 150), flight(1, "w-slow", 20), flight(2, "w-fast", 5)
    queued = flight(3, "w-slow", 0)
    wave = Wave(out={f.sq_id: f for f in (hiccup, slow, fresh, queued)}, backlog=deque())
    hedger.start(10)  # a batch of 10 hedges at most one
    hedger.hedge_stragglers(wave)
    assert [f.twin for f in wave.backlog] == [slow]
    hedger.start(40)  # of 40, four: the slow one's, the hiccup, the job queued behind it
    slow.twin = None
    wave.backlog.clear()
    hedger.hedge_stragglers(wave)
    assert [f.twin for f in wave.backlog] == [queued, hiccup, slow]  # each goes first


def test_it_hedges_nothing_while_fresh_work_waits():
    hedger = hedger_over({"w-fast": [60.0] * 40, "w-slow": [1200.0, 1200.0]})
    slow = flight(1, "w-slow", 500)
    fresh = flight(9, "w-fast", 0)
    wave = Wave(out={slow.sq_id: slow}, backlog=deque([fresh]))
    hedger.start(40)
    hedger.hedge_stragglers(wave)
    assert list(wave.backlog) == [fresh] and slow.twin is None


def test_it_counts_a_fragments_text_not_its_marker():
    ref = '{"path": "/c.txt", "chars": [0, 4000], "bytes": [0, 4000], "sha256": "' + "a" * 64 + '"}'
    prompt = "Summarise:\n" + MARKER_TEXT.format(ref)
    assert prompt_tokens(prompt) == (len("Summarise:\n") + 4000) // 4
    assert prompt_tokens("x" * 400) == 100
