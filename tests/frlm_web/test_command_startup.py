"""A command's start: what `manage.py frlm_* --help` imports. Every command pays for what
Django's setup and the command's module import, before it does anything; the model client,
DuckDB, Arrow, Plotly and Celery are loaded only by the code that uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("openai", "duckdb", "plotly", "pyarrow", "numpy", "celery", "twisted", "httpx")

# Runs the command as manage.py does, then names the heavy modules it loaded.
PROBE = f"""
import contextlib, io, json, sys
from django.core.management import execute_from_command_line
with contextlib.redirect_stdout(io.StringIO()):
    try:
        execute_from_command_line(["manage.py", sys.argv[1], "--help"])
    except SystemExit:
        pass
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""


def probe(code: str, argv: list[str], tmp_path: Path, *, settings: bool = True) -> Any:
    """Run `code` in a fresh interpreter with `argv`; the JSON of its last line. Without
    `settings`, DJANGO_SETTINGS_MODULE is left for manage.py to set, as for a user."""
    env = {**os.environ, "FRLM_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if settings:
        env["DJANGO_SETTINGS_MODULE"] = "frlm_web.settings"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded_by_help(command: str, tmp_path: Path) -> list[str]:
    return probe(PROBE, [command], tmp_path)


@pytest.mark.parametrize(
    "command", ["frlm_run", "frlm_diff", "frlm_replay", "frlm_export", "frlm_import", "frlm_runs"]
)
def test_it_starts_a_command_without_the_heavy_libraries(command: str, tmp_path: Path) -> None:
    assert loaded_by_help(command, tmp_path) == []


def test_it_loads_the_model_client_when_a_model_is_called(tmp_path: Path) -> None:
    """The probe can see a heavy import: the runtime path still loads what it needs."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DATA_DIR": str(tmp_path),
    }
    code = (
        "import django, sys; django.setup()\n"
        "from workers.backends import _client\n"
        "_client('http://127.0.0.1:9', 'k', 1.0, 0)\n"
        "print('openai' in sys.modules, 'httpx' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.split() == ["True", "True"]


# Runs manage.py itself, then says whether the app registry was populated and which model
# modules were imported.
MANAGE_PROBE = """
import contextlib, io, json, runpy, sys
sys.argv = ["manage.py", *sys.argv[1:]]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        runpy.run_path("manage.py", run_name="__main__")
    except SystemExit:
        pass
from django.apps import apps
print(json.dumps([apps.ready, sorted(m for m in sys.modules if m.endswith(".models"))]))
"""


def registry_after(tmp_path: Path, *argv: str) -> tuple[bool, list[str]]:
    ready, models = probe(MANAGE_PROBE, list(argv), tmp_path, settings=False)
    return ready, models


@pytest.mark.parametrize(
    "argv",
    [
        ["frlm_diff", "--help"],
        ["frlm_diff", "rNoSuchA", "rNoSuchB"],  # as far as the store's answer
        ["frlm_trace", "--help"],
        ["frlm_trace", "rNoSuchA"],
    ],
)
def test_a_trace_store_command_runs_without_the_app_registry(argv: list[str], tmp_path: Path):
    # django.setup() imports every installed app (admin, auth, ...): most of a command's
    # start. A read of the trace store needs only the settings (frlm_web/light.py).
    assert registry_after(tmp_path, *argv) == (False, [])


def test_the_probe_sees_a_command_that_sets_up_django(tmp_path: Path):
    ready, models = registry_after(tmp_path, "frlm_runs", "--help")
    assert ready and "runs.models" in models
