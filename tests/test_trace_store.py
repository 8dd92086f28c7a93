"""The emitter, the recorder and the store, against a real Redis (its own database number,
so the stack's recorder does not compete) and real Parquet files."""

from __future__ import annotations

import json

import pytest
import redis

from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM, Emitter
from traces.recorder import GROUP, Recorder, RecorderBusy, _decode, _write_segment


@pytest.fixture
def client(stack, settings, tmp_path):
    settings.FRLM_TRACE_DIR = tmp_path / "traces"
    url = stack.redis_url.rsplit("/", 1)[0] + "/5"
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    yield conn
    conn.flushdb()


def test_it_stores_spans_in_stream_order_with_payloads(client):
    emitter = Emitter(client, "rA", venue="conductor")
    with emitter.span("Run.Init", question="q") as run:
        emitter.instant("Env.LoadFragment", parent=run.span_id, chars=10)
        decode = emitter.start("Run.Decode", parent=run.span_id, turn=1)
        decode.end(payload="the reply", tokens_in=5, tokens_out=7, cost=0.01)
    recorder = Recorder(client)
    recorder.ensure_group()
    assert recorder.step() == 5

    events = store.read_events("rA")
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert [(e["name"], e["phase"]) for e in events] == [
        ("Run.Init", "start"),
        ("Env.LoadFragment", "instant"),
        ("Run.Decode", "start"),
        ("Run.Decode", "end"),
        ("Run.Init", "end"),
    ]
    end = events[3]
    assert (end["tokens_in"], end["tokens_out"], end["cost"]) == (5, 7, 0.01)
    assert blobs.blob_get(end["payload_ref"]) == "the reply"
    assert "_payload" not in end["attrs"]
    assert client.xlen(EVENTS_STREAM) == 0  # acknowledged and removed once stored


def test_it_builds_the_span_tree(client):
    emitter = Emitter(client, "rT")
    with emitter.span("Run.Init") as run:
        with emitter.span("Repl.Exec", parent=run.span_id):
            emitter.instant("SubQuery.Timeout", parent=run.span_id, status="timeout")
        emitter.start("SubQuery.Submit", parent=run.span_id)  # still open
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()
    (root,) = store.span_tree("rT")
    assert root.name == "Run.Init" and not root.open
    assert [c.name for c in root.children] == ["Repl.Exec", "SubQuery.Submit"]
    assert root.children[1].open
    assert [i["name"] for i in root.instants] == ["SubQuery.Timeout"]
    text = store.format_span_tree([root])
    assert "SubQuery.Submit open" in text


def test_it_dead_letters_bad_events_and_goes_on(client):
    recorder = Recorder(client)
    recorder.ensure_group()
    client.xadd(EVENTS_STREAM, {"seq": 1, "e": "{not json"})
    client.xadd(EVENTS_STREAM, {"seq": 2, "e": json.dumps({"run_id": "rB", "name": "Nope"})})
    Emitter(client, "rB").instant("Run.Done")
    assert recorder.step() == 1

    dead = client.xrange(DEAD_LETTER_STREAM)
    assert len(dead) == 2
    assert b"not JSON" in dead[0][1][b"reason"]
    assert b"'Nope' is not in the taxonomy" in dead[1][1][b"reason"]
    assert [e["name"] for e in store.read_events("rB")] == ["Run.Done"]


def test_it_stores_nothing_twice_after_dying_between_write_and_ack(client):
    emitter = Emitter(client, "rC")
    for i in range(10):
        emitter.instant("Worker.Heartbeat", n=i)
    recorder = Recorder(client)
    recorder.ensure_group()
    # Read and write a segment, then "die" before acknowledging.
    entries = client.xreadgroup(GROUP, "recorder", {EVENTS_STREAM: ">"}, count=6)[0][1]
    events = [_decode(fields)[0] for _, fields in entries]
    _write_segment("rC", events, first_id="crash")

    restarted = Recorder(client)
    assert restarted.recover() == 0  # the six are recognised as stored
    assert restarted.step() == 4
    seqs = [e["seq"] for e in store.read_events("rC")]
    assert seqs == list(range(1, 11))


def test_it_refuses_a_second_recorder(client):
    first = Recorder(client)
    first.acquire()
    with pytest.raises(RecorderBusy, match="another recorder"):
        Recorder(client).acquire()
    first.release()
    Recorder(client).acquire()


def test_it_rejects_a_run_id_that_is_not_one():
    with pytest.raises(ValueError, match="not a run id"):
        store.run_dir("../../etc")
