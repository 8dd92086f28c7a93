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
    # Written as kombu writes it: its JSON's default separators and ASCII escapes.
    assert json.dumps(json.loads(ours)) == ours
    assert json.dumps(json.loads(theirs)) == theirs.decode()


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
    assert len(read(status="error", error="E" * 10**6)["error"]) == MAX_ERROR_CHARS
