"""Peer benchmark: the same batch through the official RLM library (`rlms` from PyPI) and
through FRLM, against one OpenAI-compatible server (FRLM's simulated model, whose scripted
root sends back the question's program), measured side by side in one run.

Both run the same program in their REPL: N prompts through `llm_query_batched`, timed
around that call alone, so the root model's turns and each system's start-up are left
out. The library runs in a virtual environment of its own, made by this bench (cached
under ~/.cache/frlm-bench, or $FRLM_BENCH_CACHE); it fans a batch out over asyncio with
16 calls at once by default (its LMHandler's batch_max_concurrent, which RLM does not
pass through: the driver, bench/_rlms_driver.py, sets it), so it is measured at its
default and at FRLM's slot count. FRLM runs the batch over its workers: `--slots` split
over a trusted `local` and an untrusted `edge` venue, as bench/fanout.py does. Also
printed: the ideal ceil(N/W)*L and the harness floor (the same requests from W threads,
no framework at all).

    .venv/bin/python bench/peer.py [--n 256] [--latency-ms 200] [--slots 32] [--repeat 3]
                                   [--quick] [--rlms rlms==0.1.3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _stack import private_stack, stop_on_signals, stop_requested
from fanout import harness_floor, measure, ratio

from frlm_web.stack import VenueSpec

HERE = Path(__file__).resolve().parent
# The release measured; --rlms takes another requirement (a newer release, a path).
RLMS = "rlms==0.1.3"


def rlms_python(requirement: str) -> Path:
    """The interpreter of a virtual environment holding `requirement`, made on first use."""
    cache = Path(os.environ.get("FRLM_BENCH_CACHE") or Path.home() / ".cache" / "frlm-bench")
    venv = cache / ("rlms-venv-" + "".join(c if c.isalnum() else "-" for c in requirement))
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / ".installed").exists():
        print(f"  making the peer's virtual environment {venv} ({requirement}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, requirement], check=True)
        (venv / ".installed").write_text(requirement + "\n")
    return python


def rlms_batch(python: Path, n: int, latency_ms: float, concurrency: int) -> tuple[float, int]:
    """The library's batch time and its failed sub-calls (bench/_rlms_driver.py)."""
    from django.conf import settings

    child = subprocess.Popen(
        [
            str(python),
            str(HERE / "_rlms_driver.py"),
            settings.FRLM_SIM_URL,
            str(n),
            f"{latency_ms:g}",
            str(concurrency),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:  # a signal or the timeout: it does not outlive the bench
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise SystemExit(f"the rlms batch failed:\n{err[-2000:]}")
    said = json.loads(out.strip().splitlines()[-1])
    return float(said["elapsed"]), int(said["failed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--slots", type=int, default=32, help="FRLM's, over two venues")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 sub-queries, 2 tries")
    parser.add_argument("--rlms", default=RLMS, help=f"the library to install (default {RLMS})")
    args = parser.parse_args()
    stop_on_signals()
    if args.n < 1 or args.slots < 2 or args.repeat < 1 or args.latency_ms < 0:
        parser.error("--n and --repeat must be at least 1, --slots 2, --latency-ms 0 or more")
    if args.quick:
        args.n, args.repeat = 64, 2
    python = rlms_python(args.rlms)
    sim = {"latency_ms": args.latency_ms, "spread": 0}
    half = args.slots // 2
    venues = [
        VenueSpec("local", half, sim, "bench-local"),
        VenueSpec("edge", args.slots - half, sim, "bench-edge"),
    ]
    names = [v.name for v in venues]
    # (label, how to run one try)
    systems = [
        ("rlms, 16 at once (its default)", lambda: rlms_batch(python, args.n, args.latency_ms, 16)),
        (
            f"rlms, {args.slots} at once",
            lambda: rlms_batch(python, args.n, args.latency_ms, args.slots),
        ),
        (
            f"FRLM, {args.slots} slots",
            lambda: measure(args.n, names, sequential=False)[:2],
        ),
    ]
    times: dict[str, list[float]] = {label: [] for label, _ in systems}
    failed: dict[str, int] = dict.fromkeys(times, 0)
    ideal = math.ceil(args.n / args.slots) * args.latency_ms / 1000
    with private_stack(venues, trusted={"local"}):
        harness_floor(args.slots * 2, args.slots, args.latency_ms, procs=2)  # warm
        floor = min(harness_floor(args.n, args.slots, args.latency_ms, procs=2) for _ in "ab")
        measure(args.slots, names, sequential=False)  # warm connections and workers
        rlms_batch(python, args.slots, args.latency_ms, args.slots)  # warm the library's imports
        for _ in range(args.repeat):
            for label, run in systems:  # in turn, so a drift of the machine falls on all
                stop_requested()
                t, bad = run()
                times[label].append(t)
                failed[label] += bad
    print(
        f"peer benchmark: {args.n} sub-queries of {args.latency_ms:g} ms (simulated model, "
        f"no spread), {args.repeat} tries each, in turn; time around llm_query_batched"
    )
    print(f"  ideal ceil(N/{args.slots})*L            {ideal:8.3f} s")
    print(f"  harness floor ({args.slots} threads)      {floor:8.3f} s   {ratio(floor, ideal)}")
    frlm = min(times[systems[-1][0]])
    for label, _ in systems:
        best, median = min(times[label]), statistics.median(times[label])
        print(
            f"  {label:<32} best {best:7.3f} s  median {median:7.3f} s   {ratio(best, ideal)}   "
            f"{args.n / best:7,.0f} sub-queries/s   failed {failed[label]}"
            + ("" if label == systems[-1][0] else f"   takes {best / frlm:4.2f}x FRLM's time")
        )
    print(
        "  (rlms "
        + args.rlms.split("==")[-1]
        + " runs its sub-calls in its own process over asyncio, with no workers, tracing, "
        "checks or receipts; FRLM's batch goes through Redis to worker processes, traced)"
    )
    print(f"(bench wall time {time.monotonic() - STARTED:.0f} s)")


STARTED = time.monotonic()

if __name__ == "__main__":
    main()
