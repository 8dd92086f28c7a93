"""Settings for a private, throwaway instance (the test suite, benchmarks): the product's
settings pointed at a free Redis port, a fresh data directory and a free model server
port, so they never touch a running demo. Processes started from such an instance inherit
these through the environment."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if "FRLM_TEST_SESSION_DIR" not in os.environ:
    _dir = tempfile.mkdtemp(prefix="frlm-test-")
    os.environ.update(
        {
            "FRLM_TEST_SESSION_DIR": _dir,
            "FRLM_DATA_DIR": _dir,
            "FRLM_REDIS_URL": f"redis://127.0.0.1:{_free_port()}/0",
            "FRLM_SIM_PORT": str(_free_port()),
            "FRLM_TEST_DB_PATH": os.path.join(_dir, "test-db.sqlite3"),
            # Lost workers are noticed within a few seconds rather than six.
            "FRLM_VENUE_HEARTBEAT_TTL_S": "3",
            "FRLM_MODEL_RETRIES": "0",
        }
    )
    # The process that made the directory removes it when it exits, after its stack has
    # stopped (pytest's session fixtures, a bench's private_stack): each test session left
    # up to 80 MB in /tmp, and 800 of them had piled up here. FRLM_KEEP_TEST_DIR=1 keeps it
    # (its stack/logs hold every process's log).
    if os.environ.get("FRLM_KEEP_TEST_DIR") != "1":
        atexit.register(shutil.rmtree, _dir, True)

# This process (the test runner, a bench's driver) may import the ASGI application but is
# not the web server: it leaves the run leases to the stack's web server and conductors.
os.environ.setdefault("FRLM_LEASE_WATCH", "0")

from frlm_web.settings import *  # noqa: E402, F403
