"""Jobs given back over the gateway (protocol version 5), by a hostile worker: a worker can
give back only jobs given to it (each named with its grant), a return names a run's stream
only where one exists, and a malformed return breaks the protocol. The honest path (a web
server killed and started again) is tests/workers/test_gateway_faults.py's."""

from __future__ import annotations

import json
import time

import pytest
import websockets
from websockets.sync.client import connect

from frlm_web.redis_client import get_redis
from tests.gateway import (
    first_batch,
    named,
    next_messages,
    registered_worker,
    say_hello,
    serve_run,
    signed_answer,
)
from tests.helpers import trace
from workers.gateway.agent import ws_url
from workers.gateway.protocol import MAX_RESULTS
from workers.jobs import results_stream

pytestmark = pytest.mark.timeout(240)


def test_a_worker_cannot_give_back_another_workers_jobs(web, venues) -> None:
    """A stranger names the jobs another worker holds, with their grants (which it cannot
    see: a grant is made for the worker given the job), and a run that does not exist:
    the server tells no run, so nothing is sent again; no stream is made for the run that
    does not exist. Before grants (version 4) the server wrote each return down and only
    the conductor's check of the assignee stood between it and the holder's work."""
    wid, key = registered_worker("holder", venue="giveback", concurrency=8)
    thief, thief_key = registered_worker("stranger", venue="givethief", concurrency=2)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "giveback", seed=9, timeout_s=60)
        assert first
        with connect(ws_url(web), open_timeout=10) as other:
            assert say_hello(other, thief, thief_key, 4)["type"] == "welcome"
            jobs = [{k: job[k] for k in ("run_id", "sq_id", "grant")} for job in first]
            jobs.append({"run_id": "rnothere0000", "sq_id": "1.1", "grant": "0" * 32})
            other.send(json.dumps({"type": "returned", "jobs": jobs}))
            # The holder answers the server's pings meanwhile (silent, it would be dropped)
            # and gets nothing new: its slots are full.
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                ws.send(json.dumps({"type": "beat", "figures": {"inflight": 8}}))
                assert not next_messages(ws, {"job", "jobs"}, wait_s=0.2)
            ws.send(
                json.dumps(
                    {"type": "results", "results": [signed_answer(j, wid, key) for j in first]}
                )
            )
            serve_run(ws, run, wid, key, forge=set())

    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    told = [
        f
        for _, f in get_redis().xrange(results_stream(run.id), "-", "+")
        if f[b"status"] == b"returned"
    ]
    assert not told, f"the server wrote down {len(told)} return(s) the stranger had no grant for"
    retried = [e for e in named(trace(run), "SubQuery.Retry") if "returned" in e["attrs"]["reason"]]
    assert not retried, f"a stranger's return sent {len(retried)} job(s) again"
    assert not get_redis().exists(results_stream("rnothere0000"))


@pytest.mark.parametrize(
    "jobs, says",
    [
        ("all of them", "returned must list"),
        ([], "returned must list"),
        ([{"run_id": "r1", "sq_id": "1.1"}] * (MAX_RESULTS + 1), "returned must list"),
        ([{"run_id": "r1", "sq_id": 1, "grant": "0" * 32}], "each a string"),
        ([{"run_id": "r1", "sq_id": "1.1"}], "each a string"),  # no grant
        ([{"run_id": "r" * 65, "sq_id": "1.1"}], "each a string"),
        (["r1/1.1"], "each a string"),
    ],
)
def test_a_malformed_return_breaks_the_protocol(web, venues, jobs, says) -> None:
    wid, key = registered_worker("badreturn", venue="badreturn")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key, 4)["type"] == "welcome"
        ws.send(json.dumps({"type": "returned", "jobs": jobs}))
        while True:
            message = json.loads(ws.recv(timeout=10))
            if message["type"] == "error":
                break
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
    assert says in message["error"], message
    assert closed.value.rcvd.code == 4400


def test_a_grant_that_is_not_ascii_is_ignored_not_a_crash(web, venues) -> None:
    """A return whose grant is text beyond ASCII: hmac.compare_digest refused it with a
    TypeError, which broke the session's handler (daphne closed the socket 1011 with no
    word, and the session lived on until its watch found it silent, a review). It is a
    grant made for nobody: ignored, and the session goes on."""
    wid, key = registered_worker("asciireturn", venue="asciireturn")
    with connect(ws_url(web), open_timeout=10) as ws:
        assert say_hello(ws, wid, key, 5)["type"] == "welcome"
        item = {"run_id": "r1", "sq_id": "1.1", "grant": "é" * 32}
        ws.send(json.dumps({"type": "returned", "jobs": [item]}))
        pings = 0
        while pings < 2:
            message = json.loads(ws.recv(timeout=10))
            assert message["type"] != "error", message
            if message["type"] == "ping":
                pings += 1
                ws.send(json.dumps({"type": "pong", "t": message["t"]}))
