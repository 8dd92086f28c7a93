"""What the REPL's processes use, read from /proc: the tasks a user runs (for RLIMIT_NPROC)
and the CPU time of a process tree that cannot be reaped to ask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Room for the threads and subprocesses a cell may legitimately start.
_NPROC_HEADROOM = 256


def nproc_limit(user: tuple[int, int] | None, pids: Any) -> int | None:
    """RLIMIT_NPROC for the REPL running as ``user`` (None: as this process), or None where
    the pids cgroup already binds or the limit would not (root is exempt)."""
    if pids is not None and pids.active:
        return None
    uid = user[0] if user is not None else os.geteuid()
    if uid == 0:
        return None
    # The limit counts every task of this user, the service's own included, so it has to
    # sit above what already runs or the REPL could not even start.
    return _tasks_of_user(uid) + _NPROC_HEADROOM


def _tasks_of_user(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and all its descendants, read from /proc."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and ")"; the fields after the last ")" do not.
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])
    tree = {root}
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")
