"""The emitter, the recorder and the store, against a real Redis (its own database number,
so the stack's recorder does not compete) and real Parquet files."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.redisdb import private_redis  # noqa: F401 - the `client` fixture
from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM, Emitter
from traces.recorder import GROUP, Recorder, RecorderBusy, _decode, _write_segment


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


def test_it_caches_a_finished_runs_tree_until_another_segment_arrives(client, monkeypatch):
    emitter = Emitter(client, "rC")
    recorder = Recorder(client)
    recorder.ensure_group()
    with emitter.span("Run.Init") as run:
        submit = emitter.start("SubQuery.Submit", parent=run.span_id)
    recorder.step()
    cache = store.run_dir("rC") / store.TREE_CACHE
    (root,) = store.span_tree("rC")
    assert root.children[0].open and not cache.exists()  # a live run's tree is not kept
    submit.end(status="cancelled")  # the hedged-away attempt ends after its run
    recorder.step()
    (folded,) = store.span_tree("rC")
    assert cache.exists() and folded.children[0].status == "cancelled"

    def no_duckdb(*args, **kwargs):
        raise AssertionError("the cache should have answered")

    with monkeypatch.context() as patched:
        patched.setattr(store, "_columns_many", no_duckdb)
        (cached,) = store.span_tree("rC")
    assert cached == folded
    # A later event is a new segment: the cache no longer names the run's segments.
    emitter.instant("Verify.Flag", parent=run.span_id, status="rejected")
    recorder.step()
    (again,) = store.span_tree("rC")
    assert [i["name"] for i in again.instants] == ["Verify.Flag"]
    # A torn cache file is folded again, never trusted.
    cache.write_text('{"segments": [')
    assert store.span_tree("rC") == [again]


def test_the_recorder_folds_a_run_once_it_has_ended_and_gone_quiet(client):
    emitter = Emitter(client, "rF")
    recorder = Recorder(client)
    recorder.ensure_group()
    with emitter.span("Run.Init") as run:
        emitter.instant("Env.LoadFragment", parent=run.span_id, chars=10)
        recorder.step()
        assert recorder.fold_due == {}  # still running: nothing to fold
    recorder.step()
    assert set(recorder.fold_due) == {"rF"}
    cache = store.run_dir("rF") / store.TREE_CACHE
    recorder.fold(time.monotonic())  # not quiet long enough yet
    assert not cache.exists() and set(recorder.fold_due) == {"rF"}
    recorder.fold(time.monotonic() + 60)
    assert cache.exists() and recorder.fold_due == {}
    # An event after the fold makes the cache stale: the run is folded again later.
    emitter.instant("Verify.Flag", parent=run.span_id, status="rejected")
    recorder.step()
    assert set(recorder.fold_due) == {"rF"}
    recorder.fold(time.monotonic() + 60)
    key, content = store.read_beside("rF", store.TREE_CACHE)
    assert len(key) == 3 and content is not None  # folded from all three segments
    assert len(json.loads(content)[1]["name"]) == 2  # both instants


def test_it_dead_letters_bad_events_and_goes_on(client):
    recorder = Recorder(client)
    recorder.ensure_group()
    client.xadd(EVENTS_STREAM, {"seq": 1, "e": "{not json"})
    client.xadd(EVENTS_STREAM, {"seq": 2, "e": json.dumps({"run_id": "rB", "name": "Nope"})})
    client.xadd(EVENTS_STREAM, {"seq": 3, "e": "[" * 5000 + "]" * 5000})  # too deep to decode
    Emitter(client, "rB").instant("Run.Done")
    assert recorder.step() == 1

    dead = client.xrange(DEAD_LETTER_STREAM)
    assert len(dead) == 3
    assert b"not JSON" in dead[0][1][b"reason"]
    assert b"'Nope' is not in the taxonomy" in dead[1][1][b"reason"]
    assert b"nested too deeply" in dead[2][1][b"reason"]
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
    seqs = [str(n + 1).encode() for n in range(len(events))]
    raws = [json.dumps(e).encode() for e in events]

    at_once, dead_at_once = _decode_batch(seqs, raws)
    one_by_one, dead_one_by_one = _decode_slowly(seqs, raws)

    assert dead_at_once == dead_one_by_one == []
    rows_a, rows_b = (
        t.set_column(t.schema.get_field_index("ts"), "ts", t["ts"].cast("int64")).to_pylist()
        for t in (at_once, one_by_one)
    )
    for row in rows_a + rows_b:
        row["attrs"] = json.loads(row["attrs"])
    assert rows_a == rows_b
    assert rows_a[3]["payload"] == "réponse «3» ✓" and "_payload" not in rows_a[3]["attrs"]


def _odd_and_bad_events(emitter: Emitter) -> tuple[list[bytes], dict[str, str]]:
    """Entries of every shape the columnar parse leaves to the per-event check, and entries
    that do not fit, with what their dead letter's reason must say (by event id)."""
    base = dict(emitter.build("Worker.Heartbeat", "instant"))

    def event(event_id: str, **fields: object) -> dict:
        return {**base, "event_id": event_id, **fields}

    def without(event_id: str, key: str) -> dict:
        found = event(event_id)
        del found[key]
        return found

    odd = [
        event('o-"quoted"', span_id="s\\back", venue="tab\there"),
        without("o-no-links", "links"),
        without("o-no-depth", "depth"),
        without("o-no-attrs", "attrs"),
        event("o-null-payload", attrs={"_payload": None, "k": 1}),
        event("o-nested-payload", attrs={"inner": {"_payload": 5}}),
        event("o-big-ms", ms=10**20, cost=-0.0, bytes=0, tokens_out=-3),
        event("o-link-escaped", links=['a"b', "c"]),
        event("o-empty-link", links=[""]),
        event("o-unicode", parent_id="père ✓", attrs={"t": "\u2028 ✓"}),
    ]
    bad = {
        "b-ts-text": (event("b-ts-text", ts="12"), "ts must be"),
        "b-ts-big": (event("b-ts-big", ts=2**70), "ts must be"),
        "b-ts-float": (event("b-ts-float", ts=1.5e18), "ts must be"),
        "b-depth-big": (event("b-depth-big", depth=2**40), "depth must be an integer"),
        "b-depth-null": (event("b-depth-null", depth=None), "depth must be an integer"),
        "b-bytes-float": (event("b-bytes-float", bytes=1.5), "bytes must be a whole number"),
        "b-tokens-big": (event("b-tokens-big", tokens_in=2**64), "tokens_in must be"),
        "b-tokens-bool": (event("b-tokens-bool", tokens_out=True), "tokens_out must be"),
        "b-ms-text": (event("b-ms-text", ms="1.5"), "ms must be a number"),
        "b-run-number": (event("b-run-number", run_id=12), "run_id must be a non-empty"),
        "b-run-path": (event("b-run-path", run_id="../etc"), "run_id must be 1 to 64 letters"),
        "b-span-empty": (event("b-span-empty", span_id=""), "span_id must be a non-empty"),
        "b-phase": (event("b-phase", phase="begin"), "phase 'begin' is not one of"),
        "b-status": (event("b-status", status=["ok"]), "status ['ok'] is not one of"),
        "b-venue": (event("b-venue", venue=7), "venue must be a string or null"),
        "b-links-null": (event("b-links-null", links=None), "links must be a list"),
        "b-links-text": (event("b-links-text", links="a"), "links must be a list"),
        "b-attrs-list": (event("b-attrs-list", attrs=[1]), "attrs must be a JSON object"),
        "b-attrs-null": (event("b-attrs-null", attrs=None), "attrs must be a JSON object"),
        "b-payload-number": (
            event("b-payload-number", attrs={"_payload": 3}),
            "attrs._payload (the payload text) must be a string",
        ),
        "b-payload-ref": (
            event("b-payload-ref", attrs={"_payload": "x"}, payload_ref="ABC"),
            "needs payload_ref",
        ),
    }
    raws = [json.dumps(e).encode() for e in odd]
    raws += [json.dumps(e).encode() for e, _ in bad.values()]
    raws += [b"{not json", b'["an", "array"]', b"\xff\xfe not utf-8", b'{"run_id": "x"} extra']
    return raws, {key: reason for key, (_, reason) in bad.items()}


