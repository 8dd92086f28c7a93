"""The typed read functions the pages and commands share, on a hand-made trace."""

from __future__ import annotations

import time

import pytest
import redis

from traces import store
from traces.emitter import Emitter
from traces.recorder import Recorder


@pytest.fixture
def recorded(stack, settings, tmp_path):
    """A small run: two venues, three workers, one failure, one open span."""
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    client = redis.Redis.from_url(stack.redis_url.rsplit("/", 1)[0] + "/6")
    client.flushdb()
    conductor = Emitter(client, "rQ")
    run = conductor.start("Run.Init")
    plan = [
        ("local", "w1", 100.0, "ok"),
        ("local", "w1", 300.0, "ok"),
        ("edge", "w2", 200.0, "ok"),
        ("edge", "w3", 400.0, "error"),
    ]
    for venue, worker, ms, status in plan:
        submit = conductor.start("SubQuery.Submit", parent=run.span_id, venue=venue)
        execute = Emitter(client, "rQ", venue=venue, worker_id=worker).start(
            "SubQuery.Execute", parent=submit.span_id
        )
        execute.end(status, ms=ms, tokens_in=10, tokens_out=2, cost=0.001)
        submit.end(status)
    time.sleep(0.01)
    conductor.start("SubQuery.Submit", parent=run.span_id)  # still open
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()
    yield "rQ"
    client.flushdb()


def test_it_summarises_a_run(recorded):
    summary = store.run_summary(recorded)
    assert summary["subqueries"] == {"ok": 3, "error": 1}
    assert summary["open_spans"] == 2  # the run span and the last submit
    assert (summary["tokens_in"], summary["tokens_out"]) == (40, 8)
    assert summary["cost"] == pytest.approx(0.004)
    edge, local = summary["venues"]  # by name
    assert (local["venue"], local["subqueries"], local["errors"]) == ("local", 2, 0)
    assert local["p50_ms"] == pytest.approx(200.0)
    assert (edge["venue"], edge["errors"]) == ("edge", 1)


def test_it_gives_latency_and_errors_per_worker(recorded):
    figures = {w["worker_id"]: w for w in store.worker_figures(recorded)}
    assert figures["w1"]["calls"] == 2 and figures["w1"]["mean_ms"] == pytest.approx(200.0)
    assert figures["w3"]["errors"] == 1
    assert figures["w2"]["venue"] == "edge"


def test_it_bins_events_by_name_and_by_worker(recorded):
    by_name = store.binned(recorded, bin_ms=1000, by="name")
    counts = {row["key"]: row["events"] for row in by_name}
    assert counts["SubQuery.Execute"] == 8 and counts["SubQuery.Submit"] == 9
    by_worker = {row["key"]: row for row in store.binned(recorded, bin_ms=1000, by="worker")}
    assert by_worker["w3"]["errors"] == 1
    with pytest.raises(ValueError, match="by must be"):
        store.binned(recorded, by="colour")


def test_it_reads_events_after_a_seq_for_catch_up(recorded):
    tail = store.read_events(recorded, after_seq=15)
    assert [e["seq"] for e in tail] == [16, 17, 18]


def test_it_answers_empty_for_a_run_with_no_events(stack):
    assert store.run_summary("r-none")["events"] == 0
    assert store.read_events("r-none") == []


def test_a_cancelled_execution_is_not_a_workers_error(stack, settings, tmp_path):
    """The venues page showed a worker with "errors 20%" for a hedge's loser it was told to
    drop (a review): cancelled work is the conductor's choice, not the worker's failure;
    work it lost (abandoned) is. The venues page's history counted it as one (a review)."""
    from traces.selectors import worker_activity, worker_history

    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    client = redis.Redis.from_url(stack.redis_url.rsplit("/", 1)[0] + "/6")
    client.flushdb()
    conductor = Emitter(client, "rC")
    run = conductor.start("Run.Init")
    for status in ("ok", "ok", "cancelled", "abandoned"):
        submit = conductor.start("SubQuery.Submit", parent=run.span_id, venue="edge")
        Emitter(client, "rC", venue="edge", worker_id="w2").start(
            "SubQuery.Execute", parent=submit.span_id
        ).end(status, ms=10.0)
        submit.end("ok")
    run.end()
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()
    try:
        activity = worker_activity(["rC"], [])
        assert (activity["w2"]["calls"], activity["w2"]["errors"]) == (4, 1)
        history = worker_history(["rC"], bucket_s=3600)
        assert sum(row["calls"] for row in history) == 4
        assert sum(row["errors"] for row in history) == 1
    finally:
        client.flushdb()


