"""What a run whose conductor was lost had spent, read back from its trace.

A conductor keeps a run's totals and its receipt chain's summary in memory and writes them
to the run's row when the run ends. One killed with -9 writes nothing: the watcher that
fails its run (runs/lease.py) found a row saying $0 and no tokens while the trace held the
receipts of every reply paid, and `frlm_receipts verify` refused the run for want of a
recorded chain (a review). So the watcher reads the trace (what the recorder stored, and
what is still on the stream), and records what it finds: tokens and cost as the conductor
adds them (each settled Submit span's end and each model turn), the sub-queries settled,
and the receipts' count, sums and last hash, marked as read from the trace (so a chain cut
short before the conductor died cannot be told from a whole one: the accounts say so)."""

from __future__ import annotations

import json
import logging
from decimal import Decimal, InvalidOperation
from typing import Any

import redis

from frlm_web.money import ZERO, money_str
from runs.trust.receipts import RECEIPT_EVENT
from traces import store
from traces.emitter import EVENTS_STREAM

log = logging.getLogger(__name__)

STREAM_PAGE = 10_000  # stream entries read at a time

SALVAGED = (
    "read from the run's trace after its conductor was lost: a chain cut short before it "
    "died cannot be told from a whole one"
)


def _money(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else ZERO
    except (InvalidOperation, ValueError):
        return ZERO


def _events(client: redis.Redis, run_id: str) -> list[dict[str, Any]]:
    """The run's events: those the recorder has stored, then those still on the stream
    (the recorder trims the stream behind what it stored, so what is left there is short)."""
    events = store.read_events(run_id)
    after = events[-1]["seq"] if events else 0
    marker = f'"run_id":"{run_id}"'.encode()
    start = "-"
    while True:  # in pages: a stream a stopped recorder let grow is not read at once
        page = client.xrange(EVENTS_STREAM, min=start, count=STREAM_PAGE)
        for _id, fields in page:
            raw = fields.get(b"e") or b""
            if marker not in raw or int(fields.get(b"seq") or 0) <= after:
                continue
            event = json.loads(raw)
            if event.get("run_id") == run_id:
                events.append({**event, "seq": int(fields[b"seq"])})
        if len(page) < STREAM_PAGE:
            return sorted(events, key=lambda e: e["seq"])
        start = "(" + (page[-1][0].decode() if isinstance(page[-1][0], bytes) else page[-1][0])


def spend_from_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run row's totals and the receipts' summary, from its events."""
    tokens_in = tokens_out = settled = failed = 0
    cost = ZERO
    receipts: dict[str, Any] = {"count": 0, "paid": ZERO, "cost": ZERO, "verdicts": {}}
    head = None
    for e in events:
        name, phase = e["name"], e["phase"]
        attrs = e.get("attrs") or {}
        if phase == "end" and name in ("SubQuery.Submit", "Run.Decode"):
            tokens_in += int(e.get("tokens_in") or 0)
            tokens_out += int(e.get("tokens_out") or 0)
            cost += _money(e.get("cost"))
            if name == "SubQuery.Submit" and attrs.get("kind") != "rlm":
                settled += 1
                failed += e["status"] != "ok"
        elif name == RECEIPT_EVENT and isinstance(attrs.get("receipt"), dict):
            receipt = attrs["receipt"]
            receipts["count"] += 1
            receipts["paid"] += _money(receipt.get("paid"))
            receipts["cost"] += _money(receipt.get("cost"))
            verdict = str(receipt.get("verdict") or "")
            receipts["verdicts"][verdict] = receipts["verdicts"].get(verdict, 0) + 1
            head = attrs.get("hash") if isinstance(attrs.get("hash"), str) else head
    return {
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost": cost,
        "subqueries": settled,
        "subqueries_failed": failed,
        "receipts": {
            **receipts,
            "paid": money_str(receipts["paid"]),
            "cost": money_str(receipts["cost"]),
            "head": head,
            "source": SALVAGED,
        },
    }


def spend_salvage(client: redis.Redis, run_id: str) -> dict:
    """Record on the run's row what its trace says it spent (spend_from_trace); the
    figures, or {} when the trace could not be read (the row keeps what it had)."""
    from runs.models import Run

    try:
        spent = spend_from_trace(_events(client, run_id))
    except Exception as exc:  # noqa: BLE001 - failing the run goes on without them
        log.warning("run %s: could not read what it spent from its trace: %s", run_id, exc)
        return {}
    run = Run.objects.filter(id=run_id).only("accounts").first()
    accounts = dict(run.accounts) if run is not None and isinstance(run.accounts, dict) else {}
    accounts["receipts"] = spent["receipts"]
    Run.objects.filter(id=run_id).update(
        tokens_in=spent["tokens_in"],
        tokens_out=spent["tokens_out"],
        cost=spent["cost"],
        subqueries=spent["subqueries"],
        subqueries_failed=spent["subqueries_failed"],
        accounts=accounts,
    )
    return spent