def test_it_stores_the_same_rows_and_dead_letters_at_once_as_event_by_event(client, caplog):
    from traces.recorder import COLUMNAR_MIN, _decode_batch, _decode_slowly

    emitter = Emitter(client, "rQ", venue="edge", worker_id="w-2")
    odd_and_bad, reasons = _odd_and_bad_events(emitter)
    common = [
        json.dumps(
            emitter.build(
                "SubQuery.Submit",
                "start",
                parent="p",
                links=["x", "y"] if i % 4 else None,
                payload=f"prompt «{i}»" if i % 5 == 0 else None,
                tokens_in=i,
                cost=0.25,
            )
        ).encode()
        for i in range(COLUMNAR_MIN)
    ]
    raws = common[:100] + odd_and_bad + common[100:]
    seqs = [str(n + 1).encode() for n in range(len(raws))]
    seqs[3] = b"not a seq"

    at_once, dead_at_once = _decode_batch(seqs, raws)
    one_by_one, dead_one_by_one = _decode_slowly(seqs, raws)

    assert "event by event" not in caplog.text  # the batch was parsed at once
    assert dead_at_once == dead_one_by_one
    by_id = {}
    for index, reason, raw in dead_at_once:
        try:
            by_id[json.loads(raw)["event_id"]] = reason
        except (ValueError, TypeError, KeyError):
            by_id[index] = reason
    for event_id, expected in reasons.items():
        assert expected in by_id[event_id], event_id
    assert "seq must be" in by_id[json.loads(raws[3])["event_id"]]
    assert len(dead_at_once) == len(reasons) + 4 + 1  # the bad, the four not events, the seq
    rows_a, rows_b = (
        t.set_column(t.schema.get_field_index("ts"), "ts", t["ts"].cast("int64")).to_pylist()
        for t in (at_once, one_by_one)
    )
    for row in rows_a + rows_b:
        row["attrs"] = json.loads(row["attrs"])
    assert rows_a == rows_b
    assert len(rows_a) == COLUMNAR_MIN - 1 + 10
    stored = {row["event_id"]: row for row in rows_a}
    assert stored['o-"quoted"']["span_id"] == "s\\back"
    assert stored["o-link-escaped"]["links"] == ['a"b', "c"]
    assert stored["o-empty-link"]["links"] == [""]
    assert stored["o-no-links"]["links"] == [] and stored["o-no-depth"]["depth"] == 0
    assert stored["o-null-payload"]["attrs"] == {"k": 1}
    assert stored["o-nested-payload"]["attrs"] == {"inner": {"_payload": 5}}
    assert stored["o-big-ms"]["ms"] == 1e20


