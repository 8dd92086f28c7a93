"""When a running sub-query counts as a straggler: its venue's latency quantile."""

from __future__ import annotations

from runs.engine.fanout.hedging import FLOOR_MS, MIN_SAMPLES, LatencyWindows
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


def test_it_counts_a_fragments_text_not_its_marker():
    ref = '{"path": "/c.txt", "chars": [0, 4000], "bytes": [0, 4000], "sha256": "' + "a" * 64 + '"}'
    prompt = "Summarise:\n" + MARKER_TEXT.format(ref)
    assert prompt_tokens(prompt) == (len("Summarise:\n") + 4000) // 4
    assert prompt_tokens("x" * 400) == 100
