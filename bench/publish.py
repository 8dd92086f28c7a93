"""Publish benchmark: CPU to put one sub-query job on a worker's queue, through Celery's own
publish (apply_async through one kombu producer, batched, as the conductor did) and through
workers.wire (the message written in one json.dumps, LPUSH pipelined), side by side in one
run on a private stack's real Redis. Each round publishes N jobs one way then the other,
alternating which goes first; the queue is emptied after each.

    .venv/bin/python bench/publish.py [--n 1000] [--rounds 5] [--quick]

SIGTERM or SIGINT stops it cleanly: its private stack goes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _stack import private_stack, stop_on_signals

from frlm_web.stack import VenueSpec

QUEUE = "venue.bench-publish"
FLUSH = 8  # jobs per pipelined round trip, both ways (runs.engine.fanout.transport)


def jobs(n: int) -> list[dict]:
    prompt = "Read this fragment and answer the question about it. " * 40  # ~2 KB
    return [
        {"run_id": "r-bench", "sq_id": f"sq{i}", "prompt": prompt, "attempt": 1,
         "model": {"kind": "sim", "model": "frlm-sim-worker"}}
        for i in range(n)
    ]  # fmt: skip


def by_celery(batch: list[dict]) -> None:
    from frlm_web.celery import app
    from workers.tasks import subquery_execute

    with app.producer_or_acquire() as producer, producer.batch(max_size=FLUSH):
        for job in batch:
            subquery_execute.apply_async(
                args=[job], queue=QUEUE, expires=60, producer=producer,
                argsrepr=f"[r-bench sub-query {job['sq_id']}]", kwargsrepr="{}", declare=[],
            )  # fmt: skip


def by_wire(batch: list[dict]) -> None:
    from frlm_web.celery import app
    from frlm_web.redis_client import get_redis
    from workers import wire

    wire.push(
        get_redis(),
        [(QUEUE, job, f"[r-bench sub-query {job['sq_id']}]") for job in batch],
        expires_s=60,
        reply_to=app.thread_oid,
        sender=wire.origin(),
        per_trip=FLUSH,
    )


def timed(publish, batch: list[dict]) -> float:
    """CPU seconds of this process to publish the batch (the queue is emptied after)."""
    from frlm_web.redis_client import get_redis

    started = time.process_time()
    publish(batch)
    spent = time.process_time() - started
    assert get_redis().llen(QUEUE) == len(batch)
    get_redis().delete(QUEUE)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="jobs per round and way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 jobs, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = 200, 3
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    stop_on_signals()
    batch = jobs(args.n)
    with private_stack([VenueSpec("local", 1)]):
        ways = {"celery": by_celery, "wire": by_wire}
        for publish in ways.values():  # warm: imports, connections, the producer pool
            timed(publish, batch[:50])
        spent: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(args.rounds):
            order = list(ways) if i % 2 == 0 else list(reversed(ways))
            for name in order:
                spent[name].append(timed(ways[name], batch))
    print(f"publish benchmark: {args.n} jobs of ~2 KB per round, {args.rounds} rounds")
    per = {name: statistics.median(s) * 1000 / args.n for name, s in spent.items()}
    for name, values in spent.items():
        tries = " ".join(f"{v * 1e6 / args.n:.0f}" for v in values)
        print(f"  {name:<7} CPU per job: median {per[name] * 1000:6.0f} us  (rounds: {tries} us)")
    print(f"  wire / celery   {per['wire'] / per['celery']:.2f}x the CPU per job")


if __name__ == "__main__":
    main()
