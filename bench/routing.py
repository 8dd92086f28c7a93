"""Routing benchmark: a swarm where a quarter of the workers are three times slower.

Prints, measured in one run on real Redis, Celery workers, the worker runtime and the
simulated model server:
1. the wall time of a 256-sub-query batch routed by the scheduler, by a plain shared venue
   queue (whichever worker is free takes the next job: what Celery does by itself) and by
   round-robin, and their ratios (targets: the scheduler no slower than the shared queue,
   at least 1.5x faster than round-robin);
2. when one worker of an honest swarm starts lying (after the swarm's reputations have
   settled under the redundant tier), how many sub-queries are sent before its share of
   the last 100 falls below 5%, and how many of its lies were accepted.

    .venv/bin/python bench/routing.py [--workers 8] [--concurrency 4] [--latency-ms 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _stack import private_stack, run_to_end, stop_on_signals

from frlm_web import presence
from frlm_web.redis_client import get_redis

MODES = ("score", "shared", "round_robin")


def profile_file(args: argparse.Namespace, directory: Path) -> Path:
    path = directory / "bench-routing.toml"
    path.write_text(
        f"""description = "routing benchmark: a quarter of the devices 3x slower"
concurrency = {args.concurrency}
[latency]
median_ms = {args.latency_ms}
spread = 0.0
slow_share = 0.25
slow_factor = 3.0
"""
    )
    return path


def batch_program(n: int) -> str:
    return (
        "Run this program.\n```repl\nimport time\n"
        f"prompts = ['routing question %d' % i for i in range({n})]\n"
        "t = time.perf_counter()\nrs = llm_query_batched(prompts)\n"
        "elapsed = time.perf_counter() - t\n"
        "failed = sum(r.startswith('[frlm:') for r in rs)\n"
        "FINAL(f'{elapsed:.4f} {failed}')\n```"
    )


def measure(n: int, mode: str) -> tuple[float, int]:
    run = run_to_end(
        batch_program(n),
        venues=["edge"],
        policy={
            "routing": mode,
            "max_batch": n,
            "max_subqueries": 4 * n,
            "cell_timeout_s": 3600,
            "subquery_timeout_s": 120,
        },
    )
    if run.status != "succeeded":
        raise SystemExit(f"benchmark run failed ({mode}): {run.error}")
    elapsed, failed = run.answer.split()
    return float(elapsed), int(failed)


def wait_for_workers(count: int, timeout: float = 120.0) -> None:
    client = get_redis()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(presence.alive(client, "venue:edge")) >= count:
            return
        time.sleep(0.2)
    raise SystemExit(f"the swarm did not bring {count} workers up in {timeout:.0f} s")


def turncoat_profile(args: argparse.Namespace, directory: Path, after_s: float) -> Path:
    path = directory / "bench-turncoat.toml"
    path.write_text(
        f"""description = "routing benchmark: one device starts lying after {after_s:g} s"
