"""A network lab for tests and benches: "another host" on this machine, as issue 16's proof
needs it. A `Host` is a network namespace reached only through a veth pair, whose
processes also get a private mount namespace in which the conductor's data directories are
empty tmpfs: no shared disk, no loopback services (Redis, the database port). What the host
may reach is what a `DelayProxy` on its veth address forwards, with a one-way delay of our
own because this kernel has no netem.

    with Host() as host:
        proxy = host.forward(web_port, delay_ms=25)
        worker = host.run([python, "manage.py", "frlm_worker", "--server",
                           f"http://{host.host_ip}:{proxy.port}", ...], env=env,
                          hide=[data_dir], mkdirs=[f"{data_dir}/edge"])

Only root can build one; `can_create()` says why not for `pytest.skip`. A run killed with
-9 leaves its namespace behind; `sweep()` (also run before a process's first `Host`)
removes those whose owner is gone: the owner's pid and start time are in the name."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import functools
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "frlm-"
NETWORK = ipaddress.ip_network("10.213.0.0/16")  # carved into /30s, one per host
LOCK_FILE = "/run/frlm-netlab.lock"  # serialises address choice between processes
_NAME = re.compile(rf"{PREFIX}(?P<token>[0-9a-f]{{6}})-(?P<pid>\d+)-(?P<start>\d+)")
_VETH = re.compile(r"frlm(?P<token>[0-9a-f]{6})[hn]")
_CHUNK = 65536


class NetlabError(RuntimeError):
    pass


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not path:
        raise NetlabError(f"`{name}` is not installed")
    return path


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run([_tool("ip"), *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise NetlabError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@functools.cache
def can_create() -> tuple[bool, str]:
    """(True, "") when this machine can build hosts; else False and why, for pytest.skip.
    Tries the real thing in a throwaway namespace: a veth pair and a private tmpfs."""
    if os.geteuid() != 0:
        return False, f"network namespaces need root (euid {os.geteuid()})"
    try:
        ip, unshare, mount, sh = map(_tool, ("ip", "unshare", "mount", "sh"))
    except NetlabError as error:
        return False, str(error)
    probe = (f"{ip} link add frlmprobe0 type veth peer name frlmprobe1 && "
             f"{mount} -t tmpfs frlm-probe {shlex.quote(tempfile.gettempdir())}")  # fmt: skip
    done = subprocess.run([unshare, "--net", "--mount", "--propagation", "private", sh, "-c",
                           probe], capture_output=True, text=True, timeout=30)  # fmt: skip
    if done.returncode:
        return False, f"cannot create namespaces here: {done.stderr.strip()}"
    return True, ""


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot): with its pid, an identity that a
    recycled pid does not repeat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _kill_inside(name: str) -> None:
    for pid in _ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep() -> list[str]:
    """Delete namespaces (and veths) of ours whose owning process is gone; return their
    names. Links are listed before namespaces: a live host makes its namespace first, so
    a veth seen without one is a leftover, never a host being built."""
    links = re.findall(r"^\d+: (frlm[0-9a-f]{6}[hn])[@:]", _ip("-o", "link"), re.M)
    removed, live = [], set()
    for match in filter(None, map(_NAME.fullmatch, _ip("netns", "list").split())):
        name = match[0]
        if _start_time(int(match["pid"])) == int(match["start"]):
            live.add(match["token"])
            continue
        _kill_inside(name)
        _ip("netns", "del", name, check=False)
        removed.append(name)
    for link in links:
        if _VETH.fullmatch(link)["token"] not in live:
            _ip("link", "del", link, check=False)
    return removed


@dataclass
class ProxyStats:
    connections: int = 0  # accepted since start
    open: int = 0  # live now
    bytes_up: int = 0  # from the host's clients towards the target
    bytes_down: int = 0  # from the target back to the clients


class DelayProxy:
    """A TCP forwarder on its own event-loop thread: byte streams both ways (HTTP,
    WebSockets), each chunk delivered `delay_ms` after it arrived, so delay is latency, not
    a throughput limit. `cut()` resets every live connection as a dropped link would;
    `freeze()` holds what each live connection carries from then on, both ways, while its
    TCP stays up (a silent path: a NAT that lost its mapping, a peer's frozen host), until
    `thaw()`; new connections flow."""

    def __init__(
        self, *, listen_host: str, target_port: int, listen_port: int = 0,
        target_host: str = "127.0.0.1", delay_ms: float = 0.0,
    ) -> None:  # fmt: skip
        self.listen_host, self.port = listen_host, listen_port
        self.target = (target_host, target_port)
        self.delay_ms = delay_ms  # may be changed while running; applies to new chunks
        self.stats = ProxyStats()
        self._live: dict[asyncio.Task, tuple[asyncio.StreamWriter, ...]] = {}
        self._flowing: dict[asyncio.Task, asyncio.Event] = {}  # cleared: frozen
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="netlab-proxy", daemon=True)

    def start(self) -> DelayProxy:
        self._thread.start()
        self._ready.wait(10)
        if self._error or not self._ready.is_set():
            raise NetlabError(f"proxy on {self.listen_host}:{self.port}: {self._error}")
        return self

    def cut(self) -> int:
        """Reset every live connection (both sides); return how many were open."""
        return asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def freeze(self) -> int:
        """Hold every live connection's bytes from now on; return how many were open."""

        def hold() -> int:
            for flowing in self._flowing.values():
                flowing.clear()
            return len(self._flowing)

        return self._in_loop(hold)

    def thaw(self) -> None:
        self._in_loop(lambda: [flowing.set() for flowing in self._flowing.values()])

    def _in_loop(self, work):  # noqa: ANN001, ANN202 - a callable and what it returns
        async def run():  # noqa: ANN202
            return work()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(10)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        try:
            server = await asyncio.start_server(
                self._serve, self.listen_host, self.port, backlog=1024
            )
        except OSError as error:
            self._error = error
            self._ready.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        self._stopping = asyncio.Event()
        self._ready.set()
        await self._stopping.wait()
        server.close()
        await self._cut()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _cut(self) -> int:
        live = dict(self._live)
        for task, writers in live.items():
            for writer in writers:
                sock = writer.get_extra_info("socket")
                with contextlib.suppress(OSError):  # linger 0: closing sends a reset
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            task.cancel()
        await asyncio.gather(*live, return_exceptions=True)  # counters settled on return
        return len(live)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: per direction a reader stamps each chunk with its due time and a
        sender delivers in order at that time, so chunks in flight overlap as bytes on a
        long wire do; a bounded queue passes a slow receiver's backpressure back."""
        self.stats.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._live[asyncio.current_task()] = (writer, up_writer)
        flowing = self._flowing[asyncio.current_task()] = asyncio.Event()
        flowing.set()
        self.stats.open += 1
        up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=256)
        down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=256)
        tasks = [
            asyncio.create_task(self._read(reader, up, "bytes_up")),
            asyncio.create_task(self._send(up, up_writer, flowing)),
            asyncio.create_task(self._read(up_reader, down, "bytes_down")),
            asyncio.create_task(self._send(down, writer, flowing)),
        ]
        broken = True
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            broken = any(not t.cancelled() and t.exception() for t in done)
            await flowing.wait()  # frozen: a close or reset does not pass either
        except asyncio.CancelledError:
            pass  # cut or stopped: end quietly (asyncio's stream callback trips on a cancel)
        finally:
            self.stats.open -= 1
            self._live.pop(asyncio.current_task(), None)
            self._flowing.pop(asyncio.current_task(), None)
            for task in tasks:
                task.cancel()
            for side in (writer, up_writer):
                if broken:  # a reset on one side is a reset on the other
                    side.transport.abort()
                else:
                    side.close()

    async def _read(self, reader: asyncio.StreamReader,
                    queue: asyncio.Queue[tuple[float, bytes]], counter: str) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_CHUNK)
            setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
            await queue.put((loop.time() + self.delay_ms / 1000, data))
            if not data:
                return

    @staticmethod
    async def _send(queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter,
                    flowing: asyncio.Event) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            await flowing.wait()
            if not data:  # the other side closed its half: pass the EOF on
                if writer.can_write_eof() and not writer.transport.is_closing():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()


