"""The stack's watch over its processes (ARCHITECTURE.md §3): a process that dies
(redis-server included) is started again with the same command, after a delay that doubles
each time it dies again soon after a start, so one that keeps dying costs a start every
half minute at most, never a tight loop. Each death and restart is a line in the stack's log
(`logs/stack.log`) and a count with its last reason in the stack's state (`stack.json`),
which `frlm_status` prints. Nothing is restarted once the stack is stopping."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from frlm_web.stack import Stack

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"
LOG_FILE = "stack.log"  # under logs/
STOPPING_FILE = "stopping"  # written by frlm_down before it stops anything
PID_FILE = "supervisor.pid"  # the process that holds the stack (frlm_up --foreground)

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STABLE_S = 30.0  # a process that lived this long starts again with the first delay


@dataclass
class Life:
    """What the supervisor knows of one process."""

    pid: int = 0
    restarts: int = 0
    last_reason: str = ""
    last_restart: float | None = None  # epoch seconds
    started: float = 0.0  # monotonic, of the current start
    quick_deaths: int = 0  # deaths in a row within STABLE_S of their start
    due: float | None = None  # monotonic: when the dead process is started again

    def public(self) -> dict[str, Any]:
        keep = ("pid", "restarts", "last_reason", "last_restart")
        return {k: v for k, v in asdict(self).items() if k in keep}


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor(threading.Thread):
    """Checks the stack's processes every `every_s` and starts a dead one again."""

    def __init__(self, stack: Stack, *, every_s: float = 0.2) -> None:
        super().__init__(name="frlm-supervisor", daemon=True)
        self.stack = stack
        self.every_s = every_s
        self.stopping = threading.Event()
        self.lives: dict[str, Life] = {}
        self.status: dict[str, Any] = {}  # more to say in the state (ready, error)
        self.lock = threading.Lock()  # check() against stop(): no launch once stopping

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            try:
                self.check()
            except Exception:  # the watch itself must outlive whatever went wrong once
                log.exception("supervisor: a check failed; checking again")

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)

    def forbidden(self) -> bool:
        return self.stopping.is_set() or (self.stack.state_dir / STOPPING_FILE).exists()

    def check(self) -> None:
        """1. note a process that died and when it is due to start again, 2. start those
        that are due, 3. write the state when anything changed."""
        changed = False
        now = time.monotonic()
        for name, proc in list(self.stack.procs.items()):
            with self.lock:
                if self.forbidden():
                    return
                if name in self.stack.retired or proc.popen is None:
                    continue
                life = self.lives.setdefault(name, Life(pid=proc.popen.pid, started=now))
                code = proc.popen.poll()
                if code is None:
                    continue
                if life.due is None:
                    self._died(name, life, code, now)
                    changed = True
                elif now >= life.due:
                    self._start_again(name, life, now)
                    changed = True
        if changed:
            self.write_state()

    def _died(self, name: str, life: Life, code: int, now: float) -> None:
        quick = now - life.started < STABLE_S
        life.quick_deaths = life.quick_deaths + 1 if quick else 1
        delay = min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (life.quick_deaths - 1))
        life.due = now + delay
        life.last_reason = exit_reason(code)
        self.note(f"{name} (pid {life.pid}) {life.last_reason}; starting it again in {delay:.1f} s")

    def _start_again(self, name: str, life: Life, now: float) -> None:
        proc = self.stack.procs[name]
        self.stack.launch(proc)
        assert proc.popen is not None
        life.pid = proc.popen.pid
        life.restarts += 1
        life.due = None
        life.started = now
        life.last_restart = time.time()
        self.note(f"{name} started again as pid {life.pid} (restart {life.restarts})")

    def note(self, text: str) -> None:
        """A line in the stack's log (which is also frlm_up --foreground's output: this
        process's own log says it at debug level only, not twice)."""
        log.debug("supervisor: %s", text)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.stack.state_dir / "logs" / LOG_FILE, "a") as fh:
            fh.write(f"{stamp} supervisor: {text}\n")

    def write_state(self, **status: Any) -> None:
        self.status.update(status)
        write_state(self.stack.state_dir, self.state())

    def state(self) -> dict[str, Any]:
        procs = {}
        for name, proc in self.stack.procs.items():
            life = self.lives.get(name) or Life(pid=proc.popen.pid if proc.popen else 0)
            procs[name] = life.public()
        return {"supervisor_pid": os.getpid(), "procs": procs, **self.status}


def write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """The stack's state for operators (frlm_status), replaced whole by rename."""
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def read_state(state_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def pid_alive(pid: int) -> bool:
    """Whether a process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def supervisor_pid(state_dir: Path) -> int | None:
    """The pid of the stack's supervisor process, if it runs."""
    try:
        pid = int((state_dir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def status(state_dir: Path, running: list[str]) -> dict[str, Any]:
    """A stack as data: its supervisor's pid (None: not running) and each process, up or
    not, with how often the supervisor started it again, when last and why."""
    state = read_state(state_dir)
    procs: dict[str, Any] = state.get("procs", {})
    processes = []
    for name in sorted(set(procs) | set(running)):
        life = procs.get(name, {})
        last = life.get("last_restart")
        processes.append(
            {
                "name": name,
                "up": name in running,
                "restarts": int(life.get("restarts") or 0),
                "last_restart": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(last))
                if last
                else None,
                "last_reason": life.get("last_reason") if life.get("restarts") else None,
            }
        )
    return {"supervisor_pid": supervisor_pid(state_dir), "processes": processes}


def status_lines(state_dir: Path, running: list[str]) -> list[str]:
    """What an operator sees of a stack: its supervisor, each process, and its restarts."""
    seen = status(state_dir, running)
    pid = seen["supervisor_pid"]
    lines = [
        f"supervisor: pid {pid}"
        if pid
        else "supervisor: not running: nothing restarts a process that dies; "
        "`make down` then `make up` brings it back"
    ]
    for proc in seen["processes"]:
        line = f"{proc['name']}: {'up' if proc['up'] else 'DOWN'}"
        if proc["restarts"]:
            when = proc["last_restart"][:19].replace("T", " ")
            line += f", restarted {proc['restarts']} time(s), last at {when}: {proc['last_reason']}"
        lines.append(line)
    return lines