def test_it_dead_letters_what_the_store_cannot_hold_and_goes_on(client):
    emitter = Emitter(client, "rN")
    base = emitter.build("Worker.Heartbeat", "instant")
    for count in (1, 300):  # event by event, then a batch parsed at once
        client.delete(DEAD_LETTER_STREAM)
        good = [emitter.build("Worker.Heartbeat", "instant") for _ in range(count)]
        bad = [
            {**base, "event_id": "huge-ts", "ts": 2**64},
            {**base, "event_id": "x", "depth": 2**31},
            {**base, "event_id": "not-a-directory", "run_id": "a/b"},
        ]
        emitter.send(bad + good)
        recorder = Recorder(client)
        recorder.ensure_group()

        assert recorder.step() == count

        dead = [json.loads(f[b"event"])["event_id"] for _, f in client.xrange(DEAD_LETTER_STREAM)]
        assert dead == ["huge-ts", "x", "not-a-directory"]
    assert len(store.read_events("rN")) == 301


def test_it_stores_nothing_twice_after_dying_between_a_big_batch_and_its_ack(client, monkeypatch):
    emitter = Emitter(client, "rG")
    emitter.send(
        [emitter.build("Worker.Heartbeat", "instant", payload=f"p{i % 7}") for i in range(500)]
    )
    dying = Recorder(client)
    dying.ensure_group()

    def killed(*args, **kwargs):
        raise SystemExit("killed after the segment and the blobs were durable")

    monkeypatch.setattr(dying.client, "pipeline", killed)
    with pytest.raises(SystemExit):
        dying.step()
    monkeypatch.undo()
    assert client.xpending(EVENTS_STREAM, GROUP)["pending"] == 500  # none acknowledged
    emitter.send([emitter.build("Run.Done", "instant")])

    restarted = Recorder(client)
    assert restarted.recover() == 0  # all 500 are recognised as stored
    assert restarted.step() == 1
    events = store.read_events("rG")
    assert [e["seq"] for e in events] == list(range(1, 502))
    assert len({e["event_id"] for e in events}) == 501
    assert blobs.blob_get(events[6]["payload_ref"]) == "p6"
    assert client.xpending(EVENTS_STREAM, GROUP)["pending"] == 0


