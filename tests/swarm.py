"""A simulated swarm for end-to-end tests: `frlm_swarm` started with a profile written for
the test, and stopped after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from django.conf import settings

from frlm_web.redis_client import get_redis
from tests.helpers import wait_until
from workers.models import Venue
from workers.swarm import devices, profile_load
from workers.venues import live_workers

PROFILE = """
description = "test swarm"
concurrency = {concurrency}
[latency]
median_ms = {latency}
spread = 0.0
slow_share = {slow_share}
slow_factor = {slow_factor}
[faults]
failure_rate = {failure_rate}
lie_share = {lie_share}
lie_rate = 1.0
honest_first = {honest_first}
[churn]
leave_every_s = {leave}
away_s = 1.0
kill_share = 0.5
"""


class Swarm:
    def __init__(self, tmp: Path, env: dict, venue: str, workers: int, **profile) -> None:
        values = {
            "concurrency": 2,
            "latency": 100,
            "slow_share": 0.0,
            "failure_rate": 0.0,
            "lie_share": 0.0,
            "honest_first": 0,
            "leave": 0.0,
            "slow_factor": 4.0,
            **profile,
        }
        path = tmp / f"{venue}.toml"
        path.write_text(PROFILE.format(**values))
        self.devices = devices(profile_load(str(path)), venue, workers, 0)
        Venue.objects.get_or_create(name=venue)
        self.venue, self.workers = venue, workers
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(settings.BASE_DIR) / "manage.py"),
                "frlm_swarm",
                "--venue",
                venue,
                "--workers",
                str(workers),
                "--profile",
                str(path),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # What the swarm says, read as it says it: a test can wait for a word (a rejoin)
        # while the swarm runs, not only read it all once the swarm is stopped.
        self.said: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.said.append(line)

    def output(self) -> str:
        return "".join(self.said)

    def wait_said(self, word: str, timeout: float = 60) -> None:
        wait_until(
            lambda: word in self.output(),
            timeout=timeout,
            what=f"the swarm {self.venue} to say {word!r}",
        )

    def live(self) -> list[dict]:
        return live_workers(get_redis(), self.venue)

    def wait_up(self) -> list[dict]:
        return wait_until(
            lambda: len(self.live()) >= self.workers and self.live(),
            timeout=240,  # devices start slowly on a shared machine (load average 60 seen)
            what=f"{self.workers} workers of the swarm {self.venue}",
        )

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return self.output()
