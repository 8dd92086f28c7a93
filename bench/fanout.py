"""Fanout benchmark: 256 sub-queries of 200 ms simulated latency over 32 worker slots.

Prints, measured in one run on real Redis, Celery workers and the simulated model server:
the wall time of the batch through FRLM's fanout, the ideal ceil(N/W)*L, their ratio, and
the same batch run one sub-query at a time (what the original RLM does). For scale it also
measures the floor of this harness: the same requests sent straight to the simulated
model server from W threads, with no FRLM, Celery or tracing at all.

    .venv/bin/python bench/fanout.py [--n 256] [--latency-ms 200] [--slots 32]
                                     [--trusted local|local,edge|none] [--quick]
                                     [--bundle-max 1,16] [--consumer celery,frlm]
                                     [--collector frozen,python]

`--bundle-max 1,16` runs each try once with each value of policy.bundle_max, in turn, so
sending every job alone and bundling a trusted worker's jobs are measured side by side.
`--consumer celery,frlm` does the same for the venue workers' consumer (frlm_worker
--consumer; `frlm-threads` is FRLM's consumer with a thread per slot instead of one event
loop): the stack then holds a local and an edge venue per consumer (`local-celery`,
`edge-frlm`...), and each try runs the batch on each pair in turn; the stack's CPU then
includes the idle pair's, which is small and falls on both.
`--collector frozen,python` starts a stack per setting of the processes' cycle collector
(FRLM_GC_FREEZE, frlm_web/collector.py), in alternated blocks of tries: with Python's own,
a full collection stops a worker or the conductor for 60-120 ms now and then, and the
batch waits on the sub-queries it held up; the median of the tries shows it more than the
best.

Each try prints sub-queries/s beside the harness floor's, and the stack's CPU per
sub-query by process (the simulated model left out of the total). The best try's CPU also
gives the machine's ceiling: the sub-queries/s its cores allow at that CPU per sub-query
with no waiting at all, and the CPU per sub-query 0.8 of the floor would leave the stack.

By default the venues are set up as the product sets them up: `local` trusted (its worker
prefetches FRLM_WORKER_PREFETCH jobs per slot), `edge` untrusted (one job per slot, as
issue 5 asks). `--trusted` changes that, to tell the cost of the untrusted set-up apart;
the output says which set-up was measured.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _stack import cpu_spent, private_stack, run_to_end, stack_cpu_s, stop_on_signals

from frlm_web.stack import VenueSpec


def timed_program(n: int, *, sequential: bool) -> str:
    call = (
        "rs = [llm_query(p) for p in prompts]" if sequential else "rs = llm_query_batched(prompts)"
    )
    return (
        "Run this program.\n```repl\nimport time\n"
        f"prompts = ['bench question %d' % i for i in range({n})]\n"
        f"t = time.perf_counter()\n{call}\nelapsed = time.perf_counter() - t\n"
        "failed = sum(r.startswith('[frlm:') for r in rs)\n"
        "FINAL(f'{elapsed:.4f} {failed}')\n```"
    )


def measure(
    n: int, venues: list[str], *, sequential: bool, bundle_max: int | None = None
) -> tuple[float, int, str]:
    policy = {
        "max_batch": max(n, 1),
        "max_subqueries": 2 * n,
        "cell_timeout_s": 3600,
        "subquery_timeout_s": 120,
    }
    if bundle_max is not None:
        policy["bundle_max"] = bundle_max
    run = run_to_end(timed_program(n, sequential=sequential), venues=venues, policy=policy)
    if run.status != "succeeded":
        raise SystemExit(f"benchmark run failed: {run.error}")
    elapsed, failed = run.answer.split()
    return float(elapsed), int(failed), str(run.id)


def split(run_id: str, n: int) -> list[tuple[int, float]]:
    """Sub-queries and median execution ms per worker, from the run's stored trace: alike
    workers should take equal shares, or the batch waits for the busier one."""
    from traces.store import worker_figures

    deadline = time.monotonic() + 15
    rows = []
    while time.monotonic() < deadline:
        rows = worker_figures(run_id)
        if sum(r["calls"] for r in rows) >= n:
            break
        time.sleep(0.2)  # the recorder stores the run's last events
    return [(r["calls"], r["p50_ms"] or 0.0) for r in rows]


def harness_floor(n: int, slots: int, latency_ms: float, *, procs: int = 1) -> float:
    """The machine's floor: `slots` threads calling the simulated model server directly,
    spread over `procs` processes (bench/_floor.py) as the stack's slots are spread over its
    workers; one process's threads share its interpreter lock, and 32 threads in one
    process spent 9 ms of CPU per request against 3.5 ms for 8 (bench/federation.py)."""
    from django.conf import settings

    url = f"{settings.FRLM_SIM_URL}/chat/completions"
    script = str(Path(__file__).resolve().parent / "_floor.py")
    shares = [n // procs + (i < n % procs) for i in range(procs)]
    threads = [slots // procs + (i < slots % procs) for i in range(procs)]
    children = [
        subprocess.Popen(
            [sys.executable, script, url, str(share), str(k), str(latency_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share, k in zip(shares, threads, strict=True)
        if share
    ]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("a harness floor process did not start (bench/_floor.py)")
        started = time.perf_counter()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        said = [child.stdout.readline().strip() for child in children]
        elapsed = time.perf_counter() - started
    finally:
        for child in children:
            child.kill()
            child.wait()
    failed = [line for line in said if line != "done"]
    if failed:
        raise SystemExit(f"the harness floor's requests failed: {failed[0] or 'no answer'}")
    return elapsed


def ceiling(cpu: dict[str, float], n: int, floor: float) -> str:
    """What the machine's cores allow at this CPU per sub-query: the batch cannot go faster
    than the cores can do its work, however little the processes wait on each other; and
    what 0.8 of the floor's throughput (issue 18) would ask of the stack here."""
    cores = len(os.sched_getaffinity(0))
    total_ms = sum(cpu.values()) * 1000 / n
    model_ms = cpu.get("simserver", 0.0) * 1000 / n
    most = cores * 1000 / total_ms
    budget_ms = cores * 1000 / (0.8 * n / floor)
    return (
        f"      CPU ceiling: {total_ms:.2f} ms per sub-query with the simulated model's "
        f"{model_ms:.2f}, on {cores} cores: at most {most:,.0f} sub-queries/s with no waiting "
        f"({most * floor / n:.2f} of the floor); 0.8 of the floor needs at most "
        f"{budget_ms:.2f} ms in all, so {budget_ms - model_ms:.2f} ms of stack"
    )