def test_it_stores_a_trickle_of_events_as_one_batch_reading_twice(client):
    """Events of a fanout arrive a few at a time: the recorder gathers what comes within
    its window into one batch, and does not wake for each arrival."""
    emitter = Emitter(client, "rT")
    recorder = Recorder(client, gather_s=0.5, poll_s=0.5)
    recorder.ensure_group()
    reads = []
    read = recorder._read

    def counted(*args, **kwargs):
        reads.append(args)
        return read(*args, **kwargs)

    recorder._read = counted

    def trickle() -> None:
        for i in range(10):
            time.sleep(0.005)
            Emitter(client, "rT").instant("Env.LoadFragment", chars=i)

    emitter.instant("Env.LoadFragment", chars=-1)
    thread = threading.Thread(target=trickle)
    thread.start()
    stored = recorder.step()
    thread.join()
    assert stored == 11
    assert len(reads) == 2
    assert [e["attrs"]["chars"] for e in store.read_events("rT")] == list(range(-1, 10))


def test_a_fast_fanouts_events_are_gathered_into_one_batch_past_a_thousand(client):
    """A fanout of a fast model emits thousands of events a second: the window gathers
    them into one batch, instead of storing each thousand as it came (every batch pays a
    parse, a segment and an fsync; bench/traces.py). The run's end closes the window, so a
    slow machine only makes the test take longer."""
    recorder = Recorder(client, gather_s=30.0, poll_s=0.05)
    recorder.ensure_group()
    emitter = Emitter(client, "rF")
    run = emitter.start("Run.Init", question="q")

    def burst(start: int) -> None:
        emitter.send(
            [emitter.build("Env.LoadFragment", "instant", chars=start + i) for i in range(600)]
        )

    burst(0)

    def more() -> None:
        for k in range(1, 4):
            time.sleep(0.08)
            burst(600 * k)
        run.end()

    thread = threading.Thread(target=more)
    thread.start()
    stored = recorder.step()
    thread.join()
    assert stored == 2402, f"stored {stored} of the 2,402 events that came before the run ended"
    assert len(store._segments("rF")) == 1


def test_a_backlog_is_stored_without_waiting_out_the_window(client):
    """A read that finds GATHER_BELOW entries waiting stores them at once."""
    from traces.recorder import GATHER_BELOW

    emitter = Emitter(client, "rB")
    for start in range(0, GATHER_BELOW, 2000):
        n = min(2000, GATHER_BELOW - start)
        emitter.send(
            [emitter.build("Env.LoadFragment", "instant", chars=start + i) for i in range(n)]
        )
    recorder = Recorder(client, gather_s=30.0, poll_s=0.05)
    recorder.ensure_group()
    started = time.monotonic()
    assert recorder.step() == GATHER_BELOW
    assert time.monotonic() - started < 15.0, "it waited out the window with a backlog"


