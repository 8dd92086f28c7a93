"""`frlm_up` and `frlm_down` as an operator runs them, on a data directory and ports of
their own: a process killed with -9 is started again by the supervisor and `frlm_status`
says so; `frlm_down` stops everything and nothing comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from frlm_web.stack import free_port
from frlm_web.supervisor import pid_alive, read_state
from tests.helpers import wait_until


def manage(env: dict[str, str], *args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def operator_env(tmp_path: Path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DATA_DIR": str(tmp_path),
        "FRLM_DB_PATH": str(tmp_path / "db.sqlite3"),
        "FRLM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "FRLM_SIM_PORT": str(free_port()),
        "FRLM_WEB_PORT": str(free_port()),
    }
    env.pop("FRLM_SECRET_KEY", None)  # its own, made in its data directory
    manage(env, "migrate", "--no-input", "-v", "0")
    yield env
    manage(env, "frlm_down")


def pids(state: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in (state / "pids").glob("*.pid")}


def test_it_restarts_what_dies_and_stops_for_good(operator_env):
    state = Path(operator_env["FRLM_DATA_DIR"]) / "stack"
    manage(operator_env, "frlm_up")
    supervisor = int((state / "supervisor.pid").read_text())
    recorder = pids(state)["recorder"]
    os.killpg(recorder, signal.SIGKILL)
    wait_until(
        lambda: read_state(state)["procs"]["recorder"]["restarts"] == 1,
        timeout=30,
        what="the recorder to be started again",
    )
    assert pids(state)["recorder"] != recorder
    status = manage(operator_env, "frlm_status")
    assert f"supervisor: pid {supervisor}" in status
    assert "recorder: up, restarted 1 time(s)" in status
    assert "killed by SIGKILL" in status
    assert f"recorder (pid {recorder}) killed by SIGKILL" in (state / "logs/stack.log").read_text()
    seen = json.loads(manage(operator_env, "frlm_status", "--json"))
    assert seen["up"] and seen["supervisor_pid"] == supervisor
    (rec,) = [p for p in seen["processes"] if p["name"] == "recorder"]
    assert rec["up"] and rec["restarts"] == 1 and "killed by SIGKILL" in rec["last_reason"]
    assert rec["last_restart"][:4].isdigit()

    running = [*pids(state).values(), supervisor]
    out = manage(operator_env, "frlm_down")
    assert "supervisor" in out
    time.sleep(2)  # longer than the supervisor's first delay: nothing comes back
    assert [pid for pid in running if pid_alive(pid)] == []
    assert "FRLM web is not up" in manage(operator_env, "frlm_status")


def test_frlm_down_where_nothing_ever_started_says_so(tmp_path: Path):
    """A fresh checkout, or another FRLM_DATA_DIR: `make down` ended in a FileNotFoundError
    traceback on stack/stopping (exit 1) instead of its own answer (a review)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "frlm_web.settings"}
    env["FRLM_DATA_DIR"] = str(tmp_path)
    assert "nothing was running" in manage(env, "frlm_down", timeout=60)
