"""Replay from a run's cassette: exact re-execution, and what-if from a root turn on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.test import override_settings

from frlm_web import presence
from frlm_web.redis_client import get_redis
from runs.models import Run
from tests.helpers import finish, launch, named, scripted, trace, wait_until
from traces import store
from traces.diff import run_diff
from workers.models import worker_queue
from workers.venues import presence_group

pytestmark = [pytest.mark.stack]


def replay(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "frlm_replay", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def settled(run: Run, quiet_s: float = 3.0) -> list[dict]:
    """The run's stored events once none has come for `quiet_s`: the workers of attempts it
    cut off end their Execute spans after the run has ended (a slow one, seconds after)."""
    events, quiet_since = trace(run), time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        time.sleep(0.5)
        now = store.read_events(run.id)
        if len(now) != len(events):
            events, quiet_since = now, time.monotonic()
    return events


def shape(events: list[dict]) -> Counter:
    return Counter((e["name"], e["phase"], e["depth"]) for e in events)


def test_it_replays_a_run_exactly_with_no_model_calls(venues, subprocess_env):
    original = finish(launch(task="sniah", tokens=60_000, seed=3))
    assert original.status == "succeeded" and original.correct, original.error
    done = replay(subprocess_env, original.id, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    copy = Run.objects.get(id=result["run_id"])
    assert copy.replay_of_id == original.id and copy.replay_turn is None
    assert copy.answer == original.answer and copy.correct
    assert (copy.turns, copy.subqueries, copy.tokens_in) == (
        original.turns,
        original.subqueries,
        original.tokens_in,
    )
    before, after = trace(original), trace(copy)
    assert shape(after) == shape(before)
    model_ends = named(after, "Run.Decode", "end") + named(after, "SubQuery.Execute", "end")
    assert model_ends and all(e["attrs"].get("replayed") is True for e in model_ends)


def test_it_goes_live_after_the_replayed_turns_with_a_changed_policy(venues, subprocess_env):
    batch = (
        "rs = llm_query_batched(['q %d' % i for i in range(20)])\n"
        "print(sum(r.startswith('[frlm:') for r in rs))"
    )
    sim = {"latency_ms": 40, "straggler_rate": 0.3, "straggler_factor": 25, "seed": 11}
    # Hedging would cancel the stragglers' twins: this test is about the quorum's cancels.
    original = finish(
        launch(
            question=scripted("print('turn one')", batch, "FINAL('done')"),
            worker_sim=sim,
            policy={"hedge": "off"},
        )
    )
    assert original.status == "succeeded", original.error
    assert not named(trace(original), "SubQuery.Cancel")

    done = replay(
        subprocess_env, original.id, "--from-turn", "1", "--set", "policy.quorum=0.6", "--json"
    )
    assert done.returncode == 0, done.stderr
    copy = Run.objects.get(id=json.loads(done.stdout)["run_id"])
    assert copy.replay_turn == 1 and copy.policy["quorum"] == 0.6
    events = trace(copy)
    turn_of = {e["span_id"]: e["attrs"]["turn"] for e in named(events, "Run.Decode", "start")}
    decodes = {turn_of[e["span_id"]]: e for e in named(events, "Run.Decode", "end")}
    assert decodes[1]["attrs"].get("replayed") is True  # from the cassette
    assert not decodes[2]["attrs"].get("replayed")  # live: the policy applies from here
    cancels = named(events, "SubQuery.Cancel")
    assert cancels and all("quorum of 12/20" in e["attrs"]["reason"] for e in cancels)
    # The diff puts the first divergence exactly there: the quorum decision of turn 2's batch.
    divergence = run_diff(original.id, copy.id)["first_divergence"]
    assert divergence["kind"] == "quorum", divergence
    assert "Repl.Exec[turn=2 cell=2]" in divergence["path"], divergence


def test_it_rejects_what_it_cannot_replay(venues, subprocess_env):
    original = finish(launch(question=scripted("FINAL('x')")))
    checks = [
        (["nope"], "no run 'nope'"),
        # Each under the option that sets it, not the service's field name (a review).
        (
            [original.id, "--set", "policy.quorum=0.5"],
            "--from-turn: a full replay only plays the recording back; to change the policy or "
            "a model, say from which root turn on to go live\n",
        ),
        ([original.id, "--from-turn", "9"], "--from-turn: run r"),
        ([original.id, "--from-turn", "9"], "has root turns 1 to 1; got 9"),
        (
            [original.id, "--from-turn", "0", "--set", "policy.quorum=7"],
            "--set: policy.quorum must be",
        ),
        # It named --policy, which frlm_replay does not have (found by a review).
        ([original.id, "--from-turn", "1", "--set", "quorum"], "argument --set: takes KEY="),
    ]
    before = Run.objects.count()
    for args, message in checks:
        done = replay(subprocess_env, *args)
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr)
    assert Run.objects.count() == before


def test_a_full_replay_follows_the_recorded_hedges_and_diffs_clean(swarm_factory, subprocess_env):
    """The original hedged its stragglers on its timers; the replay answers in milliseconds,
    so deciding again it would hedge nothing. It follows the recording's hedges instead."""
    # One slow worker in eight: its jobs stand out past the venue's p95 (as in test_trust).
    swarm_factory("rehedge", 8, latency=60, slow_share=0.125, slow_factor=30)
    batch = "rs = llm_query_batched(['h %d' % i for i in range(64)])\nprint(len(rs))"
    policy = {"explore": 0, "hedge": "p95", "subquery_timeout_s": 30}
    original = finish(
        launch(question=scripted(batch, "FINAL('done')"), venues=["rehedge"], policy=policy)
    )
    assert original.status == "succeeded", original.error
    # The replay reads its book from the whole recording: the slow worker's hedged-away
    # attempts run to their end after the run has (seconds later), so wait for their events
    # (seen in CI: the replay, started before they were stored, diffed).
    hedges = named(settled(original), "SubQuery.Hedge")
    assert hedges, "the original should have hedged its stragglers"

    done = replay(subprocess_env, original.id, "--json")
    assert done.returncode == 0, done.stderr
    copy = Run.objects.get(id=json.loads(done.stdout)["run_id"])
    events = settled(copy)
    assert len(named(events, "SubQuery.Hedge")) == len(hedges)
    assert all(e["attrs"].get("replayed") is True for e in named(events, "SubQuery.Hedge"))
    hedged = {e["attrs"]["attempt"] for e in named(events, "SubQuery.Hedge")}
    assert hedged == {e["attrs"]["attempt"] for e in hedges}
    assert run_diff(original.id, copy.id)["first_divergence"] is None


