"""A worker told to stop (SIGTERM) leaves presence as it goes, so no run sends it work it
will never do; and it stops within seconds when what it talks to is gone: a
broker worker whose Redis was killed with -9, a gateway worker whose web server was. Each
waited first: the broker worker a minute and more on its last beat and its deregistration
(the Redis client rides out an outage), the gateway worker its back-off between attempts
to connect again. A review's workers, their stack gone, outlived 8 s of SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import redis

from frlm_web import presence
from frlm_web.stack import VenueSpec
from runs.orphans import CONDUCTOR_GROUP
from tests.gateway import GatewayWorker
from tests.helpers import wait_until
from tests.ownstack import own_stack
from workers.venues import live_workers

pytestmark = pytest.mark.timeout(240)


def _stop_took(proc: subprocess.Popen, limit: float) -> float:
    """SIGTERM to the process's group, and the seconds until it exited (killed with -9
    past `limit`, so a failure leaves nothing behind)."""
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return time.monotonic() - sent


def _in_presence(client: redis.Redis, label: str) -> dict:
    """The presence entry of the `local` worker named `label`, once it has one."""

    def entry() -> dict | None:
        return next((w for w in presence.alive(client, "venue:local") if w["label"] == label), None)

    return wait_until(entry, timeout=60, what=f"{label} in presence")


def test_a_broker_worker_told_to_stop_leaves_presence_as_it_goes(venues, tmp_path) -> None:
    """Its deregistration takes its entry out of presence with its own Redis user (a
    broker worker registers in-process). Its user could not set the bar that keeps the
    entry out, so the whole withdrawal failed ("Redis is unreachable", it said), and the
    entry stood until it expired: a replay started meanwhile sent a worker's share of its
    jobs to it, and each waited for the worker to be found lost (bench/replay.py)."""
    spec = VenueSpec("local", concurrency=2, worker_name="stop-w2")
    with own_stack(tmp_path, [spec]) as own:
        worker_id = _in_presence(own.client, "stop-w2")["name"]
        own.client.acl_log_reset()
        took = _stop_took(own.procs["worker-stop-w2"].popen, 30)
        log = own.log_tail("worker-stop-w2", 30)
        # Gone now, not left to lapse (the stack's entries last 3 s past their last beat).
        assert presence.entry(own.client, "venue:local", worker_id) is None, log
        assert took < 10, log
        assert "could not withdraw" not in log, log
        # Its role may not delete its queue's bindings (queue_bindings_forget leaves them
        # to the sweep); nothing of presence may be refused.
        refused = [e.get("object") for e in own.client.acl_log()]
        assert not [o for o in refused if o in ("set", "zrem", "hdel") or "presence" in o], refused


def test_a_broker_worker_whose_redis_was_killed_stops_within_seconds(venues, tmp_path) -> None:
    spec = VenueSpec("local", concurrency=2, worker_name="stop-w1")
    with own_stack(tmp_path, [spec]) as own:
        _in_presence(own.client, "stop-w1")
        own.kill("redis", signal.SIGKILL)
        time.sleep(1.5)  # a beat or two meets the outage
        worker = own.procs["worker-stop-w1"].popen
        took = _stop_took(worker, 40)
        log = own.log_tail("worker-stop-w1", 30)
        assert took < 12, f"stopped {took:.1f} s after SIGTERM:\n{log}"
        assert "could not deregister" in log, log


def test_a_conductor_whose_redis_was_killed_stops_within_seconds(venues, tmp_path) -> None:
    """The conductor's shutdown takes its presence entry out; with Redis gone its client
    rode the outage out there, and the stack killed it 15 s after SIGTERM."""
    with own_stack(tmp_path, []) as own:
        wait_until(lambda: presence.alive(own.client, CONDUCTOR_GROUP), timeout=30, what="presence")
        # Its consumer waits on the runs queue: it has started (its start's housekeeping
        # done or under way off that thread).
        wait_until(
            lambda: any(
                c.get("user") == "conductor" and c.get("cmd") == "brpop"
                for c in own.client.client_list()
            ),
            timeout=30,
            what="the conductor's consumer",
        )
        own.kill("redis", signal.SIGKILL)
        time.sleep(1.5)
        took = _stop_took(own.procs["conductor"].popen, 40)
        assert took < 6, f"stopped {took:.1f} s after SIGTERM:\n{own.log_tail('conductor', 30)}"


def test_a_gateway_worker_whose_server_was_killed_stops_at_once(venues, tmp_path) -> None:
    with own_stack(tmp_path, [], web=True) as own:
        server = f"http://127.0.0.1:{own.web_port}"
        worker = GatewayWorker(server, "far", "stop-far", tmp_path, "--concurrency", "2")
        try:
            wait_until(
                lambda: any(w["label"] == "stop-far" for w in live_workers(own.client, "far")),
                timeout=60,
                what="the worker in the own stack's presence",
            )
            own.kill("web", signal.SIGKILL)
            # Its longest wait between attempts to connect again (5 s) has begun.
            wait_until(
                lambda: "connecting again in 5 s" in worker.log.read_text(errors="replace"),
                timeout=60,
                what="the worker's back-off to reach 5 s",
            )
            took = _stop_took(worker.proc, 30)
        finally:
            worker.kill()
        assert took < 2.5, f"stopped {took:.1f} s after SIGTERM:\n{worker.log.read_text()[-2000:]}"