def test_a_runs_workers_are_kept_beside_it_until_another_segment_comes(stack, settings, tmp_path):
    """The run page names the run's workers from a file beside its segments; an event
    stored later (a worker that ended after the run) makes that file stale."""
    from traces.selectors import WORKERS_CACHE, run_worker_ids

    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    client = redis.Redis.from_url(stack.redis_url.rsplit("/", 1)[0] + "/6")
    client.flushdb()
    recorder = Recorder(client)
    recorder.ensure_group()
    conductor = Emitter(client, "rW")
    run = conductor.start("Run.Init")
    submit = conductor.start("SubQuery.Submit", parent=run.span_id, venue="edge")
    Emitter(client, "rW", venue="edge", worker_id="w-b").instant("Env.LoadFragment")
    Emitter(client, "rW", venue="edge", worker_id="w-a").instant("Env.LoadFragment")
    recorder.step()
    try:
        assert run_worker_ids("rW") == ["w-a", "w-b"]
        cache = store.run_dir("rW") / WORKERS_CACHE
        assert cache.exists()
        cache.write_bytes(cache.read_bytes().replace(b'"w-a"', b'"w-kept"'))
        assert run_worker_ids("rW") == ["w-kept", "w-b"]  # read from the file
        Emitter(client, "rW", venue="edge", worker_id="w-c").instant("Env.LoadFragment")
        submit.end("ok")
        recorder.step()
        assert run_worker_ids("rW") == ["w-a", "w-b", "w-c"]
    finally:
        client.flushdb()


def test_a_workers_recent_sub_queries_show_what_each_attempt_was_paid(stack, settings, tmp_path):
    """Paid is the attempt's receipt's: two attempts of one sub-query on one worker (a
    retry, a job handed back) showed the one receipt twice (a review); a receipt whose
    amount is not a number (an imported trace) is shown as none, not a failed page."""
    from traces.selectors import recent_executions

    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    client = redis.Redis.from_url(stack.redis_url.rsplit("/", 1)[0] + "/6")
    client.flushdb()
    conductor = Emitter(client, "rP")
    worker = Emitter(client, "rP", venue="edge", worker_id="w3")
    run = conductor.start("Run.Init")
    submit = conductor.start("SubQuery.Submit", parent=run.span_id, venue="edge")
    for attempt, status in (("4.1", "abandoned"), ("4.2", "ok")):
        worker.start("SubQuery.Execute", parent=submit.span_id, sq_id=attempt).end(
            status, ms=10.0, cost=0.001
        )
    receipt = {"worker": "w3", "attempt": "4.2", "paid": "0.0003"}
    conductor.instant(
        "Receipt.Emit", parent=submit.span_id, worker_id="w3", attrs={"receipt": receipt}
    )
    other = conductor.start("SubQuery.Submit", parent=run.span_id, venue="edge")
    worker.start("SubQuery.Execute", parent=other.span_id, sq_id="5.1").end("ok", ms=1.0)
    bad = {**receipt, "attempt": "5.1", "paid": "a lot"}
    conductor.instant("Receipt.Emit", parent=other.span_id, worker_id="w3", attrs={"receipt": bad})
    submit.end("ok")
    other.end("ok")
    run.end()
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()
    try:
        rows = recent_executions(["rP"])["w3"]
        paid = sorted((row["status"], -1.0 if row["paid"] is None else float(row["paid"]))
                      for row in rows)  # fmt: skip
        assert paid == [("abandoned", -1.0), ("ok", -1.0), ("ok", 0.0003)], paid
    finally:
        client.flushdb()
