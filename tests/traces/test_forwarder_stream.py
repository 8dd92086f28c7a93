"""The live forwarder beside the recorder on the one event stream (traces/forwarder.py):
it reads what the recorder stores, passes on only the runs a page watches, and holds no
stream entry back from the recorder's trim. Against a real Redis, as the store's tests."""

from __future__ import annotations

import json
import time

from tests.redisdb import private_redis  # noqa: F401 - the `client` fixture
from traces import live
from traces.emitter import EVENTS_STREAM, Emitter
from traces.recorder import Recorder


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
    live.watch(client, "rF")  # a page has the run open
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


def test_it_forwards_only_runs_a_page_watches_and_stores_every_run(client):
    from traces.forwarder import Forwarder

    collected = Collected()
    forwarder = Forwarder(client, publisher=collected, block_ms=10)
    forwarder.start_at_end()
    forwarder.heartbeat()
    live.watch(client, "rSeen")
    live.watch(client, "rGone", now=time.time() - live.WATCH_TTL_S - 1)  # a page long closed
    for run in ("rSeen", "rAlone", "rGone"):
        Emitter(client, run).instant("Run.Done")
    recorder = Recorder(client)
    recorder.ensure_group()
    assert recorder.step() == 3  # the store takes every run

    assert forwarder.step() == 1
    assert [e["run_id"] for e in collected.events] == ["rSeen"]
    recorder.trim()
    assert client.xlen(EVENTS_STREAM) == 0  # passed over is read all the same


def test_with_no_page_watching_the_forwarder_reads_nothing_and_holds_nothing_back(client):
    from traces.forwarder import Forwarder

    collected = Collected()
    forwarder = Forwarder(client, publisher=collected, block_ms=10)
    forwarder.start_at_end()
    forwarder.heartbeat()
    for n in range(50):
        Emitter(client, "rNobody").instant("Memory.CacheHit", payload=f"line {n}")
    recorder = Recorder(client)
    recorder.ensure_group()
    assert recorder.step() == 50

    assert forwarder.step() == 0
    assert collected.events == []
    live_group = next(
        g for g in client.xinfo_groups(EVENTS_STREAM) if g["name"] in (b"live", "live")
    )
    assert (
        live_group["last-delivered-id"] == client.xinfo_stream(EVENTS_STREAM)["last-generated-id"]
    )
    recorder.trim()
    assert client.xlen(EVENTS_STREAM) == 0
    # A page opens the run: what is emitted from then on is forwarded.
    live.watch(client, "rNobody")
    Emitter(client, "rNobody").instant("Run.Done")
    assert forwarder.step() == 1
    assert [e["name"] for e in collected.events] == ["Run.Done"]
