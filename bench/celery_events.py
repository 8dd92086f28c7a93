"""What Celery task events (FRLM_CELERY_EVENTS=1, for Flower) cost a fanout.

Runs the same batch of sub-queries on two private stacks, one after the other in this
process: events off (the default) and on. Prints, for each, the batch's best wall time,
the stack's CPU per sub-query (conductor, workers, Redis, recorder...) and the Redis
PUBLISH commands per sub-query (task events travel as pub/sub messages), then the ratios.

    .venv/bin/python bench/celery_events.py [--n 256] [--latency-ms 100] [--slots 16]
                                            [--repeat 3] [--quick]

SIGTERM or SIGINT stops it cleanly: the stack's processes go with it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from _stack import cpu_spent, private_stack, stop_on_signals
from fanout import measure, stack_cpu_s

from frlm_web.stack import Stack, VenueSpec


@dataclass
class Figures:
    wall_s: float
    cpu_ms: float  # the stack's CPU per sub-query
    publishes: float  # Redis PUBLISH commands per sub-query
    failed: int


def publishes(stack: Stack) -> int:
    stats = stack.client.info("commandstats")
    return int((stats.get("cmdstat_publish") or {}).get("calls", 0))


def measured(events: bool, venues: list[VenueSpec], n: int, repeat: int) -> Figures:
    """The best of `repeat` batches of n on a fresh stack with events on or off."""
    names = [v.name for v in venues]
    with private_stack(venues, env={"FRLM_CELERY_EVENTS": "1" if events else "0"}) as stack:
        measure(max(4, n // 4), names, sequential=False)  # warm connections and workers
        tries = []
        for _ in range(repeat):
            cpu, sent = stack_cpu_s(stack), publishes(stack)
            wall, failed, _ = measure(n, names, sequential=False)
            tries.append(
                Figures(
                    wall,
                    sum(cpu_spent(cpu, stack_cpu_s(stack)).values()) * 1000 / n,
                    (publishes(stack) - sent) / n,
                    failed,
                )
            )
    best = min(tries, key=lambda f: f.wall_s)
    return Figures(
        best.wall_s,
        min(f.cpu_ms for f in tries),
        min(f.publishes for f in tries),
        sum(f.failed for f in tries),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="sub-queries per batch")
    parser.add_argument("--latency-ms", type=float, default=100)
    parser.add_argument("--slots", type=int, default=16, help="split over two venues")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="n=64, two tries each")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeat = 64, 2
    stop_on_signals()
    sim = {"latency_ms": args.latency_ms, "spread": 0}
    half = args.slots // 2
    venues = [
        VenueSpec("local", half, sim, "bench-local"),
        VenueSpec("edge", args.slots - half, sim, "bench-edge"),
    ]
    off = measured(False, venues, args.n, args.repeat)
    on = measured(True, venues, args.n, args.repeat)
    print(
        f"Celery task events: {args.n} sub-queries of {args.latency_ms:.0f} ms over "
        f"{args.slots} worker slots, best of {args.repeat}"
    )
    for label, f in (("events off (default)", off), ("events on", on)):
        print(
            f"  {label:<22} wall {f.wall_s:7.3f} s   stack CPU {f.cpu_ms:6.1f} ms/sub-query   "
            f"PUBLISH {f.publishes:5.2f}/sub-query   failed {f.failed}"
        )
    print(
        f"  on/off                 wall {on.wall_s / off.wall_s:6.3f}x   "
        f"CPU {on.cpu_ms / off.cpu_ms:6.3f}x   "
        f"PUBLISH +{on.publishes - off.publishes:.2f}/sub-query"
    )


if __name__ == "__main__":
    main()
