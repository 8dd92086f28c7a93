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
