"""The host side of the REPL sandbox: starts the REPL process, runs cells, serves its calls.

One ``Sandbox`` owns one REPL process (``child.py``) for the life of a run. Cells run in it
one after the other and share its globals. ``llm_query`` and friends inside a cell travel
back here over a pipe and are answered by the ``handler`` the conductor passed in.

A Sandbox is not thread-safe: one thread starts it, executes cells and closes it. That
thread must also outlive the sandbox, because bubblewrap's --die-with-parent follows the
thread that spawned it.
"""

from __future__ import annotations

import codecs
import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from runs.sandbox.pids import PidsLimit

logger = logging.getLogger(__name__)

CHILD_SCRIPT = Path(__file__).resolve().with_name("child.py")
# The only project code the REPL sees: the child and the two stdlib-only modules it imports.
CHILD_MODULES = tuple(CHILD_SCRIPT.with_name(name) for name in ("lazytext.py", "patterns.py"))
REPL_CALLS = frozenset(
    {"llm_query", "llm_query_batched", "rlm_query", "select_fragments", "objective_verdicts"}
)
ISOLATION_CHOICES = ("auto", "bwrap", "none")

# Mirrors child.MAX_MESSAGE_BYTES; bounds what a misbehaving REPL can make the host buffer.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The REPL reads the conductor's offset index, or, without one, makes it in one streaming
# pass over the context: seconds for a few GB, not minutes.
_START_TIMEOUT_S = 60.0
_READ_CHUNK = 1 << 16
# After "done", whatever is still in the output pipes belongs to the cell; a background
# writer must not keep us draining forever.
_DRAIN_MAX_READS = 256
# Room for the threads and subprocesses a cell may legitimately start.
_NPROC_HEADROOM = 256
_CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    cell_wall_s: float = 30.0  # wall clock per cell, not counting time spent in the handler
    cpu_s: int = 300  # CPU seconds for the whole REPL process (RLIMIT_CPU)
    memory_mb: int = 1024  # address space of the REPL process (RLIMIT_AS)
    output_chars: int = 20000  # stdout + stderr kept per cell; the middle is cut out


class SandboxError(RuntimeError):
    """The sandbox itself cannot work (bubblewrap missing, the REPL does not start, misuse)."""


class SandboxCallError(Exception):
    """Raised by a host handler: the message becomes a RuntimeError inside the REPL code."""


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


