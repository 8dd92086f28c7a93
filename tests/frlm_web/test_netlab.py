"""The network lab against the real kernel: a process on a namespaced host reaches this
machine only through the delay proxy, sees the hidden data directories empty, loses its
connections when the link is cut, and leaves nothing behind when its host is closed, its
owner is terminated, or its owner is killed and a later run sweeps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from frlm_web import netlab
from frlm_web.stack import port_open

REPO = Path(__file__).resolve().parents[2]
# What a worker on another machine would have: no Redis URL, no data directory of ours.
MINIMAL_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}

CONNECT = """
import json, socket, sys
outcomes = {}
for name, host, port in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        outcomes[name] = "connected"
    except OSError as error:
        outcomes[name] = type(error).__name__
print(json.dumps(outcomes))
"""

ROUND_TRIPS = """
import json, socket, statistics, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
rtts = []
for _ in range(6):
    start = time.monotonic()
    sock.sendall(b"ping\\n")
    assert sock.recv(64) == b"ping\\n"
    rtts.append(time.monotonic() - start)
print(json.dumps({"rtt_ms": statistics.median(rtts[1:]) * 1000}))
"""


@pytest.fixture(autouse=True)
def namespaces_available() -> None:
    able, why = netlab.can_create()
    if not able:
        pytest.skip(why)


@pytest.fixture
def host() -> Iterator[netlab.Host]:
    with netlab.Host() as host:
        yield host


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 512  # hundreds connect at once through the proxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """An echo server on this machine's loopback, as the web server or Redis would be."""
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def inside(host: netlab.Host, code: str, *args: object, timeout: float = 30, **run) -> dict:
    proc = host.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        env=MINIMAL_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **run,
    )
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out)


