"""Every bench starts: `--help` imports all it needs and sets up Django as it does for a
measurement, from a shell's environment. One did not (bench/verify_policy.py took
bench/traces.py for the app `traces`) and nothing noticed, since no test ran it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_bench_starts(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRLM_", "DJANGO_"))}
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        cwd=BENCH.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout
