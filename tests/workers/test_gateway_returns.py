"""Jobs given back over the gateway (protocol version 4), by a hostile worker: a worker can
give back only its own jobs, a return names a run's stream only where one exists, and a
malformed return breaks the protocol. The honest path (a web server killed and started
again) is tests/workers/test_gateway_faults.py's."""

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
    """A stranger names the jobs another worker holds, and a run that does not exist: the
    server tells the runs, and the conductor takes a return only from the job's assignee,
    so nothing is sent again; no stream is made for the run that does not exist."""
    wid, key = registered_worker("holder", venue="giveback", concurrency=8)
    thief, thief_key = registered_worker("stranger", venue="givethief", concurrency=2)
    with connect(ws_url(web), open_timeout=10) as ws:
        run, first = first_batch(ws, wid, key, "giveback", seed=9, timeout_s=60)
        assert first
        with connect(ws_url(web), open_timeout=10) as other:
            assert say_hello(other, thief, thief_key, 4)["type"] == "welcome"
            jobs = [{"run_id": job["run_id"], "sq_id": job["sq_id"]} for job in first]
            jobs.append({"run_id": "rnothere0000", "sq_id": "1.1"})
            other.send(json.dumps({"type": "returned", "jobs": jobs}))

            def told() -> bool:
                return any(
                    f[b"status"] == b"returned"
                    for _, f in get_redis().xrange(results_stream(run.id), "-", "+")
                )

            # The holder answers the server's pings meanwhile (silent, it would be dropped)
            # and gets nothing new: its slots are full.
            deadline = time.monotonic() + 20
            while not told() and time.monotonic() < deadline:
                assert not next_messages(ws, {"job", "jobs"}, wait_s=0.2)
            assert told(), "the server did not tell the run of the return"
            assert not next_messages(ws, {"job", "jobs"}, wait_s=1.0)  # the conductor reads it
            ws.send(
                json.dumps(
                    {"type": "results", "results": [signed_answer(j, wid, key) for j in first]}
                )
            )
            serve_run(ws, run, wid, key, forge=set())

    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    stamped = {
        f[b"worker_id"].decode()
        for _, f in get_redis().xrange(results_stream(run.id), "-", "+")
        if f[b"status"] == b"returned"
    }
    assert stamped == {thief}, "the server must stamp a return with who sent it"
    retried = [e for e in named(trace(run), "SubQuery.Retry") if "returned" in e["attrs"]["reason"]]
    assert not retried, f"a stranger's return sent {len(retried)} job(s) again"
    assert not get_redis().exists(results_stream("rnothere0000"))


@pytest.mark.parametrize(
    "jobs, says",
    [
        ("all of them", "returned must list"),
        ([], "returned must list"),
        ([{"run_id": "r1", "sq_id": "1.1"}] * (MAX_RESULTS + 1), "returned must list"),
        ([{"run_id": "r1", "sq_id": 1}], "each a string"),
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
