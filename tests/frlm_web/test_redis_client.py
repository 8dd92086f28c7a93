"""The process's Redis client riding out a restart (frlm_web/redis_client.py), against real
redis-server processes: one killed, then one started on the same port that is still loading
its data, and answers some commands (PUBLISH) while it refuses the rest with LOADING."""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from frlm_web.redis_client import OUTAGE_ERRORS, Outage, RidingRetry
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs redis-server (apt-get install redis-server)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(port: int, data: Path, *extra: str) -> subprocess.Popen:
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
         "--save", "", "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return server


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A data directory whose dump.rdb holds 20,000 keys."""
    port = free_port()
    server = serve(port, tmp_path, "--enable-debug-command", "yes")
    try:
        wait_until(lambda: listening(port), timeout=10, what="redis-server to listen")
        client = redis.Redis(port=port)
        wait_until(client.ping, timeout=10, what="redis-server to answer")
        client.execute_command("DEBUG", "POPULATE", 20_000)
        client.save()
    finally:
        server.kill()
        server.wait()
    assert (tmp_path / "dump.rdb").stat().st_size > 100_000
    return tmp_path


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for server in started:
        server.kill()
        server.wait()


def test_a_restart_is_lost_once_and_back_once_though_redis_answers_while_loading(
    dump: Path, servers: list[subprocess.Popen], tmp_path: Path, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(RidingRetry, "_outage", Outage(logging.getLogger("frlm_web.redis"), "t"))
    port = free_port()
    empty = tmp_path / "empty"
    empty.mkdir()
    servers.append(serve(port, empty))
    wait_until(lambda: listening(port), timeout=10, what="redis-server to listen")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(
        url, retry=RidingRetry(url), retry_on_error=list(OUTAGE_ERRORS), socket_keepalive=True
    )
    assert client.set("k", "v")

    servers[0].send_signal(signal.SIGKILL)
    servers[0].wait()
    with caplog.at_level(logging.WARNING, logger="frlm_web.redis"):
        published = concurrent.futures.ThreadPoolExecutor(1).submit(client.publish, "news", "x")
        time.sleep(0.3)  # it meets the outage: refused, and tried again with backoff
        # The same port, now loading 20,000 keys at 100 µs each (about 2 s), and answering
        # clients between every KiB it reads: the PUBLISH goes through while it loads.
        slowly = ("--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024")
        servers.append(serve(port, dump, *slowly))
        assert published.result(timeout=30) == 0
        assert client.dbsize() == 20_000  # waited for it to load
        assert client.get("key:1") == b"value:1"

    said = [r.getMessage() for r in caplog.records if r.name == "frlm_web.redis"]
    assert sum("lost Redis" in line for line in said) == 1, said
    assert sum("Redis is back" in line for line in said) == 1, said


def test_a_client_that_must_not_repeat_a_command_does_not_retry_it(settings) -> None:
    """get_redis(ride_out=False) (the recorder's, the forwarder's and a worker's pops): a
    command that fails fails at once, for the caller's loop to handle. redis-py 8's Redis()
    retries a failed command ten times by itself (from_url, which get_redis uses, does not):
    this pins that the repeat this client exists to avoid never happens."""
    from frlm_web.redis_client import get_redis

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    client = get_redis.__wrapped__(ride_out=False)
    connection = client.connection_pool.make_connection()
    assert connection.retry.get_retries() == 0
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 1.0
