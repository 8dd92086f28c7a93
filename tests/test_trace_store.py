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


def test_it_dead_letters_bad_events_of_a_big_batch_and_stores_the_rest(client):
    emitter = Emitter(client, "rD")
    good = [emitter.build("Worker.Heartbeat", "instant", attrs={"n": i}) for i in range(300)]
    good[7] = emitter.build("Run.Decode", "end", payload="a reply", tokens_in=3, cost=0.5)
    base = emitter.build("Worker.Heartbeat", "instant")
    bad = {
        "b-ts": ({**base, "event_id": "b-ts", "ts": "12"}, "ts must be nanoseconds"),
        "b-depth": ({**base, "event_id": "b-depth", "depth": 1.5}, "depth must be an integer"),
        "b-tokens": ({**base, "event_id": "b-tokens", "tokens_in": True}, "tokens_in must be"),
        "b-parent": ({**base, "event_id": "b-parent", "parent_id": 7}, "parent_id must be"),
        "b-links": ({**base, "event_id": "b-links", "links": ["a", 2]}, "links must be"),
        "b-payload": (
            {**base, "event_id": "b-payload", "attrs": {"_payload": "x"}},
            "needs payload_ref",
        ),
        "b-name": ({**base, "event_id": "b-name", "name": "Nope"}, "not in the taxonomy"),
    }
    emitter.send(good[:150] + [event for event, _ in bad.values()] + good[150:])
    recorder = Recorder(client)
    recorder.ensure_group()

    assert recorder.step() == 300

    reasons = {
        json.loads(fields[b"event"])["event_id"]: fields[b"reason"].decode()
        for _, fields in client.xrange(DEAD_LETTER_STREAM)
    }
    assert set(reasons) == set(bad)
    for event_id, (_, expected) in bad.items():
        assert expected in reasons[event_id]
    stored = store.read_events("rD")
    assert [e["event_id"] for e in stored] == [e["event_id"] for e in good]
    assert [e["seq"] for e in stored] == [*range(1, 151), *range(158, 308)]
    decode = stored[7]
    assert (decode["tokens_in"], decode["cost"], decode["attrs"]) == (3, 0.5, {})
    assert blobs.blob_get(decode["payload_ref"]) == "a reply"


def test_it_stores_the_same_rows_whether_a_batch_is_parsed_at_once_or_event_by_event(client):
    from traces.recorder import _decode_batch, _decode_slowly

    emitter = Emitter(client, "rP", venue="edge", worker_id="w-1")
    events = [
        emitter.build(
            "SubQuery.Execute",
            "end",
            parent="p1",
            links=["l1", "l2"] if i % 2 else None,
            payload=f"réponse «{i}» ✓" if i % 3 == 0 else None,
            ms=1.5 * i,
            tokens_in=i,
            attrs={"nested": {"k": [1, 2.5, None]}, "text": "naïve ✓", "i": i},
        )
        for i in range(250)
    ]
    fields = [(str(n + 1).encode(), json.dumps(e).encode()) for n, e in enumerate(events)]

    at_once, dead_at_once = _decode_batch(fields)
    one_by_one, dead_one_by_one = _decode_slowly(fields)

    assert dead_at_once == dead_one_by_one == []
    rows_a, rows_b = (
        t.set_column(t.schema.get_field_index("ts"), "ts", t["ts"].cast("int64")).to_pylist()
        for t in (at_once, one_by_one)
    )
    for row in rows_a + rows_b:
        row["attrs"] = json.loads(row["attrs"])
    assert rows_a == rows_b
    assert rows_a[3]["payload"] == "réponse «3» ✓" and "_payload" not in rows_a[3]["attrs"]