Handler = Callable[[str, dict[str, Any]], Any]


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
        self._pids: PidsLimit | None = None
        self.isolation = "not started"
        self.isolation_kind = "none"
        self._scratch: Path | None = None
        self._child: _Child | None = None
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
        self.isolation_kind, self.isolation = _choose_isolation(self._requested_isolation)
        self._pids = PidsLimit()
        if self._pids.active:
            self.isolation = self.isolation.replace(
                "no process-count limit (running as root)",
                f"at most {self._pids.limit} processes (pids cgroup)",
            )
        self._workdir_root.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="repl-", dir=self._workdir_root)
        self._scratch = Path(scratch).resolve()
        try:
            self._spawn()
        except BaseException:
            self.close()
            raise

    def execute(self, code: str) -> CellResult:
        if self._closed or self._scratch is None:
            raise SandboxError("the Sandbox is not running; call start() first")
        started = time.monotonic()
        restarted = self._child is None
        if self._child is None:
            # The previous execute() was interrupted and its REPL thrown away.
            self._spawn()
        child = self._child
        assert child is not None
        out = _Capture(self._limits.output_chars)
        err = _Capture(self._limits.output_chars)
        child.queue(_encode({"type": "exec", "code": code}))
        try:
            outcome = self._run_cell(child, out, err)
        except BaseException:
            # Interrupted from outside (KeyboardInterrupt, a task time limit) in mid-cell: the
            # REPL's state is unknown, so the next cell gets a fresh one.
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
        child.queue(_encode({"type": "fold", "text": text}))
        out, err = _Capture(4000), _Capture(4000)
        try:
            reply = child.next_message(_START_TIMEOUT_S, out, err)
        except (_ChildDied, _ProtocolError) as exc:
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
        self, child: _Child, out: _Capture, err: _Capture
    ) -> dict[str, Any] | Literal["timeout", "died", "protocol"]:
        """Pump the pipes until the cell is done; the clock stops while the handler runs."""
        used = 0.0
        while True:
            segment_start = time.monotonic()
            try:
                message = child.next_message(self._limits.cell_wall_s - used, out, err)
            except _ChildDied:
                return "died"
            except _ProtocolError as exc:
                logger.warning("REPL process broke the protocol: %s", exc)
                return "protocol"
            used += time.monotonic() - segment_start
            if message is None:
                return "timeout"
            if message.get("type") == "done":
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
            return _encode({"type": "reply", "ok": False, "error": f"unknown call {name!r}"})
        try:
            result = self._handler(name, kwargs)
            return _encode({"type": "reply", "ok": True, "result": result})
        except SandboxCallError as exc:
            return _encode({"type": "reply", "ok": False, "error": str(exc)})
        except Exception as exc:
            logger.exception("the handler for REPL call %s failed", name)
            error = f"internal error in {name}: {type(exc).__name__}: {exc}"
            return _encode({"type": "reply", "ok": False, "error": error})

    def _finished(
        self, done: dict[str, Any], out: _Capture, err: _Capture, started: float, restarted: bool
    ) -> CellResult:
        cpu_total = float(done.get("cpu_s") or 0.0)
        cpu_ms = max(0.0, cpu_total - self._cpu_baseline) * 1000
        self._cpu_baseline = cpu_total
        error = done.get("error")
        final = done.get("final")
        stdout, stderr = _render_outputs(out, err, self._limits.output_chars)
        return CellResult(
            stdout=stdout,
            stderr=stderr,
            error=error,
            error_message=_cell_error_message(
                error, self._limits, done.get("exc_type"), done.get("exc_message")
            ),
            final=None if final is None else str(final),
            restarted=restarted,
            wall_ms=(time.monotonic() - started) * 1000,
            cpu_ms=cpu_ms,
        )

    def _killed(self, reason: str, out: _Capture, err: _Capture, started: float) -> CellResult:
        """The cell never finished: collect what is known, then replace the process."""
        assert self._child is not None
        child = self._child
        self._child = None
        # Killing bubblewrap orphans the REPL before it can be reaped, so look first.
        cpu_seen = _tree_cpu_seconds(child.pid) if reason == "timeout" else 0.0
        child.drain(out, err)
        exit_code, cpu_reaped = child.kill(grace_s=0.0 if reason == "timeout" else 2.0)
        cpu_total = max(cpu_seen, cpu_reaped)
        wall_ms = (time.monotonic() - started) * 1000
        error, message = self._death_verdict(reason, exit_code, cpu_total)
        if error == "cpu":
            # Under bubblewrap the REPL is not our child and its usage is lost with it; but
            # it spent the budget by definition.
            cpu_total = max(cpu_total, float(self._limits.cpu_s))
        stdout, stderr = _render_outputs(out, err, self._limits.output_chars)
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

    def _death_verdict(self, reason: str, exit_code: int, cpu_total: float) -> tuple[str, str]:
        limits = self._limits
        lost = "the REPL was restarted and its variables were lost."
        if reason == "timeout":
            return "timeout", (
                f"The cell ran past its {limits.cell_wall_s:g} s wall-clock limit and was "
                f"killed; {lost}"
            )
        if reason == "protocol":
            return "crashed", f"The REPL process sent garbage on its control pipe; {lost}"
        signum = _signal_of(exit_code, self.isolation_kind)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_total >= limits.cpu_s):
            return "cpu", f"The REPL process used up its {limits.cpu_s} s CPU budget; {lost}"
        how = f"signal {signal.Signals(signum).name}" if signum else f"exit status {exit_code}"
        return "crashed", f"The REPL process died ({how}); {lost}"

    # -- the process -------------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start a REPL process and wait until it has loaded the context."""
        assert self._scratch is not None
        env = _clean_env(self._scratch)
        interpreter = _base_interpreter()
        command = [str(interpreter), "-I", "-S", str(CHILD_SCRIPT)]
        if self.isolation_kind == "bwrap":
            tmp_bytes = self._limits.memory_mb * 1024 * 1024
            prefix = _bwrap_arguments(
                env, self._scratch, self._context_path, tmp_bytes, self._context_index
            )
            command = [*prefix, "--", *command]
        config = {
            "context_path": str(self._context_path),
            "context_index": str(self._context_index) if self._context_index else None,
            "memory_mb": self._limits.memory_mb,
            "cpu_s": self._limits.cpu_s,
            "nproc": _nproc_limit(),
        }
        if self._pids is not None:
            command = self._pids.wrap(command)
        child = _Child(command, env, self._scratch, config)
        out, err = _Capture(4000), _Capture(4000)
        try:
            ready = child.next_message(_START_TIMEOUT_S, out, err)
        except (_ChildDied, _ProtocolError):
            ready = None
        if ready is None or ready.get("type") != "ready":
            child.drain(out, err)
            child.kill()
            said = "\n".join(_render_outputs(out, err, 4000)).strip() or "no output"
            raise SandboxError(f"the REPL process did not start ({self.isolation}): {said}")
        self._child = child
        self._cpu_baseline = float(ready.get("cpu_s") or 0.0)


