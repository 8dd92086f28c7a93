"""A conductor killed mid-run with nothing else but the web server up: its lease lapses, and
the web server fails the run with the reason and ends its open spans as abandoned."""

from __future__ import annotations

import signal
import time
from decimal import Decimal

import pytest
from django.conf import settings

from frlm_web.stack import VenueSpec
from tests.helpers import scripted, wait_until
from tests.ownstack import open_spans, own_stack

pytestmark = [pytest.mark.stack]


def _create(question: str, venues: list[str]):
    from runs.services import ContextSpec, run_create
    from workers.backends import model_spec

    return run_create(
        question=question,
        context=ContextSpec(text="x"),
        policy=None,
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=venues,
    )


def test_it_fails_the_run_of_a_dead_conductor_from_the_web_server(stack, venues, tmp_path):
    from runs.models import Run

    worker = VenueSpec("local", concurrency=2, sim={"latency_ms": 20}, worker_name="lease-w1")
    with own_stack(tmp_path, [worker], web=True) as own:
        program = "rs = llm_query_batched(['part %d' % i for i in range(6)])\nprint(rs)"
        run = _create(
            scripted(program, "import time\ntime.sleep(120)", "FINAL('never')"), ["local"]
        )
        own.launch_run(run.id)

        def second_cell() -> bool:
            cells = [e for e in own.events(run.id) if e["name"] == "Repl.Exec"]
            return len({e["span_id"] for e in cells}) >= 2

        wait_until(second_cell, timeout=60, what="the run's second cell")
        own.kill("conductor", signal.SIGKILL)
        killed = time.monotonic()

        def failed() -> Run | None:
            found = Run.objects.get(id=run.id)
            return found if found.status == Run.Status.FAILED else None

        # The lease lapses after FRLM_RUN_LEASE_TTL_S; the web server looks every second.
        done = wait_until(failed, timeout=settings.FRLM_RUN_LEASE_TTL_S + 30, what="the failure")
        took = time.monotonic() - killed
        assert "its lease on the run lapsed" in done.error and "conductor-1:" in done.error
        assert took < settings.FRLM_RUN_LEASE_TTL_S + 10, took
        events = wait_until(
            lambda: (ev := own.events(run.id)) and not open_spans(ev) and ev,
            timeout=10,
            what="every span ended",
        )
        abandoned = {e["name"] for e in events if e["status"] == "abandoned"}
        assert {"Run.Init", "Repl.Exec"} <= abandoned
        (done_event,) = [e for e in events if e["name"] == "Run.Done"]
        assert done_event["status"] == "error"
        assert "its lease on the run lapsed" in done_event["attrs"]["error"]
        assert done_event["attrs"]["abandoned_by"].startswith("web@")
        # What it spent before it was lost is on its row, read from its trace: the row
        # said $0 and no tokens, and its receipts could not be verified (a review).
        receipts = [e for e in events if e["name"] == "Receipt.Emit"]
        assert len(receipts) == 6
        paid = [e for e in events if e["name"] == "SubQuery.Submit" and e["phase"] == "end"]
        row = Run.objects.get(id=run.id)
        assert row.subqueries == 6 and row.tokens_in > 0
        assert row.cost == sum(Decimal(str(e["cost"] or 0)) for e in paid) + sum(
            Decimal(str(e["cost"] or 0))
            for e in events
            if e["name"] == "Run.Decode" and e["phase"] == "end"
        )
        assert row.cost > 0 and done_event["cost"] == pytest.approx(float(row.cost))
        chain = row.accounts["receipts"]
        assert chain["count"] == 6 and chain["head"] == receipts[-1]["attrs"]["hash"]
        assert "read from the run's trace" in chain["source"]
        from runs.trust.receipts import run_recorded_chain

        # frlm_receipts verify checks against it, and says it was read from the trace.
        assert run_recorded_chain(run.id)["source"] == chain["source"]


def test_it_keeps_a_stalled_conductors_run_and_fails_one_stalled_past_its_lease(
    stack, venues, tmp_path
):
    """A conductor frozen (SIGSTOP, as a starved one is) for less than the lease's TTL keeps
    its run; frozen past it, its run is failed by the other conductor's watch, and once it
    thaws it stops that run and writes nothing over the failure."""
    import os

    from runs.models import Run

    worker = VenueSpec("local", concurrency=2, sim={"latency_ms": 20}, worker_name="lease-w2")
    with own_stack(tmp_path, [worker], web=True) as own:
        conductor = own.procs["conductor"].popen

        def freeze(seconds: float) -> None:
            os.killpg(conductor.pid, signal.SIGSTOP)
            time.sleep(seconds)
            os.killpg(conductor.pid, signal.SIGCONT)

        short = _create(scripted("import time\ntime.sleep(3)", "FINAL('kept')"), ["local"])
        own.launch_run(short.id)
        wait_until(
            lambda: any(e["name"] == "Repl.Exec" for e in own.events(short.id)),
            timeout=60,
            what="the first run's cell",
        )
        freeze(settings.FRLM_RUN_LEASE_TTL_S - 4)
        kept = wait_until(
            lambda: (r := Run.objects.get(id=short.id)).done and r, timeout=60, what="run 1"
        )
        assert kept.status == "succeeded" and kept.answer == "kept", kept.error

        long = _create(scripted("import time\ntime.sleep(30)", "FINAL('late')"), ["local"])
        own.launch_run(long.id)
        wait_until(
            lambda: any(e["name"] == "Repl.Exec" for e in own.events(long.id)),
            timeout=60,
            what="the second run's cell",
        )
        freeze(settings.FRLM_RUN_LEASE_TTL_S + 4)
        failed = Run.objects.get(id=long.id)
        assert failed.status == "failed" and "its lease on the run lapsed" in failed.error
        # Thawed, it finds its lease gone, stops the run and records nothing over it.
        time.sleep(5)
        after = Run.objects.get(id=long.id)
        assert (after.status, after.error) == (failed.status, failed.error)
        events = own.events(long.id)
        assert len([e for e in events if e["name"] == "Run.Done"]) == 1
        assert "its lease was taken away as lapsed" in own.log_tail("conductor", 200)