def test_it_dead_letters_numbers_the_store_cannot_hold_and_goes_on(client):
    emitter = Emitter(client, "rN")
    base = emitter.build("Worker.Heartbeat", "instant")
    for count in (1, 300):  # event by event, then a batch parsed at once
        client.delete(DEAD_LETTER_STREAM)
        good = [emitter.build("Worker.Heartbeat", "instant") for _ in range(count)]
        bad = [
            {**base, "event_id": "huge-ts", "ts": 2**64},
            {**base, "event_id": "x", "depth": 2**31},
        ]
        emitter.send(bad + good)
        recorder = Recorder(client)
        recorder.ensure_group()

        assert recorder.step() == count

        dead = [json.loads(f[b"event"])["event_id"] for _, f in client.xrange(DEAD_LETTER_STREAM)]
        assert dead == ["huge-ts", "x"]
    assert len(store.read_events("rN")) == 301


def test_it_stores_a_payload_once_across_batches_and_recorder_lives(client):
    emitter = Emitter(client, "rO")
    emitter.instant("Budget.Alert", payload="the same text")
    Recorder(client).ensure_group()
    assert Recorder(client).step() == 1
    emitter.instant("Budget.Alert", payload="the same text")
    emitter.instant("Budget.Alert", payload="the same text")
    assert Recorder(client).step() == 2  # a new life: its own pack

    ref = store.read_events("rO")[0]["payload_ref"]
    records = [
        key for idx in blobs.pack_dir().glob("*.idx") for key, _, _ in blobs.read_records(idx)[0]
    ]
    assert records.count(bytes.fromhex(ref)) == 1
    assert blobs.blob_get(ref) == "the same text"


def test_it_reads_blobs_stored_one_file_each_before_packs(client):
    emitter = Emitter(client, "rL")
    old = blobs.blob_path(emitter.build("Budget.Alert", "instant", payload="older")["payload_ref"])
    old.parent.mkdir(parents=True)
    old.write_text("older")
    emitter.instant("Budget.Alert", payload="older")
    emitter.instant("Budget.Alert", payload="newer")
    recorder = Recorder(client)
    recorder.ensure_group()
    assert recorder.step() == 2

    older, newer = store.read_events("rL")
    assert blobs.blob_get(older["payload_ref"]) == "older"
    assert blobs.blob_get(newer["payload_ref"]) == "newer"
    packed = {
        key for idx in blobs.pack_dir().glob("*.idx") for key, *_ in blobs.read_records(idx)[0]
    }
    assert packed == {bytes.fromhex(newer["payload_ref"])}  # the file is not stored again


def test_it_ignores_an_index_record_torn_by_a_kill_and_stores_its_text_again(client):
    emitter = Emitter(client, "rK")
    emitter.instant("Budget.Alert", payload="kept")
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()
    (idx,) = blobs.pack_dir().glob("*.idx")
    torn = emitter.build("Budget.Alert", "instant", payload="torn")
    with open(idx, "ab") as fh:  # the kill came halfway through the record of "torn"
        fh.write(blobs.RECORD.pack(bytes.fromhex(torn["payload_ref"]), 999, 4)[:20])
    emitter.send([torn])

    assert Recorder(client).step() == 1

    kept, again = store.read_events("rK")
    assert blobs.blob_get(kept["payload_ref"]) == "kept"
    assert blobs.blob_get(again["payload_ref"]) == "torn"


class Collected:
    """Stands in for traces.live.Publisher: what the forwarder hands over."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def forward(self, events: list[dict]) -> None:
        self.events.extend(events)


def test_it_keeps_stream_entries_until_the_live_forwarder_has_read_them(client):
    from traces.forwarder import Forwarder

    collected = Collected()
    forwarder = Forwarder(client, publisher=collected, block_ms=10)
    forwarder.start_at_end()
    forwarder.heartbeat()
    emitter = Emitter(client, "rF")
    emitter.instant("Budget.Alert", payload="secret")
    client.xadd(EVENTS_STREAM, {"seq": 2, "e": json.dumps({"run_id": "rF", "name": "Nope"})})
    emitter.instant("Run.Done")
    recorder = Recorder(client)
    recorder.ensure_group()

    assert recorder.step() == 2
    assert client.xlen(EVENTS_STREAM) == 3  # stored, but the forwarder has not read them

    assert forwarder.step() == 2  # the event that does not fit is not forwarded
    assert [e["name"] for e in collected.events] == ["Budget.Alert", "Run.Done"]
    recorder.trim()
    assert client.xlen(EVENTS_STREAM) == 0
