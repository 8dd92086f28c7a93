"""The gateway's protocol pieces, most without a server: what the relay refuses, how a buffer
and a batch are sized, which endpoint a job may name, and what a worker is told when the
server refuses its host name."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from django.conf import settings

from tests.helpers import endpoint, finish, launch
from workers import keys
from workers.backends import ModelError, ModelSpec
from workers.execution import served
from workers.gateway import relay
from workers.gateway.agent import ws_url
from workers.gateway.protocol import batches, buffer_for

pytestmark = pytest.mark.timeout(240)


def test_an_event_the_recorder_would_refuse_is_refused_with_its_result() -> None:
    """Relayed as they were, events of ts 10**30 or ms "abc" were dead-lettered by the
    recorder and left the job's Execute span open in the trace (found by a review)."""
    job = relay.Held("r1", "1.1", "a" * 16, "b" * 16, 0, "frlm-sim-worker")
    end = {
        "name": "SubQuery.Execute",
        "phase": "end",
        "span_id": "b" * 16,
        "parent_id": "a" * 16,
        "ts": time.time_ns(),
        "status": "ok",
        "depth": 0,
        "ms": 1.0,
    }
    assert relay.worker_events([end], job, "edge", "w1")[0]["ms"] == 1.0
    for bad in ({"ts": 10**30}, {"depth": 10**30}, {"ms": "abc"}, {"bytes": "zz"}):
        with pytest.raises(relay.ProtocolError, match="does not fit the trace|must be a number"):
            relay.worker_events([{**end, **bad}], job, "edge", "w1")
    # A hostile review stored 30 MB of attributes in one span, and a cost of 1e308.
    reply = "4417" * 1000
    honest = {
        **end,
        "cost": 0.0002,
        "payload_ref": hashlib.sha256(reply.encode()).hexdigest(),
        "attrs": {"model_ms": 1.0, "_payload": reply},
    }
    assert relay.worker_events([honest], job, "edge", "w1")[0]["attrs"]["model_ms"] == 1.0
    for bad, says in (
        ({"attrs": {"blob": "A" * 20_000}}, "attributes are 20,0"),
        ({"attrs": {"_payload": "A" * 2_000_000}}, "over the reply cap"),
        ({"cost": 1e308}, "cost must be a number from 0 to 1000000"),
        ({"tokens_in": -1}, "tokens_in must be a number"),
    ):
        with pytest.raises(relay.ProtocolError, match=says):
            relay.worker_events([{**end, **bad}], job, "edge", "w1")


def test_a_worker_cannot_end_or_name_any_span_but_its_execute_spans_end() -> None:
    """A hostile review sent, with each result, an Env.LoadFragment carrying the Submit
    span's id and phase "end" (error, 10**9 ms and tokens, a huge cost): the run page, the
    diff and the export took it as the conductor's Submit span. An instant's ids are the
    server's now, and its phase an instant's."""
    job = relay.Held("r1", "1.1", "a" * 16, "b" * 16, 0, "frlm-sim-worker")
    hijack = {
        "name": "Env.LoadFragment",
        "span_id": "a" * 16,  # the Submit span
        "event_id": "c" * 16,
        "parent_id": "b" * 16,
        "phase": "end",
        "status": "error",
        "ts": time.time_ns(),
        "ms": 999999999,
    }
    with pytest.raises(relay.ProtocolError, match="is an instant, not a span"):
        relay.worker_events([hijack], job, "edge", "w1")
    (sent,) = relay.worker_events([{**hijack, "phase": "instant"}], job, "edge", "w1")
    assert sent["phase"] == "instant" and sent["parent_id"] == "b" * 16
    assert sent["span_id"] not in ("a" * 16, "b" * 16) and sent["event_id"] != "c" * 16
    end = {
        "name": "SubQuery.Execute",
        "phase": "end",
        "span_id": "b" * 16,
        "parent_id": "a" * 16,
        "event_id": "c" * 16,
        "ts": time.time_ns(),
    }
    (ended,) = relay.worker_events([end], job, "edge", "w1")
    assert (ended["span_id"], ended["phase"]) == ("b" * 16, "end")
    assert ended["event_id"] != "c" * 16  # an event id of its own choosing could name another


def test_a_started_item_naming_no_string_ids_changes_nothing() -> None:
    """A list for an id was unhashable and took the worker's socket down (a review)."""
    assert relay.started({"started": True, "run_id": 5, "sq_id": []}, {}) is None
    assert relay.started({"started": True, "run_id": "r", "sq_id": {"a": 1}}, {}) is None


def test_a_workers_buffer_is_its_share_of_its_slots_at_least_one_or_none() -> None:
    assert [buffer_for(slots, 0.5) for slots in (1, 2, 8, 9)] == [1, 1, 4, 4]
    assert buffer_for(8, 0.0) == 0  # FRLM_GATEWAY_BUFFER=0: one job per slot
    assert buffer_for(4, 2.0) == 8


def test_batches_keep_each_message_within_the_size_limit() -> None:
    parts = [json.dumps({"n": i, "text": "x" * 30}) for i in range(10)]
    messages = batches(parts, '"type":"jobs","jobs":', limit=200)
    assert all(len(m) <= 200 for m in messages) and len(messages) > 1
    decoded = [json.loads(m) for m in messages]
    assert {d["type"] for d in decoded} == {"jobs"}
    assert [j["n"] for d in decoded for j in d["jobs"]] == list(range(10))
    (alone,) = batches(['"' + "y" * 300 + '"'], '"type":"jobs","jobs":', limit=200)
    assert json.loads(alone)["jobs"] == ["y" * 300]  # larger than the limit: sent alone


