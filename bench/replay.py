"""Replay and diff benchmark, measured side by side in one run on a private stack:

frlm_diff A B            `manage.py frlm_diff` of two 1,000-sub-query runs, as a command
                         (target < 0.6 s), as a user finds them (the recorder has cached
                         each run's span tree beside its segments), then with no cache (the
                         command folds both trees in DuckDB); the diff in-process beside it
frlm_replay, cold        `manage.py frlm_replay` of a 1,000-sub-query run with fresh worker
                         and conductor processes (target < 3 s), and the recorded run's wall
                         time beside it
replay diffs clean       `frlm_diff` of the run and its replay finds no divergence (the run's
                         workers fail 1% of their calls and straggle 2% of the time, so it
                         has retries and hedges, and its quorum of 99% cuts off stragglers)
command floor            `manage.py frlm_diff --help`: what any command pays before its work

  .venv/bin/python bench/replay.py [--n 1000] [--repeat 3] [--quick] [--profile]

--profile then runs `frlm_diff A B` under cProfile, and a replay's conductor in the bench's
own process under cProfile (against the stack's workers), and prints their top lines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# _stack sets up Django on a private instance
from _stack import (
    cpu_spent,
    private_stack,
    run_to_end,
    stack_cpu_s,
    stop_on_signals,
    stop_requested,
)
from django.conf import settings

from frlm_web.stack import Stack, VenueSpec

DIFF_TARGET_S = 0.6
REPLAY_TARGET_S = 3.0
MANAGE = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
SIM = {"latency_ms": 20, "straggler_rate": 0.02, "straggler_factor": 10, "failure_rate": 0.01}


def batch_program(n: int) -> str:
    """A root program that sends `n` sub-queries as one batch, then answers."""
    return (
        "Run.\n```repl\nrs = llm_query_batched(['replay bench %d' % i for i in range("
        f"{n})])\nFINAL(str(sum(not r.startswith('[frlm:') for r in rs)))\n```"
    )


@dataclass
class Timing:
    wall_s: float
    cpu_s: float  # the command process's own CPU (user + system)
    stack_cpu_s: float = 0.0  # the stack's processes' CPU meanwhile (a replay's real work)


def command(stack: Stack, *args: str, timeout: float = 600) -> tuple[Timing, str]:
    """Run a manage.py command against the stack: its timing and its stdout. On a loaded
    machine the wall time grows with the load; the CPU seconds much less."""
    env = {**stack.env, "FRLM_REDIS_URL": stack.redis_url}
    cpu_before, stack_before = _children_cpu_s(), stack_cpu_s(stack)
    started = time.perf_counter()
    done = subprocess.run(
        [*MANAGE, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    stack_spent = sum(cpu_spent(stack_before, stack_cpu_s(stack)).values())
    return Timing(seconds, _children_cpu_s() - cpu_before, stack_spent), done.stdout


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stored(run_id: str, timeout: float = 120, quiet_s: float = 2.0) -> None:
    """Wait until the recorder has stored the run's last event (its Run.Init end) and no
    more have come for `quiet_s`: the workers of attempts given up (a hedge's loser, a
    cut-off straggler) end their Execute spans after the run has ended."""
    from traces import store

    deadline = time.monotonic() + timeout
    count, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        stop_requested()
        events = store.read_events(run_id)
        if len(events) != count:
            count, quiet_since = len(events), time.monotonic()
        ended = any(e["name"] == "Run.Init" and e["phase"] == "end" for e in events)
        if ended and time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.2)
    raise SystemExit(f"the trace of run {run_id} was not stored within {timeout} s")


def fresh_processes(stack: Stack) -> None:
    """Cold: the venue workers and the conductor stopped and started again, so nothing
    of the recorded run is loaded in any process that serves the replay."""
    names = [n for n in stack.procs if n.startswith("worker-") or n == "conductor"]
    for name in names:
        stack.kill(name, signal.SIGTERM)
    for name in names:
        stack.restart(name, timeout=300)


def recorded_run(n: int, policy: dict) -> str:
    from runs.models import Run

    run = run_to_end(batch_program(n), venues=["local", "edge"], policy=policy)
    assert isinstance(run, Run)
    if run.status != Run.Status.SUCCEEDED:
        raise SystemExit(f"the recorded run {run.id} {run.status}: {run.error}")
    stored(run.id)
    return run.id


def wall_s(run_id: str) -> float:
    from runs.models import Run

    return (Run.objects.get(id=run_id).wall_ms or 0.0) / 1000


def profiled(stack: Stack, args: list[str], lines: int = 25) -> str:
    """The command run again under cProfile: its top `lines` by cumulative time."""
    out = Path(settings.DATA_DIR) / "bench-replay.prof"
    env = {**stack.env, "FRLM_REDIS_URL": stack.redis_url}
    subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(out), *MANAGE[1:], *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    import io
    import pstats

    text = io.StringIO()
    pstats.Stats(str(out), stream=text).sort_stats("cumulative").print_stats(lines)
    return text.getvalue()


def profiled_conductor(run_a: str, lines: int = 30) -> str:
    """A full replay of `run_a` conducted in this process (as the conductor's task does,
    against the stack's workers) under cProfile: where a replay's own time goes."""
    import cProfile
    import io
    import pstats

    from runs.engine.conductor import Conductor
    from runs.models import Run
    from runs.services import run_replay

    run = run_replay(Run.objects.get(id=run_a))
    profile = cProfile.Profile()
    profile.enable()
    Conductor(run).conduct()
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(15)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="sub-queries per run")
    parser.add_argument("--repeat", type=int, default=3, help="timings of each command")
    parser.add_argument("--quick", action="store_true", help="one timing of each")
    parser.add_argument("--profile", action="store_true", help="profile the commands")
    args = parser.parse_args()
    stop_on_signals()
    repeat = 1 if args.quick else args.repeat
    policy = {"max_batch": args.n, "max_subqueries": 2 * args.n, "quorum": 0.99}
    venues = [VenueSpec("local", 16, SIM, "rb-local"), VenueSpec("edge", 16, SIM, "rb-edge")]
    with private_stack(venues) as stack:
        run_a, run_b = recorded_run(args.n, policy), recorded_run(args.n, policy)
        rows = measure(stack, run_a, run_b, repeat)
        report(args.n, run_a, rows)
        if args.profile:
            print("\nfrlm_diff A B under cProfile (cumulative):")
            print(profiled(stack, ["frlm_diff", run_a, run_b]))
            print("the replay's conductor, in this process, under cProfile:")
            print(profiled_conductor(run_a))


def measure(stack: Stack, run_a: str, run_b: str, repeat: int) -> dict[str, list]:
    """Each command `repeat` times, interleaved so drift in the machine's load falls on
    all of them: the floor, the diff, the diff in-process, a cold replay and its diff."""
    from traces import store
    from traces.diff import run_diff

    rows: dict[str, list] = {"floor": [], "diff": [], "in_process": [], "replay": []}
    rows |= {"replay_wall": [], "clean": [], "first": [], "cached": []}
    for _ in range(repeat):
        rows["floor"].append(command(stack, "frlm_diff", "--help")[0])
        # The recorder folds a finished run's span tree into a cache beside its segments
        # once the run has been quiet for 2 s (traces.store._tree_columns): the diff as a
        # user finds it. Then without the cache (a run diffed within 2 s of its end, or
        # recorded before there was one): the command folds both trees in DuckDB.
        caches = [store.run_dir(run_id) / store.TREE_CACHE for run_id in (run_a, run_b)]
        rows["cached"].append(all(cache.exists() for cache in caches))
        rows["diff"].append(command(stack, "frlm_diff", run_a, run_b)[0])
        for cache in caches:
            cache.unlink(missing_ok=True)
        rows["first"].append(command(stack, "frlm_diff", run_a, run_b)[0])
        cpu, started = time.process_time(), time.perf_counter()
        run_diff(run_a, run_b)
        rows["in_process"].append(Timing(time.perf_counter() - started, time.process_time() - cpu))
        fresh_processes(stack)
        timing, out = command(stack, "frlm_replay", run_a, "--json")
        rows["replay"].append(timing)
        copy = json.loads(out)["run_id"]
        rows["replay_wall"].append(Timing(wall_s(copy), 0.0))
        stored(copy)
        divergence = run_diff(run_a, copy)["first_divergence"]
        rows["clean"].append(divergence is None)
        if divergence is not None:
            print(f"  replay {copy} diverges: {json.dumps(divergence)[:600]}")
    return rows


def report(n: int, run_a: str, rows: dict[str, list]) -> None:
    def row(label: str, timings: list[Timing], target: float | None = None) -> str:
        walls = [t.wall_s for t in timings]
        best, median = min(walls), statistics.median(walls)
        cpu = min(t.cpu_s for t in timings)
        stack = min(t.stack_cpu_s for t in timings)
        ratio = f"{best / target:5.2f}x of target {target:g} s" if target else ""
        cpus = f"{cpu:6.2f} s" + (f" + stack {stack:5.2f} s" if stack else " " * 16)
        return f"  {label:34} {best:7.3f} s {median:7.3f} s  {cpus}  {ratio}"

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"replay bench: {n:,}-sub-query runs, {len(rows['diff'])} timing(s) each, "
        f"load {load} on {os.cpu_count()} cores"
    )
    print(f"  {'':34} {'wall best':>9} {'median':>9}  CPU (command, stack meanwhile)")
    print(row("manage.py frlm_diff --help (floor)", rows["floor"]))
    print(row("manage.py frlm_diff A B", rows["diff"], DIFF_TARGET_S))
    print(row("  the same with no tree cache", rows["first"], DIFF_TARGET_S))
    print(row("  run_diff in-process", rows["in_process"]))
    print(row("manage.py frlm_replay, cold", rows["replay"], REPLAY_TARGET_S))
    print(row("  the replay run's own wall", rows["replay_wall"]))
    print(row("  the recorded run's wall", [Timing(wall_s(run_a), 0.0)]))
    floor = min(t.wall_s for t in rows["floor"])
    first = min(t.wall_s for t in rows["first"]) - floor
    over = min(t.wall_s for t in rows["diff"]) - floor
    print(f"  frlm_diff A B over the floor       {over:7.3f} s ({first:.3f} s with no cache)")
    print(
        f"  trees cached by the recorder       {sum(rows['cached'])}/{len(rows['cached'])} "
        "of the diffs found both runs' cache"
    )
    print(f"  replay diffs clean                 {sum(rows['clean'])}/{len(rows['clean'])}")


if __name__ == "__main__":
    main()