def ratio(t: float, ideal: float) -> str:
    return f"{t / ideal:5.3f}x ideal" if ideal > 0 else "  (no ideal at 0 ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--slots", type=int, default=32, help="split over two venues")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--quick", action="store_true", help="64 sub-queries, 2 tries")
    parser.add_argument(
        "--bundle-max",
        default="",
        help="comma-separated policy.bundle_max values, e.g. 1,16: each try runs them in turn, "
        "side by side (1 sends each job alone); default: the server's FRLM_BUNDLE_MAX",
    )
    parser.add_argument(
        "--consumer",
        default="",
        help="comma-separated consumers of the venue workers, e.g. celery,frlm or "
        "frlm,frlm-threads: each try runs "
        "on each in turn, side by side; default: FRLM_WORKER_CONSUMER",
    )
    parser.add_argument(
        "--collector",
        default="",
        help="comma-separated collector settings of the stack's processes, frozen and/or "
        "python (FRLM_GC_FREEZE on / off, frlm_web/collector.py): a stack each, in turn, "
        "side by side; default: the product's (frozen)",
    )
    parser.add_argument(
        "--trusted",
        default="local",
        help="comma-separated venues to trust (default: local, the product's default); none",
    )
    args = parser.parse_args()
    stop_on_signals()
    if args.n < 1 or args.slots < 2 or args.repeat < 1 or args.latency_ms < 0:
        parser.error("--n and --repeat must be at least 1, --slots 2, --latency-ms 0 or more")
    if args.quick:
        args.n, args.repeat, args.skip_sequential = 64, 2, True
    trusted = {v for v in args.trusted.split(",") if v and v != "none"}
    try:
        bundles = [int(v) for v in args.bundle_max.split(",") if v] or [None]
    except ValueError:
        parser.error("--bundle-max takes whole numbers separated by commas, e.g. 1,16")
    if any(b is not None and not 0 <= b <= 64 for b in bundles):
        parser.error("--bundle-max values are 0 to 64 (0: the server's FRLM_BUNDLE_MAX)")

    collectors = [c for c in args.collector.split(",") if c] or [""]
    if any(c not in ("", "frozen", "python") for c in collectors):
        parser.error("--collector takes frozen and/or python, e.g. frozen,python")

    consumers = [c for c in args.consumer.split(",") if c] or [""]
    if any(c not in ("", "celery", "frlm", "frlm-threads") for c in consumers):
        parser.error("--consumer takes celery, frlm and/or frlm-threads, e.g. frlm,frlm-threads")

    sim = {"latency_ms": args.latency_ms, "spread": 0}
    half = args.slots // 2
    pairs: dict[str, list[VenueSpec]] = {}
    for consumer in consumers:
        tail = f"-{consumer}" if consumer else ""
        pairs[consumer] = [
            VenueSpec(f"local{tail}", half, sim, f"bench-local{tail}", consumer=consumer),
            VenueSpec(
                f"edge{tail}", args.slots - half, sim, f"bench-edge{tail}", consumer=consumer
            ),
        ]
    venues = [v for pair in pairs.values() for v in pair]
    trusted = {v.name for v in venues if v.name.split("-")[0] in trusted}
    # (collector, consumer, bundle_max) in the order the tries run them, and how the output
    # names them. A collector setting is a stack of its own; the others are runs in one.
    variants = [(g, c, b) for g in collectors for c in consumers for b in bundles]
    labels = {
        (g, c, b): (f"{g} " if g else "")
        + (f"{c} " if c else "")
        + ("" if b is None else f"bundle_max {b:>2} ")
        for g, c, b in variants
    }
    ideal = math.ceil(args.n / args.slots) * args.latency_ms / 1000
    batches = []
    floor = math.inf
    sequential = None
    # Stacks of two collector settings take their tries in blocks, alternated, so a drift of
    # the machine falls on both.
    blocks = max(1, min(args.repeat, 3)) if len(collectors) > 1 else 1
    for block in range(blocks):
        tries = args.repeat // blocks + (block < args.repeat % blocks)
        for collector in collectors:
            env = {"FRLM_GC_FREEZE": "0" if collector == "python" else "1"} if collector else {}
            with private_stack(venues, trusted=trusted, env=env) as stack:
                # As the stack's slots are: over two worker processes.
                harness_floor(args.slots * 2, args.slots, args.latency_ms, procs=2)
                floor = min(
                    floor,
                    *(harness_floor(args.n, args.slots, args.latency_ms, procs=2) for _ in "ab"),
                )
                for pair in pairs.values():  # warm connections and workers
                    measure(args.slots, [v.name for v in pair], sequential=False)
                for _ in range(tries):
                    for variant in [v for v in variants if v[0] == collector]:
                        names = [v.name for v in pairs[variant[1]]]
                        before = stack_cpu_s(stack)
                        t, failed, run_id = measure(
                            args.n, names, sequential=False, bundle_max=variant[2]
                        )
                        cpu = cpu_spent(before, stack_cpu_s(stack))
                        batches.append((t, failed, cpu, split(run_id, args.n), variant))
                if sequential is None and not args.skip_sequential:
                    first = [v.name for v in pairs[consumers[0]]]
                    sequential = measure(args.n, first, sequential=True)

    best = min(t for t, *_ in batches)
    print(
        f"fanout benchmark: {args.n} sub-queries, {args.latency_ms:g} ms simulated latency, "
        f"{args.slots} worker slots over 2 venues"
    )
    from django.conf import settings

    for venue in venues:
        prefetch = settings.FRLM_WORKER_PREFETCH if venue.name in trusted else 1
        consumer = venue.consumer or settings.FRLM_WORKER_CONSUMER
        holds = (
            "takes jobs only for free slots"
            if consumer.startswith("frlm")
            else f"prefetches {prefetch} job(s) per slot"
        )
        print(
            f"  venue {venue.name:<6} {venue.concurrency} slots, "
            f"{'trusted' if venue.name in trusted else 'untrusted'}: its worker ({consumer}) "
            f"{holds}" + ("" if args.trusted == "local" else "   (set-up changed by --trusted)")
        )
    print(f"  ideal ceil(N/W)*L          {ideal:8.3f} s")
    print(
        f"  harness floor (no FRLM)    {floor:8.3f} s   {ratio(floor, ideal)}   "
        f"{args.n / floor:8,.0f} sub-queries/s"
    )
    for i, (t, failed, cpu, shares, variant) in enumerate(batches, 1):
        stack_ms = sum(v for k, v in cpu.items() if k != "simserver") * 1000 / args.n
        print(
            f"  FRLM fanout, try {i:<2} {labels[variant]:<13}{t:8.3f} s   {ratio(t, ideal)}   "
            f"{args.n / t:8,.0f} sub-queries/s ({floor / t:4.2f} of floor)   failed {failed}"
            f"   per worker {'/'.join(str(c) for c, _ in shares)} sub-queries, "
            f"exec p50 {'/'.join(f'{ms:.0f}' for _, ms in shares)} ms"
        )
        print(
            f"      stack CPU {stack_ms:.2f} ms per sub-query without the simulated model: "
            + ", ".join(
                f"{name} {seconds * 1000 / args.n:.2f}"
                for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])
                if seconds > 0
            )
        )
    for variant in variants:
        mine = [b for b in batches if b[4] == variant]
        best = min(t for t, *_ in mine)
        median = statistics.median(t for t, *_ in mine)
        cpu_ms = sorted(
            sum(v for k, v in b[2].items() if k != "simserver") * 1000 / args.n for b in mine
        )
        print(
            f"  FRLM fanout, best {labels[variant]:<13}{best:8.3f} s   {ratio(best, ideal)}   "
            f"{args.n / best:8,.0f} sub-queries/s   {floor / best:5.3f} of the floor's "
            f"throughput   stack CPU {cpu_ms[len(cpu_ms) // 2]:.2f} ms per sub-query (median); "
            f"median of {len(mine)} tries {median:.3f} s ({ratio(median, ideal).strip()})"
        )
        print(ceiling(min(mine, key=lambda b: b[0])[2], args.n, floor))
    best = min(t for t, *_ in batches)
    if sequential is not None:
        t, failed, _ = sequential
        print(
            f"  one at a time (RLM)        {t:8.3f} s   {ratio(t, ideal)}   "
            f"fanout is {t / best:5.1f}x faster   failed {failed}"
        )


if __name__ == "__main__":
    main()