# --- the model endpoint is the worker's own -------------------------------------------------
def test_a_job_cannot_name_the_endpoint_a_worker_calls() -> None:
    decoy = ModelSpec("openai", "m", "http://attacker.example/v1")
    with pytest.raises(ModelError, match="not one of this worker's endpoints"):
        served(decoy)
    # The simulated model is always this worker's own, whatever address the job names.
    assert served(ModelSpec("sim", "s", "http://attacker.example/v1")).base_url == (
        settings.FRLM_SIM_URL
    )


def test_a_run_naming_another_endpoint_for_its_workers_sends_them_nothing(venues) -> None:
    with endpoint(lambda _: (200, b"{}")) as (url, seen):
        run = finish(launch(task="sniah", tokens=20_000, seed=2, worker_base_url=url))
    assert run.status == "succeeded" and run.correct is True, run.error
    assert seen == []


def test_the_gateway_path_is_the_documented_one() -> None:
    assert ws_url("http://10.0.0.5:8000/") == "ws://10.0.0.5:8000/ws/workers/gateway"
    assert ws_url("https://frlm.example") == "wss://frlm.example/ws/workers/gateway"


def test_a_server_that_refuses_the_host_name_gets_a_hint() -> None:
    from workers.client import ControlError, HttpControl

    with endpoint(lambda _: (400, b"<h1>Bad Request (400)</h1>")) as (url, _):
        control = HttpControl(url.removesuffix("/v1"), "frlmt_x", keys.generate())
        with pytest.raises(ControlError) as refused:
            control.register({"name": "n", "venue": "v"})  # type: ignore[typeddict-item]
    assert "add the host of --server (127.0.0.1) to FRLM_ALLOWED_HOSTS" in str(refused.value)


def test_a_workers_credit_grows_with_its_answers_and_halves_for_each_job_it_sits_on() -> None:
    from workers.gateway.credit import LATE_GRACE_S, LATE_TIMES, START, Credit

    credit = Credit("w1", trusted=False)
    assert credit.room(1024) == START and credit.room(8) == 8  # its slots, within its credit
    credit.answered(5, 1024)
    assert credit.room(1024) == START + 5
    credit.answered(10_000, 40)
    assert credit.room(1024) == 40  # never past its slots and buffer
    slow = relay.Held("r1", "1.1", "a" * 16, "b" * 16, 0, "m", timeout_s=10.0)
    sat = relay.Held("r1", "2.1", "c" * 16, "d" * 16, 0, "m", timeout_s=10.0)
    assert credit.overdue([slow], 100.0) == []  # first seen now
    assert credit.overdue([slow, sat], 130.0) == []  # an honest call may take twice 10 s
    late = 100.0 + LATE_TIMES * 10.0 + LATE_GRACE_S + 0.1
    assert credit.overdue([slow, sat], late) == [slow]  # seen at 130, the other is not late
    assert credit.room(1024) == 20
    assert credit.overdue([sat], late + 30) == [sat]
    assert credit.room(1024) == 10
    for _ in range(10):
        credit.overdue([sat], late + 60)
    assert credit.room(1024) == 1  # never none: it may always earn its way back
    assert Credit("w2", trusted=True).room(1024) == 1024  # a trusted venue's: not rationed


def test_a_worker_refused_for_its_addresss_failures_waits_and_tries_again() -> None:
    """Throttled for failures from its address (another process behind the same NAT), a
    worker left for good, as for a refusal connecting again cannot mend (a review): it
    waits what the server says and connects again."""
    from workers.gateway.agent import GatewayAgent, GatewayRefused, GatewayThrottled

    class Said:
        def __init__(self, message: dict) -> None:
            self.message = message

        def recv(self, timeout: float) -> str:
            return json.dumps(self.message)

    throttled = {"type": "error", "error": "too many requests", "fix": "wait", "retry_after": 7}
    with pytest.raises(GatewayThrottled) as caught:
        GatewayAgent._expect(None, Said(throttled), "challenge")  # type: ignore[arg-type]
    assert caught.value.wait_s == 7
    with pytest.raises(GatewayThrottled) as caught:
        GatewayAgent._expect(None, Said({**throttled, "retry_after": 10**9}), "challenge")  # type: ignore[arg-type]
    assert caught.value.wait_s == 3600  # a long window still ends: it tries again then
    with pytest.raises(GatewayRefused):
        GatewayAgent._expect(None, Said({**throttled, "retry_after": None}), "challenge")  # type: ignore[arg-type]


def test_a_session_that_ends_holding_jobs_past_their_timeout_costs_the_worker() -> None:
    """A hoarder dropped its socket just before its jobs went late, for free, and took as
    many again on its next session, for ever (a review)."""
    from workers.gateway.credit import START, Credit

    credit = Credit("w1", trusted=False)
    fresh = relay.Held("r1", "1.1", "a" * 16, "b" * 16, 0, "m", timeout_s=10.0, seen=195.0)
    stale = relay.Held("r1", "2.1", "c" * 16, "d" * 16, 0, "m", timeout_s=10.0, seen=150.0)
    unseen = relay.Held("r1", "3.1", "e" * 16, "f" * 16, 0, "m", timeout_s=10.0)
    credit.left_holding([fresh, unseen], 200.0)
    assert credit.room(1024) == START  # an honest restart: nothing held that long
    credit.left_holding([fresh, stale, stale], 200.0)
    assert credit.room(1024) == START // 4
