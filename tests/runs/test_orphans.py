"""A conductor that dies mid-run: its run does not stay `running` forever."""

from __future__ import annotations

import signal

import pytest

from tests.helpers import finish, launch, scripted, wait_until

pytestmark = [pytest.mark.stack]


def test_it_fails_the_runs_of_a_conductor_that_died(stack, venues):
    run = launch(question=scripted("import time\ntime.sleep(60)", "FINAL('never')"))

    def running() -> bool:
        run.refresh_from_db()
        return run.status == "running"

    wait_until(running, timeout=30, what="the run to start")
    assert run.conductor.startswith("conductor-1:")
    stack.kill("conductor", signal.SIGKILL)
    stack.restart("conductor")  # same name, new process: it fails what the dead one left
    run = finish(run, timeout=30)
    assert run.status == "failed"
    assert "its conductor conductor-1:" in run.error and "stopped while running it" in run.error
    after = finish(launch(question=scripted("FINAL('fine')")))
    assert after.status == "succeeded"  # and it runs new work


def test_it_fails_a_run_the_conductor_cannot_set_up(venues):
    from runs.models import Run
    from runs.services import ContextSpec, run_create, run_launch
    from workers.backends import model_spec

    run = run_create(
        question="anything",
        context=ContextSpec(text="x"),
        policy=None,
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=venues,
    )
    # As if written by a newer version of the product with a setting this one lacks.
    Run.objects.filter(id=run.id).update(policy={**run.policy, "from_the_future": 1})
    run_launch(Run.objects.get(id=run.id))
    run = finish(run, timeout=30)
    assert run.status == "failed"
    assert "could not set the run up: policy.from_the_future is not a policy setting" in run.error
