"""The alive line: a subscription a worker's death ends, read by a conductor's role without
admin rights (workers/alive.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis
from django.conf import settings

from tests.helpers import wait_until
from workers.alive import channel, connected

pytestmark = [pytest.mark.stack]

HOLDER = """
import sys, time, redis
from workers.alive import AliveLine
line = AliveLine(redis.Redis.from_url(sys.argv[1]), "alive-t1")
line.start()
print("up", flush=True)
time.sleep(120)
"""


def test_it_tells_a_line_that_is_up_from_one_whose_process_died(stack):
    """The line is held by another process, killed with -9 as a worker would be."""
    conductor = redis.Redis.from_url(stack.role_url("conductor"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, stack.role_url("worker")],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)},
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"up"
        assert connected(conductor, ["alive-t1", "alive-t2"]) == {"alive-t1"}
        holder.kill()
        holder.wait(10)
        wait_until(lambda: not connected(conductor, ["alive-t1"]), timeout=5, what="the drop")
    finally:
        holder.kill()
        holder.wait(10)


def test_a_worker_may_hold_its_line_but_not_publish_on_it(stack):
    worker = redis.Redis.from_url(stack.role_url("worker"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.publish(channel("alive-t3"), "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.execute_command("CLIENT", "LIST")
