"""Large-context benchmark, on a private stack (real Redis, Celery conductor and venue
workers, the simulated model server), printed in one run:

1. peak memory (RSS) of the conductor, of the REPL and of each venue worker while a needle
   question runs over a 1 GB text context (against the 300 MB target for the conductor);
2. BM25 index build time and query latency for select_fragments, at 1M and 10M tokens;
3. score, sub-queries and wall time of the simulated model on each generated task
   (sniah, mniah, oolong, pairs) at 32K, 1M and 10M tokens.

    .venv/bin/python bench/context.py [--gb 1] [--sizes 32000,1000000,10000000] [--skip-1gb]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from _stack import private_stack, stop_on_signals

from frlm_web.stack import Stack, VenueSpec

TASK_NAMES = ("sniah", "mniah", "oolong", "pairs")
POLICY = {"cell_timeout_s": 1800, "subquery_timeout_s": 300, "batch_deadline_s": 3600}
NEEDLE_KEY = "silver-estuary"
NEEDLE_VALUE = "7310248"


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def repl_pids(conductor: int) -> list[int]:
    """The REPL processes under the conductor (bubblewrap's child, or the child itself)."""
    pending, seen = children(conductor), []
    while pending:
        pid = pending.pop()
        seen.append(pid)
        pending.extend(children(pid))
    return [p for p in seen if "child.py" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Sampler:
    """Peak RSS of named processes, sampled every 20 ms on a thread."""

    def __init__(self, stack: Stack) -> None:
        self.conductor = stack.procs["conductor"].popen.pid
        self.workers = {
            name: proc.popen.pid for name, proc in stack.procs.items() if name.startswith("worker-")
        }
        self.peak: dict[str, int] = {}
        self.base: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self.base = {"conductor": rss_kb(self.conductor)}
        self.base.update({n: rss_kb(p) for n, p in self.workers.items()})
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        tick = 0
        repls: list[int] = []
        while not self._stop.is_set():
            self._note("conductor", rss_kb(self.conductor))
            for name, pid in self.workers.items():
                self._note(name, rss_kb(pid))
            if tick % 10 == 0:
                repls = repl_pids(self.conductor)
            self._note("repl", sum(rss_kb(p) for p in repls))
            tick += 1
            time.sleep(0.02)

    def _note(self, name: str, kb: int) -> None:
        self.peak[name] = max(self.peak.get(name, 0), kb)


def run_to_end(context: Any, question: str, venues: list[str], timeout: float = 3600) -> Any:
    from runs.models import Run
    from runs.services import run_create, run_launch
    from workers.backends import model_spec

    run = run_create(
        question=question,
        context=context,
        policy=POLICY,
        root_model=model_spec("sim", role="root"),
        worker_model=model_spec("sim", role="worker"),
        venues=venues,
    )
    run_launch(run)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(id=run.id)
        if run.done:
            return run
        time.sleep(0.1)
    raise TimeoutError(f"run {run.id} did not finish in {timeout} s")


def write_big_context(path: Path, gigabytes: float) -> int:
    """A haystack of `gigabytes` GB of plain sentences with one needle at 61%."""
    block = (
        "The ferry left the harbour at dawn and the gulls followed it past the breakwater. "
        "Rain moved in from the west while the market traders packed up their stalls.\n"
    ) * 6400  # about 1 MB
    blocks = -(-int(gigabytes * 2**30) // len(block))
    needle_at = int(blocks * 0.61)
    with path.open("w", encoding="utf-8") as out:
        for i in range(blocks):
            out.write(block)
            if i == needle_at:
                out.write(
                    f"One of the special magic numbers for {NEEDLE_KEY} is: {NEEDLE_VALUE}.\n"
                )
    return path.stat().st_size


def bench_memory(stack: Stack, names: list[str], gigabytes: float, work: Path) -> None:
    from runs.services import ContextSpec

    path = work / "big.txt"
    size = write_big_context(path, gigabytes)
    question = f"What is the special magic number for {NEEDLE_KEY} mentioned in the provided text?"
    with Sampler(stack) as sampler:
        started = time.perf_counter()
        run = run_to_end(ContextSpec(path=str(path)), question, names)
        wall = time.perf_counter() - started
    mb = 1024
    print(f"\n1. memory on a {size / 2**30:.2f} GB context ({size:,} bytes), needle question")
    print(
        f"   run {run.id}: {run.status}, answer {run.answer!r} (expected {NEEDLE_VALUE}), "
        f"{run.subqueries} sub-queries, {wall:.1f} s"
    )
    conductor = sampler.peak["conductor"] / mb
    idle = sampler.base["conductor"] / mb
    print(
        f"   conductor peak RSS  {conductor:8.1f} MB  (idle before {idle:.1f}"
        f" MB; target < 300 MB: {conductor / 300:.2f}x of it; context/conductor "
        f"{size / 2**20 / conductor:.1f}x)"
    )
    print(f"   REPL peak RSS       {sampler.peak.get('repl', 0) / mb:8.1f} MB")
    for name in sampler.workers:
        print(
            f"   {name:<19} {sampler.peak[name] / mb:8.1f} MB peak  "
            f"(idle before {sampler.base[name] / mb:.1f} MB)"
        )
    path.unlink()


def bench_index(work: Path, sizes: list[int]) -> None:
    from django.conf import settings

    from runs.engine import fragindex
    from runs.engine.context import context_prepare
    from runs.taskgen import make_task

    print("\n2. select_fragments: BM25 index build (subprocess) and query latency")
    queries = ["special magic number", "harbour ferry timetable", "flooded the meadows", "owls"]
    for tokens in sizes:
        if tokens < 1_000_000:
            continue
        task = make_task("sniah", tokens, 11)
        path = work / f"index-{tokens}.txt"
        task.write_context(path)
        started = time.perf_counter()
        prepared = context_prepare(f"bench{tokens}", path)
        offsets_s = time.perf_counter() - started
        root = Path(settings.DATA_DIR)
        first = fragindex.select(root, path, prepared.index_path, prepared.sha256, queries[0], 8)
        latencies = []
        for _ in range(5):
            for query in queries:
                picked = fragindex.select(
                    root, path, prepared.index_path, prepared.sha256, query, 8
                )
                latencies.append(picked["query_ms"])
        print(
            f"   {tokens:>10,} tokens ({path.stat().st_size / 2**20:6.1f} MB): offset index "
            f"{offsets_s:6.2f} s, BM25 build {first['build_ms'] / 1000:6.2f} s over "
            f"{first['passages']:,} passages; query median {statistics.median(latencies):7.1f} "
            f"ms, max {max(latencies):7.1f} ms (cold {first['query_ms']:.1f} ms)"
        )
        path.unlink()


def bench_tasks(names: list[str], sizes: list[int]) -> None:
    from runs.services import ContextSpec
    from runs.taskgen import answer_score

    print("\n3. generated tasks, simulated root and workers (score is the task's official style)")
    print("   (run s: the run's wall time; with gen: also generating and writing the context)")
    print(
        f"   {'task':<7} {'tokens':>11} {'score':>6} {'sub-q':>6} {'run s':>8} {'with gen':>9}"
        "  status"
    )
    for tokens in sizes:
        for name in TASK_NAMES:
            started = time.perf_counter()
            run = run_to_end(ContextSpec(task=name, tokens=tokens, seed=7), "", names)
            wall = time.perf_counter() - started
            score = answer_score(run.task, run.expected_answer, run.answer)
            print(
                f"   {name:<7} {tokens:>11,} {score:6.3f} {run.subqueries:>6} "
                f"{(run.wall_ms or 0) / 1000:8.2f} {wall:9.2f}  "
                f"{run.status}{'' if run.status == 'succeeded' else ': ' + run.error[:100]}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the memory run's context")
    parser.add_argument("--sizes", default="32000,1000000,10000000")
    parser.add_argument("--skip-1gb", action="store_true")
    parser.add_argument("--latency-ms", type=float, default=5)
    args = parser.parse_args()
    stop_on_signals()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    sim = {"latency_ms": args.latency_ms, "spread": 0}
    venues = [VenueSpec("local", 8, sim, "bench-local"), VenueSpec("edge", 8, sim, "bench-edge")]
    from django.conf import settings

    work = Path(settings.FRLM_CONTEXT_DIR) / "bench"  # under the default FRLM_CONTEXT_ROOTS
    work.mkdir(parents=True, exist_ok=True)
    print(
        "context benchmark: simulated model, 2 venues x 8 worker slots, "
        f"{args.latency_ms:g} ms simulated latency; policy {json.dumps(POLICY)}"
    )
    with private_stack(venues) as stack:
        names = [v.name for v in venues]
        if not args.skip_1gb:
            bench_memory(stack, names, args.gb, work)
        bench_index(work, sizes)
        bench_tasks(names, sizes)


if __name__ == "__main__":
    main()