def listed(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_it_keeps_this_machines_loopback_services_out_of_reach(host, echo_port) -> None:
    outcomes = inside(
        host, CONNECT, "loopback", "127.0.0.1", echo_port, "veth", host.host_ip, echo_port
    )
    assert outcomes == {"loopback": "ConnectionRefusedError", "veth": "ConnectionRefusedError"}
    assert port_open(echo_port), "the server is up; only the host cannot reach it"


def test_it_forwards_to_a_loopback_server_through_the_proxy(host, echo_port) -> None:
    proxy = host.forward(echo_port)
    result = inside(host, ROUND_TRIPS, host.host_ip, proxy.port)
    assert result["rtt_ms"] < 1000
    assert proxy.stats.connections == 1
    assert proxy.stats.bytes_up == proxy.stats.bytes_down == 6 * len(b"ping\n")


def test_the_delay_proxy_adds_its_one_way_delay_in_each_direction(host, echo_port) -> None:
    plain = inside(host, ROUND_TRIPS, host.host_ip, host.forward(echo_port).port)
    slow = inside(host, ROUND_TRIPS, host.host_ip, host.forward(echo_port, delay_ms=50).port)
    added = slow["rtt_ms"] - plain["rtt_ms"]
    assert 90 <= added <= 600, f"50 ms each way added {added:.0f} ms to a round trip"


def test_the_delay_is_latency_not_a_limit_on_throughput(host, echo_port) -> None:
    """200 chunks sent 2 ms apart through 50 ms each way: they overlap in flight, arrive in
    order, and the whole takes about the sending time plus one round trip, not 200 x 100 ms."""
    proxy = host.forward(echo_port, delay_ms=50)
    code = """
    import json, socket, sys, threading, time
    sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
    sent = b"".join(b"%05d" % i for i in range(200))
    received = bytearray()
    def read():
        while len(received) < len(sent):
            received.extend(sock.recv(65536))
    reader = threading.Thread(target=read)
    reader.start()
    start = time.monotonic()
    for i in range(200):
        sock.sendall(sent[5 * i : 5 * i + 5])
        time.sleep(0.002)
    reader.join()
    print(json.dumps({"in_order": bytes(received) == sent, "s": time.monotonic() - start}))
    """
    result = inside(host, code, host.host_ip, proxy.port)
    assert result["in_order"]
    assert result["s"] < 5, f"took {result['s']:.1f} s: the delay compounded per chunk"


def test_it_carries_hundreds_of_concurrent_connections(host, echo_port) -> None:
    proxy = host.forward(echo_port, delay_ms=5)

    async def one(i: int) -> bytes:
        reader, writer = await asyncio.open_connection(host.host_ip, proxy.port)
        writer.write(b"%d\n" % i)
        await writer.drain()
        line = await reader.readline()
        writer.close()
        return line

    async def many() -> list[bytes]:
        return await asyncio.gather(*(one(i) for i in range(300)))

    assert asyncio.run(many()) == [b"%d\n" % i for i in range(300)]
    assert proxy.stats.connections == 300


def test_a_hidden_directory_is_empty_inside_and_intact_outside(host, tmp_path) -> None:
    data_dir = tmp_path / "conductor-data"
    (data_dir / "contexts").mkdir(parents=True)
    (data_dir / "contexts" / "secret.txt").write_text("the whole context")
    edge_dir = data_dir / "edge"
    code = """
    import json, os, sys
    import frlm_web.netlab  # the repository itself stays visible
    data_dir, edge_dir = sys.argv[1], sys.argv[2]
    seen = {"listing": sorted(os.listdir(data_dir)), "cwd": os.getcwd(), "edge": os.listdir(".")}
    open("written-inside", "w").write("x")
    print(json.dumps(seen))
    """
    seen = inside(host, code, data_dir, edge_dir, hide=[str(data_dir)], mkdirs=[str(edge_dir)],
                  cwd=str(edge_dir))  # fmt: skip
    assert seen == {"listing": ["edge"], "cwd": str(edge_dir), "edge": []}
    assert (data_dir / "contexts" / "secret.txt").read_text() == "the whole context"
    assert not edge_dir.exists()
    assert "frlm-hidden" not in Path("/proc/self/mounts").read_text()


def test_cutting_the_link_resets_the_inner_clients_connection_at_once(host, echo_port) -> None:
    proxy = host.forward(echo_port)
    code = """
    import socket, sys, time
    sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    sock.sendall(b"hello"); sock.recv(5)
    print("connected", flush=True)
    try:
        outcome = "eof" if sock.recv(5) == b"" else "data"
    except ConnectionResetError:
        outcome = "reset"
    except TimeoutError:
        outcome = "nothing"
    print(outcome, time.monotonic(), flush=True)
    """
    proc = host.run([sys.executable, "-c", textwrap.dedent(code), host.host_ip, str(proxy.port)],
                    env=MINIMAL_ENV, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "connected"
    cut_at = time.monotonic()
    assert proxy.cut() == 1
    outcome, seen_at = proc.stdout.readline().split()
    proc.wait(10)
    assert outcome in ("reset", "eof")
    assert float(seen_at) - cut_at < 2.0
    assert proxy.stats.open == 0


def test_close_leaves_no_namespace_veth_or_process_behind() -> None:
    host = netlab.Host()
    sleeper = host.run(["sleep", "300"], env=MINIMAL_ENV)
    host.forward(1)
    assert host.name in listed("netns", "list")
    host.close()
    assert host.name not in listed("netns", "list")
    assert host.veth_host not in listed("-o", "link")
    assert sleeper.poll() == -signal.SIGKILL


OWNER = """
import sys
from frlm_web import netlab
host = netlab.Host()
host.run(["sleep", "300"], env={"PATH": "/usr/bin:/bin"})
print(host.name, host.veth_host, flush=True)
sys.stdin.read()  # until the test closes our stdin, or signals us
"""


def _owner() -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER], env=MINIMAL_ENV,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    name, veth = proc.stdout.readline().split()
    assert name in listed("netns", "list")
    return proc, name, veth


def test_an_owner_that_exits_without_closing_leaves_nothing_behind() -> None:
    proc, name, veth = _owner()
    proc.stdin.close()
    assert proc.wait(20) == 0
    assert name not in listed("netns", "list")
    assert veth not in listed("-o", "link")


def test_a_terminated_owner_closes_its_hosts() -> None:
    proc, name, veth = _owner()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    assert name not in listed("netns", "list")
    assert veth not in listed("-o", "link")


def test_a_sweep_removes_what_a_killed_owner_left_behind() -> None:
    proc, name, veth = _owner()
    proc.kill()
    proc.wait(10)
    assert name in listed("netns", "list")  # SIGKILL leaves it
    assert name in netlab.sweep()
    assert name not in listed("netns", "list")
    assert veth not in listed("-o", "link")