concurrency = {args.concurrency}
[latency]
median_ms = {args.latency_ms / 4}
spread = 0.0
[faults]
lie_share = {1 / args.workers}
lie_rate = 1.0
lie_after_s = {after_s}
"""
    )
    return path


def redundant_batch(n: int, round_: int) -> str:
    return (
        "Run this program.\n```repl\n"
        f"rs = llm_query_batched(['round {round_} question %d' % i for i in range({n})])\n"
        "FINAL(str(len(rs)))\n```"
    )


def liar_share(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    """Honest swarm under the redundant tier until reputations settle; then one device
    turns liar. Counts the sub-queries sent from that moment until the liar's share of the
    last WINDOW falls below 5%, and the lies accepted on its word alone."""
    from runs.models import Run
    from traces import store
    from workers.swarm import devices, profile_load
    from workers.venues import live_workers

    warm_s = 40.0
    path = turncoat_profile(args, directory, warm_s)
    (liar_name,) = [
        d.name for d in devices(profile_load(str(path)), "edge", args.workers, 0) if d.liar
    ]
    policy = {"tier": "redundant", "max_batch": 256, "max_subqueries": 100_000}
    from frlm_web.stack import VenueSpec

    with private_stack([VenueSpec("edge", swarm=str(path), workers=args.workers)]):
        wait_for_workers(args.workers)
        (entry,) = [w for w in live_workers(get_redis(), "edge") if w["label"] == liar_name]
        liar = entry["worker_id"]
        turns_at = process_started(int(entry["pid"])) + warm_s  # epoch seconds
        runs: list[str] = []
        round_ = 0
        while time.time() < turns_at + 1:  # reputations settle while everyone is honest
            run_to_end(redundant_batch(64, round_), venues=["edge"], policy=policy)
            round_ += 1
        sent: list[str] = []  # the worker of each sub-query dispatched since the liar turned
        accepted_lies = 0
        passed = None
        while passed is None and len(sent) < 20_000:
            run = run_to_end(redundant_batch(64, round_), venues=["edge"], policy=policy)
            round_ += 1
            assert isinstance(run, Run)
            runs.append(run.id)
            events = store.read_events(run.id)
            judged = {e["parent_id"] for e in events if e["name"] == "Verify.Redundant"}
            for e in sorted(events, key=lambda e: e["seq"]):
                if e["ts"] < turns_at * 1e9:
                    continue
                # Probes are not work (nor answers to accept): a probe sent to the liar is
                # how it is caught, not a share of the traffic (bench/trust.py counts so too).
                probe = e["attrs"].get("copy") == "probe"
                if e["name"] == "SubQuery.Submit" and e["phase"] == "start" and not probe:
                    sent.append(e["worker_id"])
                    original = not e["attrs"].get("replica_of")
                    if e["worker_id"] == liar and original and e["span_id"] not in judged:
                        accepted_lies += 1  # taken unverified: its trust gate let it pass
                    if len(sent) >= WINDOW and passed is None:
                        if sent[-WINDOW:].count(liar) / WINDOW < 0.05:
                            passed = len(sent)
                if e["name"] == "Verify.Redundant" and e["attrs"]["outcome"] == "accept":
                    if liar in e["attrs"]["agreed"]:
                        accepted_lies += 1
    return {
        "passed": float(passed if passed is not None else -1),
        "liar_sent": float(sent.count(liar) if passed is None else sent[:passed].count(liar)),
        "accepted_lies": float(accepted_lies),
        "warm_rounds": float(round_),
    }


WINDOW = 100


def process_started(pid: int) -> float:
    """When a process started, in epoch seconds (from /proc)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-liar", action="store_true")
    args = parser.parse_args()
    stop_on_signals()

    from frlm_web.stack import VenueSpec

    with tempfile.TemporaryDirectory() as tmp:
        profile = profile_file(args, Path(tmp))
        swarm = VenueSpec("edge", swarm=str(profile), workers=args.workers)
        with private_stack([swarm]):
            wait_for_workers(args.workers)
            for mode in MODES:  # warm connections, workers and latency estimates
                measure(args.n // 4, mode)
            times: dict[str, list[tuple[float, int]]] = {m: [] for m in MODES}
            for _ in range(args.repeat):
                for mode in MODES:
                    times[mode].append(measure(args.n, mode))
        liar = None if args.skip_liar else liar_share(args, Path(tmp))

    slow = round(args.workers * 0.25)
    rate = (args.workers - slow) * args.concurrency / (args.latency_ms / 1000) + slow * (
        args.concurrency / (3 * args.latency_ms / 1000)
    )
    fluid = args.n / rate
    best = {m: min(t for t, _ in times[m]) for m in MODES}
    print(
        f"routing benchmark: {args.n} sub-queries on {args.workers} workers x "
        f"{args.concurrency} slots, {slow} of them 3x slower ({args.latency_ms:.0f} ms vs "
        f"{3 * args.latency_ms:.0f} ms)"
    )
    print(f"  fluid lower bound            {fluid:7.3f} s")
    for mode in MODES:
        tries = ", ".join(f"{t:.3f}" for t, _ in times[mode])
        failed = sum(f for _, f in times[mode])
        print(f"  {mode:<12} best {best[mode]:7.3f} s   tries {tries}   failed {failed}")
    print(
        f"  scheduler vs shared queue    {best['shared'] / best['score']:5.2f}x faster "
        "(target >= 1.00x)"
    )
    print(
        f"  scheduler vs round-robin     {best['round_robin'] / best['score']:5.2f}x faster "
        "(target >= 1.50x)"
    )
    if liar is not None:
        print(
            f"one worker of {args.workers} turns liar (redundant tier, 2 of 2 agree): "
            f"{liar['passed']:.0f} sub-queries sent before its share of the last {WINDOW} "
            f"fell below 5% ({liar['liar_sent']:.0f} of them to the liar); lies accepted "
            f"on its word: {liar['accepted_lies']:.0f}"
        )


if __name__ == "__main__":
    main()
