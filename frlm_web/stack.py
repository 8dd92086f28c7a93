"""The whole product as processes on one machine: redis, the simulated model server, the
recorder, a conductor, venue workers and the web server. `manage.py frlm_up` and the test
suite start it through this one class, so what the tests run is what a user runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from django.conf import settings

from frlm_web import presence, redis_acl
from frlm_web.supervisor import (
    PID_FILE,
    STOPPING_FILE,
    Supervisor,
    pid_alive,
    supervisor_pid,
)


class StackError(RuntimeError):
    pass


@dataclass(frozen=True)
class VenueSpec:
    name: str
    concurrency: int = 16
    sim: dict[str, float] = field(default_factory=dict)  # the simulated model's profile
    worker_name: str = ""
    swarm: str = ""  # a swarm profile (workers/profiles): run `workers` devices of it instead
    workers: int = 1
    consumer: str = ""  # frlm_worker --consumer (celery, frlm); "" for its default

    @property
    def member(self) -> str:
        return self.worker_name or f"{self.name}-worker"


@dataclass
class Proc:
    name: str
    argv: list[str]
    ready: Callable[[], bool]
    popen: subprocess.Popen | None = None
    role: str = "admin"  # whom it connects to Redis as (frlm_web/redis_acl.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


WS_HANDSHAKE_S = 30


def web_proc(port: int, host: str | None = None) -> Proc:
    """The web server (daphne: HTTP and WebSockets, request bodies bounded by
    frlm_web/web_server.py), on loopback unless FRLM_WEB_HOST (or
    `host`) names another address: workers on other machines reach it there. Its WebSocket
    messages may be as large as a gateway job with its fragments (daphne's default: 1 MiB).
    Behind the HTTPS proxy (FRLM_HTTPS) a request's address is the one the proxy forwards:
    the sign-in and worker API throttles count per client, not all as the proxy."""
    from workers.gateway.protocol import MAX_MESSAGE_BYTES

    proxied = ["--proxy-headers"] if settings.FRLM_HTTPS else []

    host = host or os.environ.get("FRLM_WEB_HOST") or "127.0.0.1"
    probe = "127.0.0.1" if host in ("0.0.0.0", "127.0.0.1") else host  # noqa: S104
    return Proc(
        "web",
        [
            sys.executable,
            "-m",
            "frlm_web.web_server",  # daphne, its request bodies bounded
            "-b",
            host,
            "-p",
            str(port),
            "--websocket-max-message-size",
            str(MAX_MESSAGE_BYTES),
            "--websocket-max-frame-size",
            str(MAX_MESSAGE_BYTES),
            # daphne refuses a socket whose handshake the app has not answered in 5 s, and
            # a browser sees that as 1006 with no reason. The answer waits on the session
            # lookup, which queues behind every other sync call of the process: on a loaded
            # machine (CI) or a gateway worker's slow link, 5 s was seen to be too short.
            "--websocket_connect_timeout",
            str(WS_HANDSHAKE_S),
            *proxied,
            "frlm_web.asgi:application",
        ],
        lambda: port_open(port, probe),
        role="web",
    )


class Stack:
    def __init__(
        self,
        *,
        state_dir: Path,
        venues: list[VenueSpec],
        env: dict[str, str] | None = None,
        web_port: int | None = None,
        start_redis: bool | None = None,
        redis_persist: bool = True,
        conductor_concurrency: int = 4,
    ) -> None:
        self.state_dir = state_dir
        self.venues = venues
        self.env = {**os.environ, **(env or {})}
        self.web_port = web_port
        # Redis ACL users per role when this stack's Redis has them: each process is given
        # its own role's URL; the stack itself is admin. A URL with credentials of its own
        # (an external Redis with its own auth) is passed on as it is.
        self.redis_base_url = self.env.get("FRLM_REDIS_URL", settings.FRLM_REDIS_URL)
        self.acl = settings.FRLM_REDIS_ACL and not redis_acl.has_credentials(self.redis_base_url)
        # Celery task events for Flower, as the processes started will read the setting.
        events = self.env.get("FRLM_CELERY_EVENTS", "").strip().lower()
        self.celery_events = (
            events in {"1", "true", "yes", "on"} if events else settings.FRLM_CELERY_EVENTS
        )
        self.redis_url = self.role_url("admin")
        self.client = redis.Redis.from_url(self.redis_url)
        self.start_redis = start_redis
        self.redis_persist = redis_persist
        self.conductor_concurrency = conductor_concurrency
        self.procs: dict[str, Proc] = {}
        self.retired: set[str] = set()  # stopped on purpose: not to be started again
        self.supervisor: Supervisor | None = None
        sim_port = self.env.get("FRLM_SIM_PORT")
        self.sim_port = int(sim_port) if sim_port else settings.FRLM_SIM_PORT
        self.sim_url = self.env.get("FRLM_SIM_URL") or (
            settings.FRLM_SIM_URL
            if self.sim_port == settings.FRLM_SIM_PORT
            else f"http://127.0.0.1:{self.sim_port}/v1"
        )
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        (state_dir / "pids").mkdir(parents=True, exist_ok=True)

    # --- what runs ---------------------------------------------------------------------
    def plan(self) -> list[Proc]:
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        plan: list[Proc] = []
        if self.start_redis is None:
            self.start_redis = not self._redis_up()
        if self.start_redis:
            port = str(self.client.connection_pool.connection_kwargs.get("port", 6379))
            persist = (
                ["--appendonly", "yes", "--save", ""]
                if self.redis_persist
                else ["--save", "", "--appendonly", "no"]
            )
            # The users are in place before any client connects: loaded at start.
            acl = (
                [
                    "--aclfile",
                    str(
                        redis_acl.write_acl_file(
                            self.acl_file, settings.SECRET_KEY, events=self.celery_events
                        )
                    ),
                ]
                if self.acl
                else []
            )
            plan.append(
                Proc(
                    "redis",
                    [
                        "redis-server",
                        "--port",
                        port,
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        str(self.state_dir),
                        *persist,
                        *acl,
                    ],
                    self._redis_up,
                )
            )
        plan.append(
            Proc(
                "simserver",
                [*manage, "frlm_simserver", "--host", "127.0.0.1", "--port", str(self.sim_port)],
                lambda: self._http_ok(f"{self.sim_url}/models"),
                role="simserver",
            )
        )
        plan.append(
            Proc(
                "recorder",
                [*manage, "frlm_recorder"],
                lambda: bool(self.client.exists("frlm:recorder:alive")),
                role="recorder",
            )
        )
        plan.append(
            Proc(
                "forwarder",
                [*manage, "frlm_forwarder"],
                lambda: bool(self.client.exists("frlm:forwarder:alive")),
                role="forwarder",
            )
        )
        plan.append(
            Proc(
                "conductor",
                [
                    *manage,
                    "frlm_conductor",
                    "--name",
                    "conductor-1",
                    "--concurrency",
                    str(self.conductor_concurrency),
                ],
                lambda: self._alive("conductor", "conductor-1"),
                role="conductor",
            )
        )
        for venue in self.venues:
            plan.append(self.venue_proc(venue))
        if self.web_port:
            plan.append(web_proc(self.web_port))
        return plan

    def venue_proc(self, venue: VenueSpec) -> Proc:
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        if venue.swarm:
            argv = [
                *manage,
                "frlm_swarm",
                "--venue",
                venue.name,
                "--workers",
                str(venue.workers),
                "--profile",
                venue.swarm,
            ]
            group = f"venue:{venue.name}"
            return Proc(
                f"swarm-{venue.name}",
                argv,
                lambda: len(presence.alive(self.client, group)) >= venue.workers,
                role="worker",
            )
        argv = [
            *manage,
            "frlm_worker",
            "--venue",
            venue.name,
            "--name",
            venue.member,
            "--concurrency",
            str(venue.concurrency),
        ]
        if venue.consumer:
            argv += ["--consumer", venue.consumer]
        for key, value in venue.sim.items():
            argv += [f"--sim-{key.replace('_', '-')}", str(value)]
        return Proc(
            f"worker-{venue.member}",
            argv,
            lambda: self._alive(f"venue:{venue.name}", venue.member),
            role="worker",
        )

    # --- credentials -------------------------------------------------------------------
    @property
    def acl_file(self) -> Path:
        return self.state_dir / "redis.acl"

    def role_url(self, role: str) -> str:
        if not self.acl:
            return self.redis_base_url
        return redis_acl.role_url(self.redis_base_url, role, settings.SECRET_KEY)

    def role_env(self, role: str) -> dict[str, str]:
        """A process's environment: its role's Redis URL. A worker is not given the
        server's secret key, from which every role's password derives; it holds its own
        credentials only."""
        env = {**self.env, "FRLM_REDIS_URL": self.role_url(role), "FRLM_REDIS_ROLE": role}
        if role == "web":
            env["FRLM_LEASE_WATCH"] = "1"  # it fails the runs of a dead conductor
        if role == "worker":
            env.pop("FRLM_SECRET_KEY", None)
        return env

    # --- start and stop ----------------------------------------------------------------
    def start(self, timeout: float = 90.0, *, supervise: bool = False) -> None:
        """Start every process in order, each ready before the next; with `supervise`,
        then watch them (frlm_web/supervisor.py): one that dies is started again."""
        (self.state_dir / STOPPING_FILE).unlink(missing_ok=True)
        for proc in self.plan():
            self.launch(proc)
            self.wait_ready(proc, timeout)
        if supervise:
            self.supervise()

    def supervise(self) -> None:
        self.supervisor = Supervisor(self)
        self.supervisor.write_state()
        self.supervisor.start()

    def launch(self, proc: Proc) -> None:
        log = open(self.state_dir / "logs" / f"{proc.name}.log", "ab")  # noqa: SIM115
        proc.popen = subprocess.Popen(
            proc.argv,
            cwd=settings.BASE_DIR,
            env=self.role_env(proc.role),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        (self.state_dir / "pids" / f"{proc.name}.pid").write_text(str(proc.popen.pid))
        self.procs[proc.name] = proc

    def wait_ready(self, proc: Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise StackError(
                    f"{proc.name} exited with code {proc.popen.returncode}:\n"
                    + self.log_tail(proc.name)
                )
            try:
                if proc.ready():
                    return
            except (OSError, redis.RedisError):
                pass
            time.sleep(0.1)
        raise StackError(
            f"{proc.name} was not ready within {timeout:.0f} s:\n{self.log_tail(proc.name)}"
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.state_dir / "logs" / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one process (a worker, the recorder) the way a crash or an operator would.
        A supervised stack starts it again (see retire for a stop that lasts)."""
        proc = self.procs[name]
        if proc.popen is not None and proc.popen.poll() is None:
            os.killpg(proc.popen.pid, sig)
            proc.popen.wait(timeout=30)

    def retire(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process for good: the supervisor leaves it stopped."""
        self.retired.add(name)
        self.kill(name, sig)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start a process that was killed again, and wait until it is ready. A supervised
        stack does it by itself: then this only waits for that."""
        proc = self.procs[name]
        self.retired.discard(name)
        if self.supervisor is None:
            self.launch(proc)
        else:
            dead = proc.popen
            deadline = time.monotonic() + timeout
            while proc.popen is dead and time.monotonic() < deadline:
                time.sleep(0.05)
        self.wait_ready(proc, timeout)

    def stop(self) -> None:
        """Stop watching, then ask every process to stop (reverse order), then force
        those that linger."""
        if self.supervisor is not None:
            self.supervisor.stop()
        procs = list(reversed(self.procs.values()))
        # Redis last: the others need it while they shut down (release a lock, withdraw).
        for wave in (
            [p for p in procs if p.name != "redis"],
            [p for p in procs if p.name == "redis"],
        ):
            self._stop_wave([p for p in wave if p.popen and p.popen.poll() is None])
        for pidfile in (self.state_dir / "pids").glob("*.pid"):
            pidfile.unlink(missing_ok=True)

    def _stop_wave(self, running: list[Proc]) -> None:
        for proc in running:
            try:
                os.killpg(proc.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for proc in running:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.popen.wait()

    # --- readiness ---------------------------------------------------------------------
    def _redis_up(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.AuthenticationError as exc:
            raise StackError(
                f"the Redis at {self.redis_base_url} refuses this stack's admin user ({exc}): "
                "it was not started by this stack with this FRLM_SECRET_KEY. Stop it, or "
                "give its own credentials in FRLM_REDIS_URL, or set FRLM_REDIS_ACL=0 for a "
                "Redis without FRLM's users"
            ) from exc
        except redis.RedisError:
            return False

    def _alive(self, group: str, member: str) -> bool:
        # A registered worker is in presence under its id, and its name is its label.
        return any(
            member in (w.get("name"), w.get("label")) for w in presence.alive(self.client, group)
        )

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=0.5) as response:  # noqa: S310 (loopback)
                return response.status == 200
        except OSError:
            return False


def stop_from_pidfiles(state_dir: Path, timeout: float = 20.0) -> list[str]:
    """Stop a stack started by another process (`frlm_down`): 1. say it is stopping (the
    supervisor starts nothing again from then on), 2. stop the supervisor, which stops
    the stack in order, 3. whatever still runs (the supervisor was gone, or slow):
    everything else first, then redis, which the others need while they shut down. A
    data directory where no stack ever started has nothing to stop."""
    if not state_dir.is_dir():
        return []
    (state_dir / STOPPING_FILE).touch()
    stopped: list[str] = []
    pid = supervisor_pid(state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped.append("supervisor")
    (state_dir / PID_FILE).unlink(missing_ok=True)
    pidfiles = list((state_dir / "pids").glob("*.pid"))
    for wave in (
        [p for p in pidfiles if p.stem != "redis"],
        [p for p in pidfiles if p.stem == "redis"],
    ):
        pids: list[int] = []
        for pidfile in wave:
            try:
                pid = int(pidfile.read_text())
                os.killpg(pid, signal.SIGTERM)
                pids.append(pid)
                stopped.append(pidfile.stem)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
            pidfile.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if pid_alive(pid)]
            time.sleep(0.1)
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return stopped


def running_from_pidfiles(state_dir: Path) -> list[str]:
    names: list[str] = []
    for pidfile in (state_dir / "pids").glob("*.pid"):
        try:
            if pid_alive(int(pidfile.read_text())):
                names.append(pidfile.stem)
        except ValueError:
            pass
    return names
