"""Gateway workers for end-to-end tests: `frlm_worker --server ... --token ...` started the way
an operator on another machine would, with nothing of this machine's: no Redis URL that
works, no database, its own empty data directory (tests/workers/test_netns.py goes further:
another network and mount namespace)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO

from django.conf import settings

from frlm_web.redis_client import get_redis
from tests.helpers import wait_until
from workers import services
from workers.models import Venue, Worker
from workers.venues import LiveWorker, live_workers

Spawn = Callable[[list[str], IO[bytes]], subprocess.Popen]

# Addresses that lead nowhere: a gateway worker must not need them.
NOWHERE_ENV = {
    "FRLM_REDIS_URL": "redis://127.0.0.1:1/0",
    "FRLM_SIM_URL": "http://127.0.0.1:1/v1",
}


def enrolment_token(venue: str) -> str:
    """A fresh enrolment token of `venue` (made untrusted, of kind edge, if new)."""
    row, _ = Venue.objects.get_or_create(
        name=venue, defaults={"kind": Venue.Kind.EDGE, "trusted": False}
    )
    return services.token_create(row, ttl=timedelta(hours=1), label="test")[1]


def worker_command(server: str, token: str, venue: str, name: str, *flags: str) -> list[str]:
    return [
        sys.executable,
        str(Path(settings.BASE_DIR) / "manage.py"),
        "frlm_worker",
        "--server",
        server,
        "--token",
        token,
        "--venue",
        venue,
        "--name",
        name,
        *flags,
    ]


def far_env(home: Path) -> dict[str, str]:
    """The environment of a process on "another host": this repository's code, its own
    empty data directory, and no way to the broker or the database."""
    home.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    return {
        **{k: os.environ[k] for k in keep if k in os.environ},
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DATA_DIR": str(home),
        "FRLM_DB_PATH": str(home / "no-database-here.sqlite3"),
        "FRLM_SECRET_KEY": "another-host-" + os.urandom(8).hex(),
        **NOWHERE_ENV,
    }


class GatewayWorker:
    """One gateway worker process, stopped with `stop()` (SIGTERM) or `kill()` (SIGKILL)."""

    def __init__(
        self,
        server: str,
        venue: str,
        name: str,
        home: Path,
        *flags: str,
        token: str | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        """`spawn(argv, stdout)` starts the process somewhere else (another namespace,
        tests/workers/test_netns.py); by default here, with `far_env`."""
        self.venue, self.name = venue, name
        self.log = home / f"{name}.log"
        home.mkdir(parents=True, exist_ok=True)
        command = worker_command(server, token or enrolment_token(venue), venue, name, *flags)
        with open(self.log, "wb") as out:
            if spawn is not None:
                self.proc = spawn(command, out)
            else:
                self.proc = subprocess.Popen(
                    command,
                    env=far_env(home / name),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def entry(self) -> LiveWorker | None:
        for entry in live_workers(get_redis(), self.venue):
            if entry.get("label") == self.name:
                return entry
        return None

    def wait_up(self, timeout: float = 60.0) -> LiveWorker:
        def up() -> LiveWorker | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            return self.entry()

        return wait_until(up, timeout=timeout, what=f"gateway worker {self.name} in presence")

    @property
    def worker_id(self) -> str:
        return Worker.objects.get(name=self.name, venue__name=self.venue).id

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def named(events: list[dict], name: str, phase: str | None = None) -> list[dict]:
    """The events of one name (and phase)."""
    return [e for e in events if e["name"] == name and (phase is None or e["phase"] == phase)]


def claims(run_id: str) -> list[tuple[str, str]]:
    """(status, sq_id) of what the run's results stream says, in order."""
    from frlm_web.redis_client import get_redis
    from workers.jobs import results_stream

    return [
        (f[b"status"].decode(), f[b"sq_id"].decode())
        for _, f in get_redis().xrange(results_stream(run_id), "-", "+")
    ]