def test_a_runs_end_closes_the_gathering_window_at_once(client):
    """While a run goes on, its events are gathered for up to a second; the end of its
    span stores what came at once, so a finished run is in the store without the wait."""
    recorder = Recorder(client, gather_s=5.0, poll_s=0.05)
    recorder.ensure_group()
    emitter = Emitter(client, "rE")
    run = emitter.start("Run.Init", question="q")

    def finish() -> None:
        time.sleep(0.2)
        emitter.instant("Run.Done", parent=run.span_id)
        run.end()

    thread = threading.Thread(target=finish)
    thread.start()
    started = time.monotonic()
    stored = recorder.step()
    thread.join()
    assert time.monotonic() - started < 2.0, "it waited out the window after the run ended"
    assert stored == 3 and [e["name"] for e in store.read_events("rE")] == [
        "Run.Init",
        "Run.Done",
        "Run.Init",
    ]


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


def test_it_judges_randomly_damaged_events_at_once_as_event_by_event(client):
    import random

    from traces.recorder import _decode_batch, _decode_slowly

    values = [None, 0, -1, 2**31, 2**63, 2**64, 1.5, 1e300, True, "", "12", 'a"b', "a\\b", "é"]
    values += [[], ["a"], ["a", 1], [None], {}, {"_payload": "t"}, {"_payload": 1}, "0" * 64]
    values += ["Run.Init", "start", "ok", 9223372036854775807, 9223372036854775808]
    emitter = Emitter(client, "rR", venue="edge", worker_id="w")
    rng = random.Random(7)
    raws = []
    for n in range(2000):
        event = dict(emitter.build("SubQuery.Execute", "end", payload=f"p{n}", ms=1.0))
        for _ in range(rng.choice([0, 1, 1, 2])):
            key = rng.choice(list(event))
            if rng.random() < 0.15:
                del event[key]
            else:
                event[key] = rng.choice(values)
        raws.append(json.dumps(event).encode())
    seqs = [str(n + 1).encode() for n in range(len(raws))]

    at_once, dead_at_once = _decode_batch(seqs, raws)
    one_by_one, dead_one_by_one = _decode_slowly(seqs, raws)

    assert dead_at_once == dead_one_by_one
    assert 0 < len(dead_at_once) < len(raws)
    rows_a, rows_b = (
        t.set_column(t.schema.get_field_index("ts"), "ts", t["ts"].cast("int64")).to_pylist()
        for t in (at_once, one_by_one)
    )
    for row in rows_a + rows_b:
        row["attrs"] = json.loads(row["attrs"])
    assert rows_a == rows_b


def test_threads_read_their_own_runs_through_one_database(client, monkeypatch):
    """Django runs each request's view on a thread of its own: every thread gets its own
    connection (its own `ev` view) to one database, opened once, not one per thread."""
    runs = [f"rThr{n}" for n in range(6)]
    for n, run_id in enumerate(runs):
        emitter = Emitter(client, run_id)
        with emitter.span("Run.Init"):
            for _ in range(n):
                emitter.instant("Env.LoadFragment", chars=1)
    recorder = Recorder(client)
    recorder.ensure_group()
    recorder.step()

    import duckdb

    opened = []
    real_connect = duckdb.connect
    monkeypatch.setattr(store, "_database", None, raising=False)

    def connect(*args, **kwargs):
        opened.append(1)
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", connect)
    seen: dict[str, list[int]] = {}
    barrier = threading.Barrier(len(runs))

    def read(run_id: str) -> None:
        barrier.wait()
        seen[run_id] = [store.event_count(run_id) for _ in range(20)]

    threads = [threading.Thread(target=read, args=(r,)) for r in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {run_id: [n + 2] * 20 for n, run_id in enumerate(runs)}
    assert len(opened) == 1
