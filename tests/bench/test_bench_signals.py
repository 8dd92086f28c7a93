"""What issue 18 promises of the benches, run as a developer runs them: a bench killed by
SIGTERM (a timeout) or SIGINT (Ctrl-C) in the middle of its run stops every process its
private stack started, deletes the network namespaces it made and removes its data
directory; `--latency-ms 0` runs; a fanout prints sub-queries/s.

Each bench runs as its own process with none of this session's private instance in its
environment, so it makes its own (frlm_web/settings_isolated.py), as from a shell."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from frlm_web import netlab
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
CAN_NETNS, WHY_NOT = netlab.can_create()


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every process under `root`, with its start time (a recycled pid does not repeat
    both)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            stat = _stat(child)
            if stat is not None:
                found[child] = stat[2]
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int, started: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[1] != "Z"


def _instance_dir(tree: dict[int, int]) -> Path | None:
    """The bench's private data directory, as its stack's processes inherited it (the
    bench's own /proc environ is the one it started with, before it made the directory);
    None once none of them is left to tell."""
    for pid in tree:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"FRLM_TEST_SESSION_DIR="):
                return Path(item.split(b"=", 1)[1].decode())
    return None


def _data_dir(tree: dict[int, int]) -> Path:
    found = _instance_dir(tree)
    assert found is not None, "no process of the bench's stack names its data directory"
    return found


def _kill_mid_run(
    bench: subprocess.Popen[str], signum: int, *, has: list[str], seen: dict[int, int]
) -> None:
    """Once the bench's stack runs processes of every kind in `has` (and a moment more, so
    its batch is under way), send `signum` to the bench alone; `seen` gets the processes
    under it then."""

    def up() -> bool:
        if bench.poll() is not None:
            raise AssertionError(f"the bench ended before it was killed:\n{bench.stdout.read()}")
        tree = _descendants(bench.pid)
        seen.update(tree)
        lines = [_cmdline(pid) for pid in tree]
        return all(any(kind in line for line in lines) for kind in has)

    wait_until(up, timeout=180, every=0.2, what=f"the bench's stack ({', '.join(has)})")
    time.sleep(2)
    seen.update(_descendants(bench.pid))
    assert len(seen) >= len(has), seen
    bench.send_signal(signum)


def _of_instance(data: Path) -> dict[int, int]:
    """Every process whose environment names the bench's data directory, wherever it hangs
    now: one its parent left behind is no longer under the bench."""
    marker = f"FRLM_TEST_SESSION_DIR={data}".encode()
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                stat = _stat(int(entry.name))
                if stat is not None:
                    found[int(entry.name)] = stat[2]
        except OSError:
            continue
    return found


def _left_running(seen: dict[int, int], data: Path) -> list[str]:
    """What still runs of the processes seen under the bench or of its instance."""
    every = {**seen, **_of_instance(data)}
    return [f"{pid} {_cmdline(pid)[:120]}" for pid, t in every.items() if _alive(pid, t)]


@contextmanager
def _bench(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], dict[int, int]]]:
    """The bench running as from a shell, and the processes seen under it (filled by
    _kill_mid_run); whatever of them a failed test leaves is killed."""
    # This session's instance (its Redis port, data directory, database) stays out: the
    # bench makes its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRLM_", "DJANGO_"))}
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a Ctrl-C in the test's terminal is not the bench's
    )
    seen: dict[int, int] = {}
    try:
        yield bench, seen
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        data = _instance_dir(seen)
        left = {**seen, **(_of_instance(data) if data is not None else {})}
        for pid, started in left.items():
            if _alive(pid, started):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_fanout_bench_killed_mid_run_leaves_nothing_behind(signum: int) -> None:
    with _bench("fanout.py", "--n", "4000", "--latency-ms", "50", "--repeat", "3") as (
        bench,
        seen,
    ):
        kinds = ["redis-server", "frlm_conductor", "frlm_worker", "frlm_recorder", "frlm_simserver"]
        _kill_mid_run(bench, signum, has=kinds, seen=seen)
        data = _data_dir(seen)
        out, _ = bench.communicate(timeout=90)
        wait_until(
            lambda: not _left_running(seen, data), timeout=10, what="the stack's processes to end"
        )
        assert not data.exists(), f"{data} is left behind"
        assert bench.returncode == 128 + signum, out


@pytest.mark.skipif(not CAN_NETNS, reason=f"cannot create network namespaces here: {WHY_NOT}")
def test_a_federation_bench_killed_mid_run_deletes_its_hosts() -> None:
    """The hosts of bench/federation.py are network namespaces with a broker worker and a
    gateway worker in each: killed, the bench takes them all down, and none of its
    namespaces is left in `ip netns`."""
    with _bench("federation.py", "--quick", "--workers", "2") as (bench, seen):
        _kill_mid_run(bench, signal.SIGTERM, has=["frlm_worker", "--connect gateway"], seen=seen)
        owned = re.compile(rf"{netlab.PREFIX}[0-9a-f]{{6}}-{bench.pid}-")
        assert owned.search(_netns()), "the bench made no host of its own"
        data = _data_dir(seen)
        out, _ = bench.communicate(timeout=120)
        wait_until(
            lambda: not _left_running(seen, data), timeout=10, what="the hosts' processes to end"
        )
        assert not owned.search(_netns()), _netns()
        assert bench.returncode == 128 + signal.SIGTERM, out


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_fanout_at_zero_latency_prints_its_throughput() -> None:
    args = ["--latency-ms", "0", "--n", "200", "--repeat", "1", "--skip-sequential"]
    with _bench("fanout.py", *args) as (bench, _seen):
        out, _ = bench.communicate(timeout=240)
    assert bench.returncode == 0, out
    assert "(no ideal at 0 ms)" in out, out
    best = re.search(r"FRLM fanout, best .* ([\d,]+) sub-queries/s .* of the floor", out)
    assert best and int(best[1].replace(",", "")) > 0, out
    assert re.search(r"CPU ceiling: [\d.]+ ms per sub-query", out), out
