"""A broker worker killed with -9 mid-run: its death is read from its alive line at once
(not from its presence's TTL), its jobs go to the other worker, the Execute spans it left open
end as abandoned, and the run succeeds with every reply."""

from __future__ import annotations

import signal
import time

import pytest

from frlm_web import presence
from frlm_web.stack import VenueSpec
from tests.helpers import scripted, wait_until
from tests.ownstack import open_spans, own_stack

pytestmark = [pytest.mark.stack]

N = 48


def test_it_sends_a_killed_workers_jobs_elsewhere_and_ends_its_spans(stack, venues, tmp_path):
    from runs.models import Run
    from runs.services import ContextSpec, run_create
    from workers.backends import model_spec

    pair = [
        VenueSpec("local", concurrency=4, sim={"latency_ms": 400}, worker_name=f"fail-w{i}")
        for i in (1, 2)
    ]
    with own_stack(tmp_path, pair) as own:
        ids = {w["label"]: w["worker_id"] for w in presence.alive(own.client, "venue:local")}
        victim = ids["fail-w1"]
        program = f"rs = llm_query_batched(['question %d' % i for i in range({N})])\n"
        program += "FINAL(str(sum(1 for r in rs if r and not r.startswith('[frlm'))))"
        run = run_create(
            question=scripted(program),
            context=ContextSpec(text="x"),
            policy={"max_retries": 3},
            root_model=model_spec("sim", role="root"),
            worker_model=model_spec("sim", role="worker"),
            venues=["local"],
        )
        own.launch_run(run.id)

        def victim_busy() -> bool:
            return any(
                e["name"] == "SubQuery.Execute" and e["worker_id"] == victim
                for e in own.events(run.id)
            )

        wait_until(victim_busy, timeout=60, every=0.02, what="the victim's first job")
        own.kill("worker-fail-w1", signal.SIGKILL)
        killed_ns = time.time_ns()

        def done() -> Run | None:
            found = Run.objects.get(id=run.id)
            return found if found.done else None

        run = wait_until(done, timeout=120, what="the run to end")
        assert run.status == "succeeded", run.error
        assert run.answer == str(N)
        # The run's row is written before its last events (Run.Done, then its span's end):
        # read the stream once the run's span has ended.
        events = wait_until(
            lambda: (
                (ev := own.events(run.id))
                and any(e["name"] == "Run.Init" and e["phase"] == "end" for e in ev)
                and ev
            ),
            timeout=10,
            what="the run's span to end",
        )
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
