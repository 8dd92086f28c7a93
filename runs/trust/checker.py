"""Objective checks of replies run in a process of their own, each with a time limit.

A `validate=` regex (or a schema's `pattern`) is the program's, the reply a worker's, and
Python's `re` backtracks without bound while it holds the interpreter lock: `(a|a)*b`
against forty a's held a conductor at 100% CPU, every run on it stalled, its leases lapsed
and it ignored SIGTERM (a review). Here the conductor hands each check to a child process
(`python -m runs.trust.checker`, JSON lines over its pipes) and waits at most
CHECK_TIMEOUT_S: past that the child is killed, started again for the next check, and the
reply fails its check, saying why. The child builds each check once (runs.trust.objective)
and keeps the last few. A check takes a few tenths of a millisecond this way."""

from __future__ import annotations

import json
import logging
import os
import resource
import selectors
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from runs.trust.objective import CheckKind, CheckVerdict, objective_check

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 1.0
CHILD_MEMORY_MB = 512  # a pattern or schema that would take more fails its check
KEPT_CHECKS = 32  # compiled checks the child keeps, the least recently used dropped
TIMED_OUT = "the check took longer than"


class Checker:
    """One child process, one check at a time (a lock): checks are rare and quick."""

    def __init__(self, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0

    def verdict(self, validate: dict[str, Any] | str, kind: CheckKind, text: str) -> CheckVerdict:
        line = json.dumps({"validate": validate, "text": text}).encode() + b"\n"
        with self._lock:
            proc = self._child()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(line)
                proc.stdin.flush()
                reply = _read_line(proc.stdout, self.timeout_s)
            except OSError:
                reply = None
            if reply is None:
                self._stop()
                return CheckVerdict(
                    False,
                    kind,
                    f"{TIMED_OUT} {self.timeout_s:g} s on this reply (or used too much "
                    "memory): simplify the pattern or schema",
                )
        answer = json.loads(reply)
        return CheckVerdict(bool(answer["ok"]), kind, str(answer.get("reason", "")))

    def _child(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None or self._pid != os.getpid():
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "runs.trust.checker"],
                cwd=Path(__file__).resolve().parents[2],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self._pid = os.getpid()
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _read_line(stream: Any, timeout_s: float) -> bytes | None:
    """One line from the child, or None when none came in time (or it died)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return None
    line = stream.readline()
    return line or None


_checker = Checker()


class SlowChecks:
    """One run's checks that ran out of time. The checker takes one check at a time for
    every run of the conductor: a run whose checks keep running out of time would hold the
    others' up, so past SLOW_CHECKS_MAX its checks fail without being tried."""

    def __init__(self) -> None:
        self.count = 0


SLOW_CHECKS_MAX = 3


class Isolated:
    """A check whose verdicts come from the checker process (built in this process first,
    so that a bad schema or pattern is the program's error, said at once)."""

    def __init__(self, validate: dict[str, Any] | str, slow: SlowChecks) -> None:
        objective_check(validate)  # raises ValueError for a bad schema or pattern
        self.validate = validate
        self.slow = slow
        self.kind: CheckKind = "schema" if isinstance(validate, dict) else "regex"

    def __call__(self, text: str) -> CheckVerdict:
        if self.slow.count >= SLOW_CHECKS_MAX:
            return CheckVerdict(
                False,
                self.kind,
                f"not tried: {self.slow.count} of this run's checks ran out of time "
                f"({_checker.timeout_s:g} s each); simplify the pattern or schema",
            )
        found = _checker.verdict(self.validate, self.kind, text)
        if found.reason.startswith(TIMED_OUT):
            self.slow.count += 1
        return found


def _serve() -> None:
    """The child: a check per line in, a verdict per line out."""
    limit = CHILD_MEMORY_MB * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    checks: OrderedDict[str, Any] = OrderedDict()
    for line in sys.stdin.buffer:
        asked = json.loads(line)
        key = json.dumps(asked["validate"], sort_keys=True)
        check = checks.pop(key, None) or objective_check(asked["validate"])
        checks[key] = check
        while len(checks) > KEPT_CHECKS:
            checks.popitem(last=False)
        found = check(asked["text"])
        sys.stdout.write(json.dumps({"ok": found.ok, "reason": found.reason}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
