"""The REPL process and its four pipes (control in and out, stdout, stderr), pumped without
threads; what the cell prints is kept bounded, its first and last characters."""

from __future__ import annotations

import codecs
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from runs.sandbox.protocol import MAX_MESSAGE_BYTES, ChildDied, ProtocolError, decode

_READ_CHUNK = 1 << 16
# After "done", whatever is still in the output pipes belongs to the cell; a background
# writer must not keep us draining forever.
_DRAIN_MAX_READS = 256


class ReplProcess:
    """One REPL process and the four pipes to it (control in/out, stdout, stderr)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        config: dict,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
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
                pass_fds=(to_child_r, from_child_w, *pass_fds),
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

    def next_message(self, timeout: float, out: Capture, err: Capture) -> dict[str, Any] | None:
        """Pump the pipes until a message arrives; None once ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            message = self._pop_message()
            if message is not None:
                return message
            if self._from_child not in self._open_reads:
                raise ChildDied
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._pump(remaining, out, err)

    def drain(self, out: Capture, err: Capture) -> None:
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

    def _pump(self, timeout: float, out: Capture, err: Capture) -> None:
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

    def _read(self, fd: int, capture: Capture | None) -> bool:
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
            if self._scanned > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            return None
        line = bytes(self._inbox[:end])
        del self._inbox[: end + 1]
        self._scanned = 0
        return decode(line)


class Capture:
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


def render_outputs(out: Capture, err: Capture, limit: int) -> tuple[str, str]:
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