class _ChildDied(Exception):
    """The REPL closed its control pipe: it exited or was killed."""


class _ProtocolError(Exception):
    """The REPL sent something that is not a protocol message."""


class _Child:
    """One REPL process and the four pipes to it (control in/out, stdout, stderr)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, config: dict) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self._stdout, stdout_w = os.pipe()
        self._stderr, stderr_w = os.pipe()
        config = {**config, "in_fd": to_child_r, "out_fd": from_child_w}
        try:
            self._process = subprocess.Popen(
                [*command, json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=stdout_w,
                stderr=stderr_w,
                pass_fds=(to_child_r, from_child_w),
                env=env,
                cwd=cwd,
                # Its own process group, so that one killpg takes everything it started.
                start_new_session=True,
            )
        except BaseException:
            for fd in (self._to_child, self._from_child, self._stdout, self._stderr):
                os.close(fd)
            raise
        finally:
            for fd in (to_child_r, from_child_w, stdout_w, stderr_w):
                os.close(fd)
        self.pid = self._process.pid
        for fd in (self._to_child, self._from_child, self._stdout, self._stderr):
            os.set_blocking(fd, False)
        self._poller = select.poll()
        for fd in (self._from_child, self._stdout, self._stderr):
            self._poller.register(fd, select.POLLIN)
        self._open_reads = {self._from_child, self._stdout, self._stderr}
        self._inbox = bytearray()
        self._scanned = 0
        self._outbox = bytearray()
        self._writing = False
        self._exit: tuple[int, float] | None = None

    def queue(self, data: bytes) -> None:
        self._outbox += data

    def next_message(self, timeout: float, out: _Capture, err: _Capture) -> dict[str, Any] | None:
        """Pump the pipes until a message arrives; None once ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            message = self._pop_message()
            if message is not None:
                return message
            if self._from_child not in self._open_reads:
                raise _ChildDied
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._pump(remaining, out, err)

    def drain(self, out: _Capture, err: _Capture) -> None:
        """Collect output already sitting in the pipes without waiting for more."""
        for fd, capture in ((self._stdout, out), (self._stderr, err)):
            for _ in range(_DRAIN_MAX_READS):
                if fd not in self._open_reads or not self._read(fd, capture):
                    break
            capture.finish()

    def kill(self, grace_s: float = 0.0) -> tuple[int, float]:
        """Kill the process group and reap it: (exit code as Popen reports it, CPU seconds).

        ``grace_s`` lets a process that is already dying finish on its own, so that its
        real exit status (say SIGXCPU) is seen instead of our SIGKILL.
        """
        if self._exit is not None:
            return self._exit
        try:
            reaped = self._wait(grace_s)
            if reaped is None:
                self._kill_group()
                reaped = self._wait(None)
            exit_code, cpu = reaped
        except ChildProcessError:
            # Someone else reaped it; all that is known is that it is gone.
            exit_code, cpu = -signal.SIGKILL, 0.0
        # Whatever it started in its process group goes too.
        self._kill_group()
        # Popen would otherwise try to reap it again.
        self._process.returncode = exit_code
        self._exit = (exit_code, cpu)
        for fd in (self._to_child, self._from_child, self._stdout, self._stderr):
            os.close(fd)
        return self._exit

    def _wait(self, timeout: float | None) -> tuple[int, float] | None:
        """Reap the process within ``timeout`` seconds (None: block): (exit code, CPU s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            flags = 0 if deadline is None else os.WNOHANG
            pid, status, usage = os.wait4(self.pid, flags)
            if pid:
                return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
            if deadline is None or time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _pump(self, timeout: float, out: _Capture, err: _Capture) -> None:
        wants_write = bool(self._outbox)
        if wants_write != self._writing:
            if wants_write:
                self._poller.register(self._to_child, select.POLLOUT)
            else:
                self._poller.unregister(self._to_child)
            self._writing = wants_write
        for fd, _events in self._poller.poll(max(1, int(timeout * 1000) + 1)):
            if fd == self._to_child:
                self._write()
            elif fd == self._from_child:
                self._read(fd, None)
            else:
                self._read(fd, out if fd == self._stdout else err)

    def _write(self) -> None:
        try:
            written = os.write(self._to_child, self._outbox)
        except BlockingIOError:
            return
        except BrokenPipeError:
            # The REPL is gone; its control pipe will report EOF next.
            written = len(self._outbox)
        del self._outbox[:written]

    def _read(self, fd: int, capture: _Capture | None) -> bool:
        """Read one chunk; False when nothing was there (or the pipe is closed)."""
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self._poller.unregister(fd)
            self._open_reads.discard(fd)
            return False
        if capture is None:
            self._inbox += chunk
        else:
            capture.feed(chunk)
        return True

    def _pop_message(self) -> dict[str, Any] | None:
        end = self._inbox.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(self._inbox)
            if self._scanned > _MAX_MESSAGE_BYTES:
                raise _ProtocolError(f"a message longer than {_MAX_MESSAGE_BYTES} bytes")
            return None
        line = bytes(self._inbox[:end])
        del self._inbox[: end + 1]
        self._scanned = 0
        try:
            message = json.loads(line.decode("utf-8", "surrogatepass"))
        except ValueError as exc:
            raise _ProtocolError(f"not JSON: {line[:80]!r}") from exc
        if not isinstance(message, dict):
            raise _ProtocolError(f"not a JSON object: {line[:80]!r}")
        return message


class _Capture:
    """One output stream of a cell, bounded: its first and last ``keep`` characters."""

    def __init__(self, keep: int) -> None:
        self._keep = max(1, keep)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head = ""
        self._tail = ""
        self.total = 0

    def feed(self, data: bytes) -> None:
        self._add(self._decoder.decode(data))

    def finish(self) -> None:
        # A multi-byte character cut off at the end still counts, as U+FFFD.
        self._add(self._decoder.decode(b"", final=True))
        self._decoder.reset()

    def render(self, budget: int) -> str:
        if self.total <= budget:
            return self._head
        head = budget // 2
        tail = budget - head
        cut = self.total - head - tail
        end = self._tail[len(self._tail) - tail :] if tail else ""
        return f"{self._head[:head]}\n[... {cut} characters truncated ...]\n{end}"

    def _add(self, text: str) -> None:
        if not text:
            return
        self.total += len(text)
        if len(self._head) < self._keep:
            self._head += text[: self._keep - len(self._head)]
        self._tail = (self._tail + text)[-self._keep :]


def _render_outputs(out: _Capture, err: _Capture, limit: int) -> tuple[str, str]:
    """Share ``limit`` between stdout and stderr; a short stream leaves its room to the other."""
    half = limit // 2
    if out.total + err.total <= limit:
        budgets = (out.total, err.total)
    elif out.total <= half:
        budgets = (out.total, limit - out.total)
    elif err.total <= half:
        budgets = (limit - err.total, err.total)
    else:
        budgets = (half, limit - half)
    return out.render(budgets[0]), err.render(budgets[1])


def _cell_error_message(
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


def _encode(message: dict[str, Any]) -> bytes:
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass") + b"\n"


def _clean_env(scratch: Path) -> dict[str, str]:
    """Built from nothing: the host's environment holds API keys the REPL must not see."""
    return {
        "PATH": _CHILD_PATH,
        "LANG": "C.UTF-8",
        "HOME": str(scratch),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _base_interpreter() -> Path:
    """The interpreter behind the venv: child.py needs only the standard library."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(sys.base_prefix) / "bin" / version
    if candidate.exists():
        return candidate.resolve()
    return Path(sys.executable).resolve()


def _choose_isolation(requested: str) -> tuple[str, str]:
    """(isolation_kind, a sentence describing what is in force)."""
    # Root is exempt from RLIMIT_NPROC, so say so rather than imply a fork limit.
    as_root = "; no process-count limit (running as root)" if os.geteuid() == 0 else ""
    if requested == "none":
        reason = "isolation='none' was requested"
    else:
        problem = _bwrap_problem()
        if problem is None:
            return "bwrap", f"bwrap: no network, read-only system, private /tmp, rlimits{as_root}"
        if requested == "bwrap":
            raise SandboxError(f"isolation='bwrap' was requested but {problem}")
        reason = problem
    # Without namespaces a cell can also read the host's files and /proc/<pid>/environ.
    return "none", f"process + rlimits (no network or filesystem isolation: {reason}){as_root}"


def _bwrap_problem() -> str | None:
    """Why bubblewrap cannot be used here, or None when it works."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap not installed"
    return _probe_bwrap(bwrap, str(_base_interpreter()))


@functools.cache
def _probe_bwrap(bwrap: str, interpreter: str) -> str | None:
    # Containers often ship bwrap but forbid the namespaces it needs; only a real run tells.
    command = [
        bwrap,
        *("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"),
        *("--ro-bind", "/", "/", "--size", str(1 << 20), "--tmpfs", "/tmp"),
        *("--", interpreter, "-I", "-S", "-c", ""),
    ]
    try:
        probe = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run here ({exc})"
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no message"])[0]
        return f"bubblewrap cannot create its sandbox here ({reason})"
    return None


def _bwrap_arguments(
    env: dict[str, str], scratch: Path, context: Path, tmp_bytes: int, index: Path | None = None
) -> list[str]:
    """A root filesystem with the system read-only, nothing of the host's data but the
    context, and the scratch directory as the only writable place besides a small /tmp."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args.append("--clearenv")
    for name, value in env.items():
        args += ["--setenv", name, value]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            # Merged-/usr systems: keep the symlink so paths like /lib64/ld-linux resolve.
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    prefix = Path(sys.base_prefix).resolve()
    if not prefix.is_relative_to("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    # These come after /tmp so that paths under /tmp land on top of the fresh tmpfs.
    args += ["--bind", str(scratch), str(scratch)]
    args += ["--ro-bind", str(context), str(context)]
    if index is not None:
        args += ["--ro-bind", str(index), str(index)]
    for script in (CHILD_SCRIPT, *CHILD_MODULES):
        args += ["--ro-bind", str(script), str(script)]
    # The root is a tmpfs holding the mount points; read-only, nothing can be written beside them.
    args += ["--chdir", str(scratch), "--remount-ro", "/"]
    return args


def _nproc_limit() -> int | None:
    """RLIMIT_NPROC for the REPL, or None where it would not bind (root is exempt)."""
    if os.geteuid() == 0:
        return None
    # The limit counts every task of this user, the service's own included, so it has to
    # sit above what already runs or the REPL could not even start.
    return _tasks_of_user(os.getuid()) + _NPROC_HEADROOM


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


def _tree_cpu_seconds(root: int) -> float:
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


def _remove_tree(path: Path) -> None:
    """Delete the scratch directory even if a cell made parts of it read-only."""

    def make_writable_and_retry(function: Callable[..., Any], target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            function(target)
        except OSError:
            logger.warning("could not remove %s from a sandbox scratch directory", target)

    shutil.rmtree(path, onerror=make_writable_and_retry)
