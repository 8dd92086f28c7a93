"""What a cell runs under and what it comes to: the limits, the result, and the one sentence
that tells the root model how a cell ended."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    cell_wall_s: float = 30.0  # wall clock per cell, not counting time spent in the handler
    cpu_s: int = 300  # CPU seconds for the whole REPL process (RLIMIT_CPU)
    memory_mb: int = 1024  # address space of the REPL process (RLIMIT_AS)
    output_chars: int = 20000  # stdout + stderr kept per cell; the middle is cut out
    scratch_mb: int = 256  # the REPL's writable space (a tmpfs); also its largest file
    open_files: int = 256  # file descriptors the REPL process may hold (RLIMIT_NOFILE)


@dataclass
class CellResult:
    stdout: str
    stderr: str  # includes the traceback of an exception raised by the cell
    error: str | None  # None | "exception" | "timeout" | "memory" | "cpu" | "crashed"
    error_message: str | None  # one sentence: what happened and what it means
    final: str | None  # the answer if the cell called FINAL(x) or FINAL_VAR(name)
    restarted: bool  # the process was killed and a fresh one started (variables lost)
    wall_ms: float
    cpu_ms: float


def cell_error_message(
    error: str | None, limits: SandboxLimits, exc_type: str | None, exc_message: str | None
) -> str | None:
    if error is None:
        return None
    if error == "memory":
        return (
            f"The cell ran out of memory (the REPL may use {limits.memory_mb} MB) and raised "
            f"MemoryError; the REPL kept its variables."
        )
    if exc_type == "SystemExit":
        return "The cell called sys.exit(); the REPL does not exit and kept its variables."
    what = f"{exc_type}: {_shorten(exc_message)}" if exc_message else f"{exc_type}"
    return f"The cell raised {what}; the traceback is in stderr and the REPL kept its variables."


def death_verdict(
    reason: str, exit_code: int, cpu_total: float, limits: SandboxLimits, isolation_kind: str
) -> tuple[str, str]:
    """(error, error_message) of a cell whose REPL process was killed or died."""
    lost = "the REPL was restarted and its variables were lost."
    if reason == "timeout":
        return "timeout", (
            f"The cell ran past its {limits.cell_wall_s:g} s wall-clock limit and was "
            f"killed; {lost}"
        )
    if reason == "protocol":
        return "crashed", f"The REPL process sent garbage on its control pipe; {lost}"
    signum = _signal_of(exit_code, isolation_kind)
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_total >= limits.cpu_s):
        return "cpu", f"The REPL process used up its {limits.cpu_s} s CPU budget; {lost}"
    how = f"signal {signal.Signals(signum).name}" if signum else f"exit status {exit_code}"
    return "crashed", f"The REPL process died ({how}); {lost}"


def _shorten(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _signal_of(exit_code: int, isolation_kind: str) -> int | None:
    """The signal that killed the REPL, if any; bubblewrap reports it as 128 + signal."""
    if exit_code < 0:
        return -exit_code
    if isolation_kind == "bwrap" and 128 < exit_code < 128 + signal.NSIG:
        return exit_code - 128
    return None


DONE_ERRORS = (None, "exception", "memory")


def done_problem(done: dict[str, Any]) -> str | None:
    """What is wrong with a cell's "done" (child.py's protocol), or None: the REPL's code may
    have been rewritten by the cell it ran, so nothing in it is taken on trust."""
    cpu = done.get("cpu_s")
    if cpu is not None and (
        isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0 <= cpu < 1e9
    ):
        return f"cpu_s is {str(cpu)[:40]!r}, not a number of seconds"
    if done.get("error") not in DONE_ERRORS:
        return f"error is {str(done.get('error'))[:40]!r}, not one of {DONE_ERRORS}"
    for key in ("exc_type", "exc_message", "final"):
        if done.get(key) is not None and not isinstance(done[key], str):
            return f"{key} is a {type(done[key]).__name__}, not text"
    return None
