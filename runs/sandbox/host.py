"""The host side of the REPL sandbox: starts the REPL process, runs cells, serves its calls.

One ``Sandbox`` owns one REPL process (``child.py``) for the life of a run. Cells run in it
one after the other and share its globals. ``llm_query`` and friends inside a cell travel
back here over a pipe and are answered by the ``handler`` the conductor passed in.

A Sandbox is not thread-safe: one thread starts it, executes cells and closes it. That
thread must also outlive the sandbox, because bubblewrap's --die-with-parent follows the
thread that spawned it.

The pieces it puts together sit beside it: ``protocol`` (the messages), ``pipes`` (the
process and its pipes), ``bwrap`` (the command line and its isolation), ``accounting``
(/proc figures) and ``cells`` (limits, results and what a cell's end means).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from runs.sandbox import bwrap, seccomp
from runs.sandbox.accounting import nproc_limit, tree_cpu_seconds
from runs.sandbox.cells import (
    CellResult,
    SandboxLimits,
    cell_error_message,
    death_verdict,
    done_problem,
)
from runs.sandbox.lazytext import file_identity
from runs.sandbox.pids import PidsLimit
from runs.sandbox.pipes import Capture, ReplProcess, render_outputs
from runs.sandbox.protocol import (
    REPL_CALLS,
    ChildDied,
    Handler,
    ProtocolError,
    SandboxCallError,
    encode,
)

logger = logging.getLogger(__name__)

ISOLATION_CHOICES = ("auto", "bwrap", "none")
# Whom the REPL runs as when the service is root: nobody, unless the operator says otherwise.
DEFAULT_SANDBOX_UID = 65534
UNISOLATED = "NOT ISOLATED"

# The REPL reads the conductor's offset index, or, without one, makes it in one streaming
# pass over the context: seconds for a few GB, not minutes.
_START_TIMEOUT_S = 60.0
# How often a running cell asks whether it should stop (`execute`'s `stop`): a cancelled
# run's cell is ended within this, not at its wall clock.
STOP_POLL_S = 0.25


class SandboxError(RuntimeError):
    """The sandbox itself cannot work (bubblewrap missing, the REPL does not start, misuse)."""


class CellStopped(Exception):
    """The cell was ended from outside (`execute`'s `stop` said so) before it finished; its
    REPL was thrown away, and the next cell gets a fresh one."""


def _check_identity(context_fd: int, index_fd: int, path: Path) -> None:
    """The conductor checked the context's place as it opened it and wrote that file's
    identity into the offset index (runs/engine/context.py): the REPL gets nothing else, so
    a path swapped since (for a symlink to a key, say) is refused, not read."""
    raw = os.pread(index_fd, os.fstat(index_fd).st_size, 0)
    expected = json.loads(raw).get("fingerprint")
    if expected != file_identity(os.fstat(context_fd)):
        raise SandboxError(
            f"the context file {path} is not the file the conductor checked and indexed "
            "(it was replaced or changed since); start the run again"
        )


class Sandbox:
    """A REPL process holding ``context``, isolated by bubblewrap where possible."""

    isolation: str
    isolation_kind: str

    def __init__(
        self,
        context_path: Path,
        *,
        handler: Handler,
        limits: SandboxLimits = SandboxLimits(),
        workdir_root: Path,
        isolation: str = "auto",
        context_index: Path | None = None,
        uid: int = DEFAULT_SANDBOX_UID,
    ) -> None:
        if isolation not in ISOLATION_CHOICES:
            raise ValueError(f"isolation must be one of {ISOLATION_CHOICES}, not {isolation!r}")
        self._context_path = Path(context_path).resolve()
        # The conductor's offset index of the context; without it the REPL builds its own.
        self._context_index = Path(context_index).resolve() if context_index else None
        self._handler = handler
        self._limits = limits
        self._workdir_root = Path(workdir_root)
        self._requested_isolation = isolation
        self._user = bwrap.sandbox_user(uid)
        self._pids: PidsLimit | None = None
        self.isolation = "not started"
        self.isolation_kind = "none"
        self._scratch: Path | None = None
        self._child: ReplProcess | None = None
        self._cpu_baseline = 0.0
        self._closed = False

    def __enter__(self) -> Sandbox:
        if self._child is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        if self._closed or self._child is not None:
            raise SandboxError("a Sandbox can be started only once")
        if not self._context_path.is_file():
            raise SandboxError(f"the context file {self._context_path} does not exist")
        self.isolation_kind, self.isolation = _choose_isolation(
            self._requested_isolation, self._user, self._limits
        )
        self._pids = PidsLimit()
        if self._pids.active:
            self.isolation += f"; at most {self._pids.limit} processes (pids cgroup)"
        self._workdir_root.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="repl-", dir=self._workdir_root)
        self._scratch = Path(scratch).resolve()
        try:
            self._spawn()
        except BaseException:
            self.close()
            raise

    def execute(self, code: str, *, stop: Callable[[], bool] | None = None) -> CellResult:
        """Run one cell. `stop`, if given, is asked every STOP_POLL_S while the cell's code
        runs (not while a call of it is served here); once it says yes the cell's REPL is
        killed and CellStopped raised."""
        if self._closed or self._scratch is None:
            raise SandboxError("the Sandbox is not running; call start() first")
        started = time.monotonic()
        restarted = self._child is None
        if self._child is None:
            # The previous execute() was interrupted and its REPL thrown away.
            self._spawn()
        child = self._child
        assert child is not None
        out = Capture(self._limits.output_chars)
        err = Capture(self._limits.output_chars)
        # A random id per cell: a "done" that does not carry it was not sent by this cell's
        # REPL loop but forged, say by a thread an earlier cell left running.
        cell = secrets.token_hex(8)
        child.queue(encode({"type": "exec", "code": code, "cell": cell}))
        try:
            outcome = self._run_cell(child, out, err, cell, stop)
        except BaseException:
            # Interrupted from outside (`stop`, KeyboardInterrupt, a task time limit) in
            # mid-cell: the REPL's state is unknown, so the next cell gets a fresh one.
            self._child = None
            child.kill()
            raise
        if isinstance(outcome, dict):
            return self._finished(outcome, out, err, started, restarted)
        return self._killed(outcome, out, err, started)

    def fold(self, text: str) -> int:
        """Append ``text`` (folded conversation) to the REPL's ``folded`` list; its length."""
        if self._closed or self._child is None:
            raise SandboxError("the Sandbox is not running")
        child = self._child
        child.queue(encode({"type": "fold", "text": text}))
        out, err = Capture(4000), Capture(4000)
        try:
            reply = child.next_message(_START_TIMEOUT_S, out, err)
        except (ChildDied, ProtocolError) as exc:
            raise SandboxError(f"the REPL did not take the folded text: {exc!r}") from exc
        if reply is None or reply.get("type") != "folded":
            raise SandboxError("the REPL did not take the folded text")
        return int(reply.get("count", 0))

    def close(self) -> None:
        self._closed = True
        if self._child is not None:
            self._child.kill()
            self._child = None
        if self._scratch is not None:
            _remove_tree(self._scratch)
            self._scratch = None
        if self._pids is not None:
            self._pids.remove()
            self._pids = None

    # -- running a cell ----------------------------------------------------------------------

    def _run_cell(
        self,
        child: ReplProcess,
        out: Capture,
        err: Capture,
        cell: str,
        stop: Callable[[], bool] | None,
    ) -> dict[str, Any] | Literal["timeout", "died", "protocol"]:
        """Pump the pipes until the cell is done; the clock stops while the handler runs.
        CellStopped once `stop` says so."""
        used = 0.0
        while True:
            segment_start = time.monotonic()
            wait = self._limits.cell_wall_s - used
            if stop is not None:
                wait = min(wait, STOP_POLL_S)
            try:
                message = child.next_message(wait, out, err)
            except ChildDied:
                return "died"
            except ProtocolError as exc:
                logger.warning("REPL process broke the protocol: %s", exc)
                return "protocol"
            used += time.monotonic() - segment_start
            if message is None:
                if stop is not None and stop():
                    raise CellStopped(f"stopped after {used:.1f} s of its code")
                if used < self._limits.cell_wall_s:
                    continue
                return "timeout"
            if message.get("type") == "done":
                if message.get("cell") != cell:
                    logger.warning("REPL process sent a 'done' for another cell: forged")
                    return "protocol"
                problem = done_problem(message)
                if problem:
                    # The cell's code can rewrite the loop that sends it: taken on trust, a
                    # CPU figure of "not a number" failed the run with an internal error
                    # and left its cell's span open (a review).
                    logger.warning("REPL process sent a 'done' that is not one: %s", problem)
                    return "protocol"
                child.drain(out, err)
                return message
            if message.get("type") != "call":
                logger.warning("REPL process sent an unexpected %r message", message.get("type"))
                return "protocol"
            child.queue(self._serve(message))

    def _serve(self, message: dict[str, Any]) -> bytes:
        """Answer one REPL call; every failure becomes an error reply, never a host crash."""
        name, kwargs = message.get("name"), message.get("kwargs")
        if name not in REPL_CALLS or not isinstance(kwargs, dict):
            return encode({"type": "reply", "ok": False, "error": f"unknown call {name!r}"})
        try:
            result = self._handler(name, kwargs)
            return encode({"type": "reply", "ok": True, "result": result})
        except SandboxCallError as exc:
            return encode({"type": "reply", "ok": False, "error": str(exc)})
        except Exception as exc:
            logger.exception("the handler for REPL call %s failed", name)
            error = f"internal error in {name}: {type(exc).__name__}: {exc}"
            return encode({"type": "reply", "ok": False, "error": error})

    def _finished(
        self, done: dict[str, Any], out: Capture, err: Capture, started: float, restarted: bool
    ) -> CellResult:
        cpu_total = float(done.get("cpu_s") or 0.0)
        cpu_ms = max(0.0, cpu_total - self._cpu_baseline) * 1000
        self._cpu_baseline = cpu_total
        error = done.get("error")
        final = done.get("final")
        stdout, stderr = render_outputs(out, err, self._limits.output_chars)
        return CellResult(
            stdout=stdout,
            stderr=stderr,
            error=error,
            error_message=cell_error_message(
                error, self._limits, done.get("exc_type"), done.get("exc_message")
            ),
            final=None if final is None else str(final),
            restarted=restarted,
            wall_ms=(time.monotonic() - started) * 1000,
            cpu_ms=cpu_ms,
        )

    def _killed(self, reason: str, out: Capture, err: Capture, started: float) -> CellResult:
        """The cell never finished: collect what is known, then replace the process."""
        assert self._child is not None
        child = self._child
        self._child = None
        # Killing bubblewrap orphans the REPL before it can be reaped, so look first.
        cpu_seen = tree_cpu_seconds(child.pid) if reason == "timeout" else 0.0
        child.drain(out, err)
        exit_code, cpu_reaped = child.kill(grace_s=0.0 if reason == "timeout" else 2.0)
        cpu_total = max(cpu_seen, cpu_reaped)
        wall_ms = (time.monotonic() - started) * 1000
        error, message = death_verdict(
            reason, exit_code, cpu_total, self._limits, self.isolation_kind
        )
        if error == "cpu":
            # Under bubblewrap the REPL is not our child and its usage is lost with it; but
            # it spent the budget by definition.
            cpu_total = max(cpu_total, float(self._limits.cpu_s))
        stdout, stderr = render_outputs(out, err, self._limits.output_chars)
        self._spawn()
        return CellResult(
            stdout=stdout,
            stderr=stderr,
            error=error,
            error_message=message,
            final=None,
            restarted=True,
            wall_ms=wall_ms,
            cpu_ms=max(0.0, cpu_total - self._cpu_baseline) * 1000,
        )

    # -- the process -------------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start a REPL process and wait until it has loaded the context."""
        assert self._scratch is not None
        if self._pids is not None:
            self._pids.settle()  # the processes of a REPL killed just before
        isolated = self.isolation_kind == "bwrap"
        # Under bubblewrap the scratch space is the sandbox's own tmpfs; unisolated, a
        # directory on the host with a file-size limit only.
        env = bwrap.clean_env(bwrap.SANDBOX_SCRATCH if isolated else self._scratch)
        mounts = bwrap.Mounts()
        try:
            # The REPL reads the context through a descriptor opened here: its user need not
            # be able to open the file, and under bubblewrap the path is not even there.
            context_fd = mounts.open(self._context_path, os.O_RDONLY)
            index_fd = (
                mounts.open(self._context_index, os.O_RDONLY) if self._context_index else None
            )
            if index_fd is not None:
                _check_identity(context_fd, index_fd, self._context_path)
            command = bwrap.repl_command(
                env,
                mounts,
                bwrap=isolated,
                scratch_bytes=self._limits.scratch_mb * 1024 * 1024,
                user=self._user if isolated else None,
            )
            config = {
                "context_path": str(self._context_path),
                "context_fd": context_fd,
                "index_fd": index_fd,
                "memory_mb": self._limits.memory_mb,
                "cpu_s": self._limits.cpu_s,
                "file_bytes": self._limits.scratch_mb * 1024 * 1024,
                "open_files": self._limits.open_files,
                "nproc": nproc_limit(self._user if isolated else None, self._pids),
            }
            if self._pids is not None:
                command = self._pids.wrap(command)
            cwd = Path("/") if isolated else self._scratch
            child = ReplProcess(command, env, cwd, config, pass_fds=tuple(mounts.fds))
        finally:
            mounts.close()
        out, err = Capture(4000), Capture(4000)
        try:
            ready = child.next_message(_START_TIMEOUT_S, out, err)
        except (ChildDied, ProtocolError):
            ready = None
        if ready is None or ready.get("type") != "ready":
            child.drain(out, err)
            child.kill()
            said = "\n".join(render_outputs(out, err, 4000)).strip() or "no output"
            raise SandboxError(f"the REPL process did not start ({self.isolation}): {said}")
        self._child = child
        self._cpu_baseline = float(ready.get("cpu_s") or 0.0)


def isolation_problem(requested: str, uid: int = DEFAULT_SANDBOX_UID) -> str | None:
    """Why a run cannot start its REPL with ``requested`` isolation here, or None.

    Asked before a run is created, so that a machine without working bubblewrap refuses the
    run with this sentence instead of running root-model code unisolated."""
    if requested not in ISOLATION_CHOICES:
        return f"FRLM_SANDBOX_ISOLATION must be one of {', '.join(ISOLATION_CHOICES)}"
    if requested == "none":
        return None
    problem = bwrap.bwrap_problem(bwrap.sandbox_user(uid))
    if problem is None:
        return None
    return f"the REPL sandbox cannot start: {problem}; {bwrap.INSTALL_HINT}"


def _choose_isolation(
    requested: str, user: tuple[int, int] | None, limits: SandboxLimits
) -> tuple[str, str]:
    """(isolation_kind, a sentence describing what is in force).

    Fails closed: without working bubblewrap only an explicit ``none`` runs the REPL, and
    its sentence starts with NOT ISOLATED so that no page or report can hide it."""
    if requested == "none":
        who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
        return "none", (
            f"{UNISOLATED} (FRLM_SANDBOX_ISOLATION=none): the REPL runs as {who} with rlimits "
            f"only and can read this machine's files, secrets and network"
        )
    problem = bwrap.bwrap_problem(user)
    if problem is not None:
        raise SandboxError(f"the REPL sandbox cannot start: {problem}; {bwrap.INSTALL_HINT}")
    who = f"uid {user[0]}, not root" if user else f"uid {os.geteuid()}"
    filtered = "seccomp" if seccomp.supported() else "no seccomp filter on this CPU"
    return "bwrap", (
        f"bwrap: no network, read-only system, {limits.scratch_mb} MB scratch tmpfs, "
        f"{who}, no capabilities, {filtered}, rlimits"
    )


def _remove_tree(path: Path) -> None:
    """Delete the scratch directory even if a cell made parts of it read-only."""

    def make_writable_and_retry(function: Callable[..., Any], target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            function(target)
        except OSError:
            logger.warning("could not remove %s from a sandbox scratch directory", target)

    shutil.rmtree(path, onerror=make_writable_and_retry)
