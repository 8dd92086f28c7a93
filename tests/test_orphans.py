"""A conductor that dies mid-run: its run does not stay `running` forever."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import wait_until
from tests.helpers import finish, launch, scripted

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
