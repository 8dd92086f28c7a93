"""The message a job travels in (workers/wire.py): what the conductor pushes is what Celery's
own publish would have pushed, a real Celery worker runs it, and the gateway reads both."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from frlm_web.celery import app
from frlm_web.redis_client import get_redis
from workers import wire
from workers.tasks import subquery_execute

JOB = {
    "run_id": "r-wire",
    "sq_id": "sq-1",
    "prompt": 'naïve question ☃ "quoted"\n',
    "model": {"kind": "sim", "model": "frlm-sim-worker"},
    "attempt": 1,
}
QUEUE = "venue.wire-test"


def unpacked(raw: bytes | str) -> dict:
    message = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


@pytest.mark.usefixtures("stack")
def test_it_writes_the_message_celery_writes() -> None:
    client = get_redis()
    client.delete(QUEUE)
    with app.producer_or_acquire() as producer:
        sent = subquery_execute.apply_async(
            args=[JOB],
            queue=QUEUE,
            expires=60,
            producer=producer,
            argsrepr="[r-wire sub-query sq-1]",
            kwargsrepr="{}",
            declare=[],
        )
    theirs = client.lpop(QUEUE)
    now = datetime.now(UTC)
    ours = wire.job_message(
        JOB,
        task_id=sent.id,
        queue=QUEUE,
        expires_s=60,
        argsrepr="[r-wire sub-query sq-1]",
        reply_to=app.thread_oid,
        sender=wire.origin(),
        now=now,
    )
    a, b = unpacked(theirs), unpacked(ours)
    # Only the clock and kombu's own delivery tag differ.
    assert abs(
        datetime.fromisoformat(a["headers"].pop("expires"))
        - datetime.fromisoformat(b["headers"].pop("expires"))
    ) < timedelta(seconds=5)
    a["properties"].pop("delivery_tag")
    b["properties"].pop("delivery_tag")
    assert a == b
    assert wire.job_of(ours) == wire.job_of(theirs) == (wire.TASK, JOB)
    # The same JSON spelled compactly and in UTF-8 (orjson), where kombu writes spaces and
    # ASCII escapes: a Celery worker runs it all the same (test_worker_runtime's "celery").
    assert "naïve question ☃" in base64.b64decode(json.loads(ours)["body"]).decode()
    assert len(ours) < len(theirs)


def test_its_expiry_is_the_policys_timeout() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    message = unpacked(
        wire.job_message(
            JOB, task_id="t", queue=QUEUE, expires_s=2.5, argsrepr="", reply_to="r", sender="s",
            now=now,
        )
    )  # fmt: skip
    assert message["headers"]["expires"] == "2026-01-01T00:00:02.500000+00:00"
    assert message["properties"]["expiration"] == "2500"
    assert message["properties"]["delivery_info"] == {"exchange": "", "routing_key": QUEUE}


def test_a_result_with_impossible_figures_is_read_not_raised_and_named_malformed() -> None:
    """decode_result raised on tokens of 1.5 and ms of "abc", failing a whole batch, and
    took 10**30 tokens and a 1e400 cost as they were (found by a review)."""
    from decimal import Decimal

    from workers.jobs import MAX_ERROR_CHARS, decode_result

    def read(**fields: str) -> dict:
        return dict(decode_result({k.encode(): v.encode() for k, v in fields.items()}))

    sound = read(status="ok", tokens_in="12", tokens_out="3", ms="4.5", cost="0.25")
    assert (sound["tokens_in"], sound["ms"], sound["cost"]) == (12, 4.5, Decimal("0.25"))
    assert "malformed" not in sound
    for bad in (
        {"tokens_in": "1.5"},
        {"tokens_out": "-5"},
        {"tokens_in": str(10**30)},
        {"tokens_in": "True"},
        {"ms": "abc"},
        {"ms": "-1"},
        {"ms": "nan"},
        {"cost": "1e400"},
    ):
        got = read(status="ok", **bad)
        (key,) = bad
        assert key in got["malformed"], (bad, got)
        assert got[key] in (0, 0.0, Decimal(0)), (bad, got)
    assert read(cost="1e1000000")["cost"] == 0  # past Decimal's range: nothing, as before
    # A claim finer than any price makes is kept to 15 places: "1e-1000000" was written out
    # in full, a million digits, in every settle, receipt and summary that named it.
    from frlm_web.money import money_str

    assert money_str(read(cost="1e-1000000")["cost"]) == "0"
    assert read(cost="0.000123456789012645678")["cost"] == Decimal("0.000123456789013")
    assert read(cost="0.000000000000000123")["cost"] == 0
    assert read(cost="0.00075")["cost"] == Decimal("0.00075")  # an honest claim, as it was
    assert money_str(read(cost="1000000")["cost"]) == "1000000"
    assert len(read(status="error", error="E" * 10**6)["error"]) == MAX_ERROR_CHARS


def test_a_trusted_broker_workers_jobs_travel_in_bundles_and_any_others_alone() -> None:
    from runs.engine.fanout.state import Flight, Outcome
    from runs.engine.fanout.transport import bundles

    def flight(i: int, queue: str, bundle: bool) -> tuple[Flight, dict]:
        return Flight(Outcome(i), "p", sq_id=f"{i}.1", queue=queue, may_bundle=bundle), {"i": i}

    ready = [
        flight(0, "worker.a", True),
        flight(1, "worker.g", False),  # a gateway worker's, or an untrusted worker's
        flight(2, "worker.a", True),
        flight(3, "worker.b", True),
        flight(4, "venue.edge", False),  # a venue's shared queue
        flight(5, "worker.a", True),
        flight(6, "worker.g", False),
        flight(7, "worker.a", True),
    ]
    got = [[job["i"] for _f, job in group] for group in bundles(ready, 3)]
    assert got == [[0, 2, 5], [1], [3], [4], [6], [7]]
    alone = [[job["i"] for _f, job in group] for group in bundles(ready, 1)]
    assert alone == [[i] for i in range(8)]


@pytest.mark.usefixtures("stack")
def test_a_cancelled_job_of_a_bundle_is_not_revoked_through_celery(monkeypatch) -> None:
    """Revoking a bundle's task id would drop its other jobs too, while queued: a cancelled
    job of a bundle is left to its worker, which finds it in the run's cancelled set."""
    from runs.engine.fanout.state import Flight, Outcome
    from runs.engine.fanout.transport import Transport
    from runs.engine.policy import Policy
    from workers.jobs import cancelled_key

    revoked: list[list[str]] = []
    monkeypatch.setattr(app.control, "revoke", lambda ids: revoked.append(list(ids)))
    transport = Transport(run_id="r-revoke", client=get_redis(), policy=Policy())
    alone = Flight(Outcome(0), "p", sq_id="0.1", task_id="t-alone")
    bundled = Flight(Outcome(1), "p", sq_id="1.1", task_id="t-bundle", bundled=True)
    transport.revoke([alone, bundled])
    assert revoked == [["t-alone"]]
    assert get_redis().smembers(cancelled_key("r-revoke")) == {b"0.1", b"1.1"}
