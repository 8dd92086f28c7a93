"""The production profile, in fresh processes with only the environment the README's
"Production" section documents: the deploy check is clean, a published key never serves,
DEBUG is off unless asked for, and an unset key is a private random one, the same for
every process of an installation."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings

from frlm_web.secret import KNOWN_KEYS

# README, "Production".
PRODUCTION = {
    "FRLM_DEBUG": "0",
    "FRLM_SECRET_KEY": secrets.token_urlsafe(50),
    "FRLM_ALLOWED_HOSTS": "frlm.example.com",
    "FRLM_HTTPS": "1",
}
PUBLISHED_KEY = next(iter(KNOWN_KEYS))


def run(data_dir: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """`argv` with this interpreter, in a process whose FRLM_ settings are only `env` and
    its own data directory."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRLM_")}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=settings.BASE_DIR,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
            "FRLM_DATA_DIR": str(data_dir),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


SETTING = "import django; django.setup(); from django.conf import settings; print(settings.{})"


def test_it_passes_the_deploy_check_in_the_production_environment(tmp_path):
    done = run(tmp_path, "manage.py", "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_it_refuses_to_serve_or_conduct_on_the_published_development_key(tmp_path):
    env = {**PRODUCTION, "FRLM_SECRET_KEY": PUBLISHED_KEY}
    # manage.py commands (runserver, the conductor, the workers) stop at the system check;
    # daphne, which runs none, when it loads the application.
    for argv in (["manage.py", "check"], ["-c", "import frlm_web.asgi"]):
        done = run(tmp_path, *argv, **env)
        assert done.returncode != 0, argv
        said = done.stdout + done.stderr
        assert "set FRLM_SECRET_KEY" in said and "secrets.token_urlsafe" in said, said
    # With DEBUG on, on one's own machine, it still runs.
    assert run(tmp_path, "manage.py", "check", **{**env, "FRLM_DEBUG": "1"}).returncode == 0


def test_it_keeps_debug_off_unless_asked(tmp_path):
    assert run(tmp_path, "-c", SETTING.format("DEBUG")).stdout.strip() == "False"
    assert run(tmp_path, "-c", SETTING.format("DEBUG"), FRLM_DEBUG="1").stdout.strip() == "True"


def test_it_makes_one_private_random_key_that_every_process_reads(tmp_path):
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: run(tmp_path, "-c", SETTING.format("SECRET_KEY")), range(4)))
    keys = {d.stdout.strip() for d in done}
    assert len(keys) == 1, [d.stderr[-500:] for d in done]
    key = keys.pop()
    assert key not in KNOWN_KEYS and len(key) >= 50
    stored = tmp_path / "secret_key"
    assert stored.read_text().strip() == key
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if "secret_key" in p.name] == ["secret_key"]
    # Another installation (another data directory) has a key of its own.
    other = tmp_path / "other"
    assert run(other, "-c", SETTING.format("SECRET_KEY")).stdout.strip() not in ("", key)
