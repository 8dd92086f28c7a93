"""Federation across real network boundaries: gateway workers on "other hosts", each in a
network namespace of its own (a veth pair, addresses only inside it) and a mount namespace
in which the server's data directories are empty (frlm_web/netlab.py). They are started with
`frlm_worker --server ... --token ...` and nothing else, and reach the web server at the
address a remote machine would use."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from frlm_web import netlab
from frlm_web.stack import Stack, free_port, port_open
from tests.gateway import GatewayWorker
from tests.helpers import finish, launch, trace, wait_until

CAN, WHY = netlab.can_create()
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not CAN, reason=f"cannot create network namespaces here: {WHY}"),
]


def _hidden() -> list[str]:
    """What another host does not have: this server's data (database, contexts, keys,
    traces) wherever it lives."""
    return sorted({str(settings.DATA_DIR), str(Path(settings.BASE_DIR) / "var")})


def _inside_env(home: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(settings.BASE_DIR),
        "DJANGO_SETTINGS_MODULE": "frlm_web.settings",
        "FRLM_DATA_DIR": home,
        "HOME": home,
    }


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[netlab.Host]]:
    with netlab.Host() as one, netlab.Host() as two:
        yield [one, two]


@pytest.fixture(scope="module")
def public_web(stack: Stack, hosts: list[netlab.Host]) -> Iterator[int]:
    """The web server as other machines reach it: bound to every address, with the
    addresses the workers use allowed as hosts."""
    port = free_port()
    env = {
        **stack.env,
        "FRLM_ALLOWED_HOSTS": ",".join(["127.0.0.1", "localhost", *[h.host_ip for h in hosts]]),
    }
    log = open(stack.state_dir / "logs" / "web-public.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "frlm_web.web_server", "-b", "0.0.0.0", "-p", str(port)]
        + ["frlm_web.asgi:application"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        wait_until(lambda: port_open(port), timeout=60, what="the public web server")
        yield port
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)


@pytest.fixture
def remote(public_web, hosts, venues, tmp_path):
    """Start a gateway worker of venue `far` on host i; they are killed after the test."""
    started: list[GatewayWorker] = []

    def start(i: int, name: str, *flags: str) -> GatewayWorker:
        host = hosts[i]
        home = f"{_hidden()[0]}/{name}"

        def spawn(argv: list[str], out) -> subprocess.Popen:
            return host.run(
                argv,
                env=_inside_env(home),
                hide=_hidden(),
                mkdirs=[home],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        server = f"http://{host.host_ip}:{public_web}"
        worker = GatewayWorker(
            server, "far", name, tmp_path, "--concurrency", "8", *flags, spawn=spawn
        )
        started.append(worker)
        worker.wait_up()
        return worker

    yield start
    for worker in started:
        worker.kill()


def test_a_1m_token_fragment_run_over_namespaced_workers_answers_correctly(remote, hosts):
    workers = [
        remote(0, "ns-a", "--sim-latency-ms", "5"),
        remote(1, "ns-b", "--sim-latency-ms", "5"),
    ]
    # The server sees each from its own network.
    assert [w.entry()["address"] for w in workers] == [h.ns_ip for h in hosts]

    run = finish(launch(task="sniah", tokens=1_000_000, seed=11, venues=["far"]), timeout=240)

    assert run.status == "succeeded", (run.error, workers[0].output()[-2000:])
    assert run.correct is True, (run.answer, run.expected_answer)
    assert run.subqueries_failed == 0
    events = trace(run)
    ends = [e for e in events if e["name"] == "SubQuery.Execute" and e["phase"] == "end"]
    assert {e["worker_id"] for e in ends} <= {w.worker_id for w in workers}
    loads = [e for e in events if e["name"] == "Env.LoadFragment" and e["venue"] == "far"]
    assert sum(e["bytes"] for e in loads) >= run.context_chars


def test_killing_a_namespaced_worker_mid_run_loses_nothing(remote):
    doomed = remote(0, "ns-doomed", "--sim-latency-ms", "1500")
    survivor = remote(1, "ns-survivor", "--sim-latency-ms", "5")
    run = launch(task="sniah", tokens=400_000, seed=12, venues=["far"])
    wait_until(lambda: (doomed.entry() or {}).get("inflight", 0) > 0, what="it to hold work")
    killed_at = time.time()
    doomed.kill()

    run = finish(run, timeout=180)

    assert run.status == "succeeded" and run.correct is True, run.error
    assert run.subqueries_failed == 0
    events = trace(run)
    (lost,) = [e for e in events if e["name"] == "Worker.Lost"]
    assert lost["worker_id"] == doomed.worker_id
    retries = [
        e["ts"] / 1e9
        for e in events
        if e["name"] == "SubQuery.Retry" and "was lost" in e["attrs"]["reason"]
    ]
    took = (lost["ts"] / 1e9 - killed_at, min(retries) - killed_at)
    # Noticed from the drop, not when its presence would have expired (the bench measures
    # the figure itself: bench/federation.py).
    assert took[1] < settings.FRLM_VENUE_HEARTBEAT_TTL_S - 0.5, (
        f"Worker.Lost {took[0]:.3f} s, first re-dispatch {took[1]:.3f} s"
    )
    ends = [e for e in events if e["name"] == "SubQuery.Execute" and e["phase"] == "end"]
    assert survivor.worker_id in {e["worker_id"] for e in ends}


PROBE = """
import json, os, socket, sys
checks = {}
def tcp(host, port):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); return "connected"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()
for label, host, port in json.loads(sys.argv[1]):
    checks[label] = tcp(host, port)
for label, path in json.loads(sys.argv[2]):
    try:
        if os.path.isdir(path):
            checks[label] = sorted(os.listdir(path))
        else:
            checks[label] = open(path, "rb").read(16).hex()
    except OSError as exc:
        checks[label] = type(exc).__name__
print(json.dumps(checks))
"""


def test_a_namespaced_worker_gets_nothing_but_the_web_server(stack, public_web, hosts):
    host = hosts[0]
    redis_port = int(stack.redis_url.rsplit(":", 1)[1].split("/")[0])
    db = str(settings.DATABASES["default"]["NAME"])
    assert Path(db).exists() and os.listdir(settings.DATA_DIR)  # there is something to steal
    targets = [
        ("redis on the server's loopback", "127.0.0.1", redis_port),
        ("redis at the server's address", host.host_ip, redis_port),
        ("the web server's loopback port", "127.0.0.1", public_web),
        ("the web server", host.host_ip, public_web),
    ]
    files = [("the data directory", str(settings.DATA_DIR)), ("the database", db)]
    with open(stack.state_dir / "logs" / "probe.log", "wb") as err:
        proc = host.run(
            [sys.executable, "-c", textwrap.dedent(PROBE), json.dumps(targets), json.dumps(files)],
            env=_inside_env("/"),
            hide=_hidden(),
            stdout=subprocess.PIPE,
            stderr=err,
        )
        out, _ = proc.communicate(timeout=60)
    checks = json.loads(out)
    assert checks == {
        "redis on the server's loopback": "ConnectionRefusedError",
        "redis at the server's address": "ConnectionRefusedError",
        "the web server's loopback port": "ConnectionRefusedError",
        "the web server": "connected",
        "the data directory": [],
        "the database": "FileNotFoundError",
    }
    # And from here, all of it is there.
    with socket.create_connection(("127.0.0.1", redis_port), timeout=2):
        pass