_open_hosts: set[Host] = set()
_swept = False


class Host:
    """Another host: a network namespace joined to this one by a veth pair with private
    /30 addresses (`host_ip` on this side, `ns_ip` inside). Inside, 127.0.0.1 is the host's
    own loopback, so this machine's loopback services are out of reach; `forward()` is
    the way in. Closed by `close()`, `with`, atexit, SIGTERM or SIGINT."""

    def __init__(self) -> None:
        global _swept
        if not _swept:
            sweep()
            _swept = True
        token = secrets.token_hex(3)
        self.owner = os.getpid()
        self.name = f"{PREFIX}{token}-{self.owner}-{_start_time(self.owner)}"
        self.veth_host, self.veth_ns = f"frlm{token}h", f"frlm{token}n"
        self.procs: list[subprocess.Popen] = []
        self.proxies: list[DelayProxy] = []
        self._closed = False
        _install_cleanup()
        _open_hosts.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.name)
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two labs must not pick the same /30
            net = _free_subnet()
            self.host_ip, self.ns_ip = str(net[1]), str(net[2])
            _ip("link", "add", self.veth_host, "type", "veth",
                "peer", "name", self.veth_ns, "netns", self.name)  # fmt: skip
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.veth_host)
        _ip("link", "set", self.veth_host, "up")
        _ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.veth_ns)
        _ip("-n", self.name, "link", "set", self.veth_ns, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")

    def forward(self, target_port: int, *, delay_ms: float = 0.0, listen_port: int = 0,
                target_host: str = "127.0.0.1") -> DelayProxy:  # fmt: skip
        """A started proxy from `host_ip` (reachable from inside) to a port of ours."""
        proxy = DelayProxy(listen_host=self.host_ip, listen_port=listen_port,
                           target_host=target_host, target_port=target_port,
                           delay_ms=delay_ms)  # fmt: skip
        self.proxies.append(proxy)
        return proxy.start()

    def run(self, argv: Sequence[str], *, env: dict[str, str], hide: Iterable[str] = (),
            mkdirs: Iterable[str] = (), cwd: str = "/", **popen) -> subprocess.Popen:  # fmt: skip
        """Start `argv` on this host in its own session (kill its group with -9). Each dir
        in `hide` is made if missing, then covered by an empty tmpfs in the process's
        private mount namespace (invisible to this one and to other processes); `mkdirs`
        are made after that, e.g. a fresh data dir inside a hidden one. The cwd is entered
        after the mounts, or a cwd inside a hidden dir would still show what it hides."""
        mkdir, mount = shlex.quote(_tool("mkdir")), shlex.quote(_tool("mount"))
        steps = []
        for path in sorted(hide):
            path = shlex.quote(path)
            steps += [f"{mkdir} -p -- {path}", f"{mount} -t tmpfs -o mode=0755 frlm-hidden {path}"]
        steps += [f"{mkdir} -p -- {shlex.quote(path)}" for path in mkdirs]
        steps += [f"cd {shlex.quote(cwd)}", 'exec "$@"']
        command = [_tool("ip"), "netns", "exec", self.name,
                   _tool("unshare"), "--mount", "--propagation", "private", "--",
                   _tool("sh"), "-c", " && ".join(steps), "frlm-host", *argv]  # fmt: skip
        popen.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(command, env=env, cwd="/", start_new_session=True, **popen)
        self.procs.append(proc)  # ip, unshare and sh each exec the next: one pid throughout
        return proc

    def set_link(self, *, up: bool) -> None:
        """Take the wire down or up: packets vanish without a reset, as on a dead link."""
        _ip("link", "set", self.veth_host, "up" if up else "down")

    def close(self) -> None:
        """Stop proxies, kill what runs inside, delete the namespace and the veth pair."""
        if self._closed:
            return
        self._closed = True
        _open_hosts.discard(self)
        for proxy in self.proxies:
            with contextlib.suppress(Exception):
                proxy.stop()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        _kill_inside(self.name)
        _ip("netns", "del", self.name, check=False)
        _ip("link", "del", self.veth_host, check=False)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /30 of NETWORK that no address of this namespace is in (call under lock)."""
    taken = {
        ipaddress.ip_interface(word).ip
        for line in _ip("-o", "-4", "addr").splitlines()
        for word in line.split()[3:4]
    }
    subnets = NETWORK.num_addresses // 4
    for _ in range(64):
        net = ipaddress.ip_network(f"{NETWORK[4 * secrets.randbelow(subnets)]}/30")
        if not any(address in net for address in taken):
            return net
    raise NetlabError(f"no free /30 left in {NETWORK}")


def _close_owned() -> None:
    for host in list(_open_hosts):
        if host.owner == os.getpid():  # a forked child must not tear down its parent's
            host.close()


@functools.cache
def _install_cleanup() -> None:
    """atexit, and SIGTERM/SIGINT handlers that close our hosts and then do what the
    previous handler would have done (pytest's KeyboardInterrupt, or dying by the signal).
    SIGKILL cannot be caught: that is what `sweep()` is for."""
    atexit.register(_close_owned)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            _close_owned()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(signum, handler)