def test_a_full_replay_follows_the_recorded_retries_and_quorum_cut_and_diffs_clean(
    swarm_factory, subprocess_env
):
    """The original's workers failed some attempts (retried elsewhere, some given up on) and
    its quorum cut off the slow worker's sub-queries. The replay's workers answer every job
    from the recording at once: deciding again it would retry nothing and cut off others.
    It follows the recording's attempts and cut instead."""
    # A failed call is tried again once by the worker's model client, an independent draw:
    # a sub-query fails back to the conductor with failure_rate squared. At 0.3 (9%), none
    # of the ~33 the fast workers answer failed in about one run in twenty (seen in CI: no
    # retry to follow); at 0.5 (25%), about one in ten thousand.
    swarm_factory("refail", 6, latency=60, failure_rate=0.5, slow_share=0.17, slow_factor=25)
    batch = "rs = llm_query_batched(['f %d' % i for i in range(40)])\nprint(len(rs))"
    policy = {
        "explore": 0,
        "hedge": "off",
        "quorum": 0.8,
        "max_retries": 1,
        "subquery_timeout_s": 30,
    }
    # Whether a run retries and whether its quorum cuts anything off are draws of the
    # simulated failures (a batch with more given-up sub-queries waits for the slow worker
    # and cuts nothing: seen in CI). The replay is what is tested: an original that has
    # both to follow is run until one does.
    for _ in range(5):
        original = finish(
            launch(question=scripted(batch, "FINAL('done')"), venues=["refail"], policy=policy)
        )
        assert original.status == "succeeded", original.error
        before = settled(original)  # the replay reads its book from the whole recording
        retries, cancels = named(before, "SubQuery.Retry"), named(before, "SubQuery.Cancel")
        if retries and cancels:
            break
    else:
        pytest.fail("five originals in a row had no retry or no quorum cut for a replay to follow")
    assert all("quorum of 32/40" in e["attrs"]["reason"] for e in cancels)

    done = replay(subprocess_env, original.id, "--json")
    assert done.returncode == 0, done.stderr
    copy = Run.objects.get(id=json.loads(done.stdout)["run_id"])
    after = settled(copy)

    # Sub-queries are numbered alike in both runs: the same attempts retried and cut off.
    def sq_ids(events: list[dict], name: str) -> Counter:
        return Counter(e["attrs"]["sq_id"] for e in named(events, name))

    assert sq_ids(after, "SubQuery.Cancel") == sq_ids(before, "SubQuery.Cancel")
    executes = Counter(e["attrs"]["sq_id"] for e in named(before, "SubQuery.Execute", "start"))
    assert Counter(e["attrs"]["sq_id"] for e in named(after, "SubQuery.Execute", "start")) == (
        executes
    )
    assert len(named(after, "SubQuery.Retry")) == len(retries)
    failed = Counter(e["status"] for e in named(before, "SubQuery.Submit", "end"))
    assert Counter(e["status"] for e in named(after, "SubQuery.Submit", "end")) == failed
    divergence = run_diff(original.id, copy.id)["first_divergence"]
    # A known race, not followed yet (issue 18's note): a job the quorum cuts off in the
    # instant its worker takes it ends its Execute span as "cancelled" (the worker saw the
    # cancel first) or not, in the recording as in the replay; seen once in CI.
    if divergence is not None:
        values = divergence["a"]["value"] + divergence["b"]["value"]
        assert divergence["kind"] == "quorum", divergence
        assert "cancelled before they were sent" in values, divergence


