"""What a run whose conductor was lost spent, read back from its trace (runs/salvage.py):
the figures from a hand-made trace, and the stream read in pages."""

from __future__ import annotations

import json
from decimal import Decimal

from runs import salvage


def test_it_adds_what_the_run_paid_and_its_receipts_not_what_workers_claimed():
    events = [
        {"name": "Run.Decode", "phase": "end", "tokens_in": 100, "tokens_out": 5, "cost": "0.01"},
        # A worker's claim on its Execute span is not what the run paid.
        {"name": "SubQuery.Execute", "phase": "end", "tokens_in": 9000, "cost": "5"},
        {"name": "SubQuery.Submit", "phase": "end", "status": "ok", "tokens_in": 40,
         "tokens_out": 4, "cost": "0.002", "attrs": {}},
        {"name": "SubQuery.Submit", "phase": "end", "status": "error", "attrs": {}},
        {"name": "SubQuery.Submit", "phase": "end", "status": "ok", "attrs": {"kind": "rlm"}},
        {"name": "Receipt.Emit", "phase": "instant", "attrs": {
            "hash": "h1", "receipt": {"paid": "0.002", "cost": "0.002", "verdict": "accepted"}}},
        {"name": "Receipt.Emit", "phase": "instant", "attrs": {
            "hash": "h2", "receipt": {"paid": "0", "cost": "0.003", "verdict": "rejected"}}},
    ]  # fmt: skip
    spent = salvage.spend_from_trace(events)
    assert (spent["tokens_in"], spent["tokens_out"]) == (140, 9)
    assert spent["cost"] == Decimal("0.012")
    assert (spent["subqueries"], spent["subqueries_failed"]) == (2, 1)
    receipts = spent["receipts"]
    assert (receipts["count"], receipts["head"]) == (2, "h2")
    assert (receipts["paid"], receipts["cost"]) == ("0.002", "0.005")
    assert receipts["verdicts"] == {"accepted": 1, "rejected": 1}


class Stream:
    """XRANGE over a list of entries, as Redis pages it."""

    def __init__(self, entries):
        self.entries = entries
        self.calls = 0

    def xrange(self, name, min="-", count=None):  # noqa: A002 - redis-py's own name
        self.calls += 1
        ids = [e[0] for e in self.entries]
        start = 0 if min == "-" else ids.index(min.lstrip("(").encode()) + 1
        return self.entries[start : start + count]


def test_it_reads_the_stream_in_pages_and_keeps_only_the_runs_events(monkeypatch):
    monkeypatch.setattr(salvage, "STREAM_PAGE", 2)
    monkeypatch.setattr(salvage.store, "read_events", lambda run_id: [])
    entries = [
        (f"{i}-0".encode(), {b"seq": str(i).encode(), b"e": json.dumps(
            {"run_id": "rA" if i % 2 else "rB", "name": "X", "phase": "instant"},
            separators=(",", ":")).encode()})  # as the emitter writes it
        for i in range(1, 8)
    ]  # fmt: skip
    stream = Stream(entries)
    events = salvage._events(stream, "rA")
    assert [e["seq"] for e in events] == [1, 3, 5, 7]
    assert stream.calls == 4
