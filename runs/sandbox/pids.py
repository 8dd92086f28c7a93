"""A cap on how many processes one REPL may run, through the pids cgroup controller.

Root is exempt from RLIMIT_NPROC, so without this a fork bomb in a cell would run until the
wall clock kills it, starving the machine meanwhile. Where no pids controller can be written
(an unprivileged user, a container without it), the sandbox says so in its isolation text."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from pathlib import Path

log = logging.getLogger(__name__)

PIDS_MAX = 64
_CANDIDATES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def _controller_root() -> Path | None:
    """A cgroup directory where a child group with pids.max can be made."""
    for root in _CANDIDATES:
        if not os.access(root, os.W_OK):
            continue
        if (root / "pids.max").exists() or root.name == "pids" and (root / "cgroup.procs").exists():
            return root  # cgroup v1 hierarchy of the pids controller
        controls = root / "cgroup.subtree_control"
        if controls.exists() and "pids" in controls.read_text().split():
            return root  # cgroup v2 with pids delegated to children
    return None


class PidsLimit:
    """One cgroup per sandbox; every REPL process of that sandbox is put in it."""

    def __init__(self, limit: int = PIDS_MAX) -> None:
        self.limit = limit
        self.path: Path | None = None
        root = _controller_root()
        if root is None:
            return
        path = root / f"frlm-repl-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(limit))
        except OSError as exc:
            log.info("no pids cgroup for the REPL: %s", exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return
        self.path = path

    @property
    def active(self) -> bool:
        return self.path is not None

    def wrap(self, command: list[str]) -> list[str]:
        """The command, started inside the group: the shell joins it, then becomes the
        command, so everything it forks (bwrap's namespace init, the REPL) is counted. Moving
        the process after it started would race with its first fork."""
        if self.path is None:
            return command
        join = 'echo $$ > "$0" && exec "$@"'
        return ["/bin/sh", "-c", join, str(self.path / "cgroup.procs"), *command]

    def settle(self, timeout: float = 3.0) -> None:
        """Wait until the processes of a killed REPL are gone: the kernel tears a pid
        namespace down asynchronously, and a fresh REPL started before that would find the
        group full (a fork bomb fills it)."""
        if self.path is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if int((self.path / "pids.current").read_text()) == 0:
                    return
            except (OSError, ValueError):
                return
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the group once its processes are gone (they were killed just before)."""
        if self.path is None:
            return
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.02)
        self.path = None