def test_a_full_replay_times_out_the_recorded_attempts_and_diffs_clean(
    swarm_factory, subprocess_env
):
    """The original's slow worker let its attempts (and those queued behind them) pass the
    sub-query timeout, and they were tried again elsewhere. The replay's worker answers at
    once: it times out the same attempts instead of taking their replies."""
    # Its replies take 6 s, the timeout is 3 s: margins for a busy machine. Two jobs a
    # worker, so the slow one's timeouts stay below the venue's circuit breaker.
    swarm_factory("retime", 6, latency=60, slow_share=0.17, slow_factor=100)
    batch = "rs = llm_query_batched(['t %d' % i for i in range(12)])\nprint(len(rs))"
    policy = {"explore": 0, "hedge": "off", "max_retries": 1, "subquery_timeout_s": 3}
    original = finish(
        launch(question=scripted(batch, "FINAL('done')"), venues=["retime"], policy=policy)
    )
    assert original.status == "succeeded", original.error
    before = settled(original)
    timeouts = Counter(e["attrs"]["sq_id"] for e in named(before, "SubQuery.Timeout"))
    assert timeouts, "the slow worker's attempts should have timed out"

    done = replay(subprocess_env, original.id, "--json")
    assert done.returncode == 0, done.stderr
    copy = Run.objects.get(id=json.loads(done.stdout)["run_id"])
    after = settled(copy)
    assert Counter(e["attrs"]["sq_id"] for e in named(after, "SubQuery.Timeout")) == timeouts
    assert len(named(after, "SubQuery.Retry")) == len(named(before, "SubQuery.Retry"))
    assert run_diff(original.id, copy.id)["first_divergence"] is None


def test_a_replay_whose_worker_dies_answers_its_jobs_on_another(swarm_factory, subprocess_env):
    """A worker of the replay dies (-9) as it starts: the recording's workers did not, so
    the book has no attempt for the retries that follow. They go, carrying the recorded
    reply, and the replay ends at once; withheld as attempts no recorded worker started,
    each waited out its sub-query's timeout (bench/replay.py: 39 of them, 61 s)."""
    swarm = swarm_factory("relost", 2, latency=40)
    batch = "rs = llm_query_batched(['l %d' % i for i in range(16)])\nprint(len(rs))"
    policy = {"explore": 0, "hedge": "off", "subquery_timeout_s": 20}
    original = finish(
        launch(question=scripted(batch, "FINAL('done')"), venues=["relost"], policy=policy)
    )
    assert original.status == "succeeded", original.error
    settled(original)

    # The construction: the dead worker's presence entry still stands (the product's lasts
    # FRLM_VENUE_HEARTBEAT_TTL_S past its last beat), so the replay gives it a share of its
    # jobs; once they wait on its queue, its entry goes (as it lapses), so the replay finds
    # it lost and tries them again. The swarm, which starts a dead device again, is held
    # still meanwhile: a device started again before the replay sent its jobs took the
    # dead one's place, and none went to the dead one (a CI run on a loaded machine).
    dead = swarm.wait_up()[0]
    client, group = get_redis(), presence_group("relost")
    os.kill(swarm.proc.pid, signal.SIGSTOP)
    try:
        os.kill(int(dead["pid"]), signal.SIGKILL)
        with override_settings(FRLM_VENUE_HEARTBEAT_TTL_S=30):
            presence.announce(client, group, dead["name"], dead)
        running = subprocess.Popen(
            [sys.executable, "manage.py", "frlm_replay", original.id, "--json"],
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(
            lambda: client.llen(worker_queue(dead["worker_id"])) > 0,
            timeout=60,
            what="the replay's jobs on the dead worker's queue",
        )
        presence.withdraw(client, group, dead["name"])
        out, err = running.communicate(timeout=120)
    finally:
        os.kill(swarm.proc.pid, signal.SIGCONT)
    done = subprocess.CompletedProcess(running.args, running.returncode, out, err)
    assert done.returncode == 0, done.stderr
    copy = Run.objects.get(id=json.loads(done.stdout)["run_id"])
    events = settled(copy)
    lost = [e for e in named(events, "SubQuery.Retry") if "was lost" in e["attrs"]["reason"]]
    assert lost, "the replay should have sent jobs to the dead worker (the construction)"
    assert not named(events, "SubQuery.Timeout")
    ends = named(events, "SubQuery.Submit", "end")
    assert len(ends) == 16 and all(e["status"] == "ok" for e in ends), Counter(
        e["status"] for e in ends
    )
    assert copy.status == "succeeded" and copy.wall_ms < 15_000, (copy.status, copy.wall_ms)