def test_a_holder_takes_back_a_lease_lost_with_redis_but_not_one_taken_from_it(stack):
    from frlm_web.redis_client import get_redis
    from runs.engine.progress import cancel_requested
    from runs.lease import LEASES_KEY, LeaseKeeper, reaped_key

    client = get_redis()
    keeper = LeaseKeeper(client)
    keeper.held.add("lease-t1")  # held without its renewal thread: renew() by hand
    client.zadd(LEASES_KEY, {"lease-t1": time.time() + 8})
    try:
        client.zrem(LEASES_KEY, "lease-t1")  # as a Redis restarted without its data
        keeper.renew()
        assert client.zscore(LEASES_KEY, "lease-t1") and not keeper.lost("lease-t1")
        client.zrem(LEASES_KEY, "lease-t1")  # as a watcher does, leaving its mark
        client.set(reaped_key("lease-t1"), "web", ex=60)
        keeper.renew()
        assert keeper.lost("lease-t1") and cancel_requested(client, "lease-t1")
        assert client.zscore(LEASES_KEY, "lease-t1") is None
    finally:
        client.zrem(LEASES_KEY, "lease-t1")
        client.delete(reaped_key("lease-t1"), "frlm:run:lease-t1:cancel")


def test_a_holder_knows_its_lease_was_taken_before_its_next_renewal(stack):
    """A run told to stop by the cancel a watcher set can end within a quarter of a
    second (its cell is stopped at once), before the holder's next renewal has seen the
    lease gone: asked at the run's end, the holder must still know, or the run records
    its outcome over the watcher's failure (a second Run.Done, seen once in
    test_it_keeps_a_stalled_conductors_run...)."""
    from frlm_web.redis_client import get_redis
    from runs.lease import LEASES_KEY, LeaseKeeper, reaped_key

    client = get_redis()
    keeper = LeaseKeeper(client)
    keeper.held.add("lease-t2")  # held without its renewal thread
    try:
        client.zadd(LEASES_KEY, {"lease-t2": time.time() + 8})
        assert not keeper.lost("lease-t2")
        client.zrem(LEASES_KEY, "lease-t2")  # as a watcher does, leaving its mark
        client.set(reaped_key("lease-t2"), "web", ex=60)
        assert keeper.lost("lease-t2")
    finally:
        client.zrem(LEASES_KEY, "lease-t2")
        client.delete(reaped_key("lease-t2"))


def test_a_lapse_the_watcher_could_not_act_on_is_acted_on_at_its_next_round(
    stack, venues, monkeypatch
):
    """The watcher took a lapsed lease out of the set before failing its run: a database
    locked at that moment (SQLite under load) lost the lapse for good, and the run stayed
    `running` with its conductor dead. (A CI run once waited in vain for the web server to
    fail a dead conductor's run; its logs were gone, and this is one way that happens.)"""
    from urllib.parse import urlsplit

    import redis
    from django.db import OperationalError

    from runs import lease
    from runs.models import Run

    run = _create("FINAL('x')", ["local"])
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    # A database of the session's Redis that no process watches: the stack's conductor
    # reaps the leases of the usual one every second, and would take this lapse first.
    url = urlsplit(settings.REDIS_URL)._replace(path="/15").geturl()
    client = redis.Redis.from_url(url)
    client.zadd(lease.LEASES_KEY, {run.id: time.time() - 1})
    client.hset(lease.HOLDERS_KEY, run.id, "conductor-9:1")
    real = lease.run_abandon

    def locked(*_args, **_kwargs):
        raise OperationalError("database is locked")

    try:
        monkeypatch.setattr(lease, "run_abandon", locked)
        assert lease.leases_reap(client, by="web-t") == []
        assert Run.objects.get(id=run.id).status == Run.Status.RUNNING
        monkeypatch.setattr(lease, "run_abandon", real)
        assert lease.leases_reap(client, by="web-t") == [run.id]
        failed = Run.objects.get(id=run.id)
        assert failed.status == Run.Status.FAILED and "conductor-9:1" in failed.error
    finally:
        client.flushdb()
