"""A broker worker killed with -9 mid-run: its death is read from its alive line at once
(not from its presence's TTL), its jobs go to the other worker, the Execute spans it left open
end as abandoned, and the run succeeds with every reply."""

from __future__ import annotations

import signal
import time

import pytest

from frlm_web import presence
from frlm_web.stack import VenueSpec
from tests.helpers import wait_until
from tests.ownstack import open_spans, own_stack

pytestmark = [pytest.mark.stack]

N = 48


def test_it_sends_a_killed_workers_jobs_elsewhere_and_ends_its_spans(stack, venues, tmp_path):
    pair = [
        VenueSpec("local", concurrency=4, sim={"latency_ms": 400}, worker_name=f"fail-w{i}")
        for i in (1, 2)
    ]
    with own_stack(tmp_path, pair) as own:
        ids = {w["label"]: w["worker_id"] for w in presence.alive(own.client, "venue:local")}
        victim = ids["fail-w1"]
        run_id = own.launch_counting_run(N, "local")

        def victim_busy() -> bool:
            return any(
                e["name"] == "SubQuery.Execute" and e["worker_id"] == victim
                for e in own.events(run_id)
            )

        wait_until(victim_busy, timeout=60, every=0.02, what="the victim's first job")
        own.kill("worker-fail-w1", signal.SIGKILL)
        killed_ns = time.time_ns()
        run, events = own.ended(run_id)
        assert run.status == "succeeded", run.error
        assert run.answer == str(N)
        (lost,) = [e for e in events if e["name"] == "Worker.Lost"]
        assert lost["worker_id"] == victim
        abandoned = [
            e for e in events if e["name"] == "SubQuery.Execute" and e["status"] == "abandoned"
        ]
        assert abandoned and all(e["worker_id"] == victim for e in abandoned)
        assert all("was lost while it held it" in e["attrs"]["error"] for e in abandoned)
        assert open_spans(events) == []
        retries = [e["ts"] for e in events if e["name"] == "SubQuery.Retry"]
        assert retries and min(retries) > killed_ns - 1e9
