"""Trust benchmark: verification and hedging on real simulated swarms.

Prints, measured in one run on real Redis, Celery workers, the worker runtime and the
simulated model server (each scenario on a fresh private stack, so reputations start
from nothing):
1. a swarm where 30% of the workers lie, each making up its own wrong answer: under the
   redundant tier, the error rate of accepted answers (target at most 1%) and the
   verification overhead in extra sub-queries per primary one (target at most 25% once
   reputations settle; plain two-fold replication costs 100% by construction);
2. the same swarm with colluding liars (all give the same wrong answer to a question):
   under the redundant tier alone (agreement cannot catch them), then under the high-trust
   tier, where a trusted validator re-runs a sample chosen by who vouches for the answer;
3. a swarm where 5% of the workers are ten times slower: the wall time of its first batch
   (nothing knows yet which workers are slow) with hedging against without, as a ratio of
   the same batch on a swarm with no slow worker (target at most 1.2x with hedging).

    .venv/bin/python bench/trust.py [--workers 10] [--rounds 8] [--batch 100]
        [--hedge-workers 20] [--repeat 3] [--skip verification|hedging]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _stack import private_stack, run_to_end, stop_on_signals

from frlm_web import presence
from frlm_web.redis_client import get_redis

# A fresh swarm's processes still start up for a few seconds after they register.
SETTLE_S = 5.0
PROMPT = "Where is station {r}-{i}?\nStation {r}-{i} is north of the river."


def truth(r: int, i: int) -> str:
    return f"Station {r}-{i} is north of the river."


def swarm_profile(directory: Path, name: str, **faults: float) -> Path:
    f = {"lie_share": 0.0, "lie_rate": 1.0, "collude": 0.0, "slow_share": 0.0, **faults}
    path = directory / f"{name}.toml"
    path.write_text(
        f"""description = "trust benchmark: {name}"
concurrency = {int(f.get("concurrency", 4))}
[latency]
median_ms = {f.get("median_ms", 30)}
spread = 0.0
slow_share = {f["slow_share"]}
slow_factor = {f.get("slow_factor", 1.0)}
[faults]
lie_share = {f["lie_share"]}
lie_rate = {f["lie_rate"]}
collude = {f["collude"]}
"""
    )
    return path


def wait_for_workers(venue: str, count: int, timeout: float = 180.0) -> None:
    client = get_redis()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(presence.alive(client, f"venue:{venue}")) >= count:
            return
        time.sleep(0.2)
    raise SystemExit(f"venue {venue} did not bring {count} workers up in {timeout:.0f} s")


def batch_program(round_: int, n: int) -> str:
    prompts = [PROMPT.format(r=round_, i=i) for i in range(n)]
    return (
        "Run this program.\n```repl\nimport time\n"
        f"prompts = {prompts!r}\n"
        "t = time.perf_counter()\nrs = llm_query_batched(prompts)\n"
        "FINAL(repr([time.perf_counter() - t, rs]))\n```"
    )


def one_batch(round_: int, n: int, venues: list[str], policy: dict) -> dict[str, float]:
    """One batch of n questions with known answers: wall time of the batch, accepted
    answers and how many of them were wrong, unresolved ones, primary and extra sub-queries."""
    run = run_to_end(
        batch_program(round_, n),
        venues=venues,
        policy={"max_batch": n, "max_subqueries": 100 * n, "cell_timeout_s": 3600, **policy},
    )
    if run.status != "succeeded":
        raise SystemExit(f"benchmark run failed: {run.error}")
    elapsed, replies = eval(run.answer)  # noqa: S307 (our own repr)
    accepted = [(i, r) for i, r in enumerate(replies) if not r.startswith("[frlm:")]
    wrong = sum(r != truth(round_, i) for i, r in accepted)
    figures = run.accounts["verification"]
    return {
        "wall": float(elapsed),
        "accepted": float(len(accepted)),
        "wrong": float(wrong),
        "unresolved": float(sum(r.startswith("[frlm:unresolved]") for r in replies)),
        "primary": float(figures["primary"]),
        "extra": float(figures["extra"]),
    }


def totals(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = ("accepted", "wrong", "unresolved", "primary", "extra")
    return {k: sum(r[k] for r in rows) for k in keys}


def verification(args: argparse.Namespace, directory: Path, collude: bool) -> dict:
    """Rounds of batches on a fresh swarm with 30% liars; figures for the first round
    (cold) and for the second half (settled), per tier."""
    from frlm_web.stack import VenueSpec

    name = "colluders" if collude else "liars"
    profile = swarm_profile(directory, name, lie_share=0.3, collude=1.0 if collude else 0.0)
    venues = [VenueSpec("edge", swarm=str(profile), workers=args.workers)]
    tiers = {"redundant": {"tier": "redundant"}}
    if collude:
        # The validators: a trusted venue of the operator's own, which answers nothing else.
        venues.append(VenueSpec("local", concurrency=8))
        tiers = {
            "redundant": {"tier": "redundant"},
            "high_trust": {"tier": "high_trust", "verify_venues": "local"},
        }
    out: dict[str, dict] = {}
    for tier, policy in tiers.items():
        with private_stack(venues):
            wait_for_workers("edge", args.workers)
            rounds = [
                one_batch(r, args.batch, ["edge", "local"] if collude else ["edge"], policy)
                for r in range(args.rounds)
            ]
        out[tier] = {
            "cold": totals(rounds[:1]),
            "settled": totals(rounds[args.rounds // 2 :]),
            "rounds": rounds,
        }
    return out


def hedging(args: argparse.Namespace, directory: Path) -> dict[str, list[float]]:
    """The first batch of a freshly started swarm, when nothing knows yet which workers
    are slow (afterwards they report their own latency and the scheduler routes around
    them): on a swarm with no slow worker, then on one where 5% are ten times slower, with
    and without hedging. Each try starts its own stack."""
    from frlm_web.stack import VenueSpec

    n = args.hedge_workers
    even = swarm_profile(directory, "even", median_ms=100, concurrency=2)
    slow = swarm_profile(
        directory, "slow", median_ms=100, concurrency=2, slow_share=0.05, slow_factor=10
    )
    batch = 8 * n  # four waves over the swarm's slots
    walls: dict[str, list[float]] = {"even": [], "slow, hedging off": [], "slow, hedging p95": []}
    cases = [("even", even, "off"), ("slow, hedging off", slow, "off")]
    cases.append(("slow, hedging p95", slow, "p95"))
    for r in range(args.repeat):
        for label, profile, hedge in cases:
            with private_stack([VenueSpec("edge", swarm=str(profile), workers=n)]):
                wait_for_workers("edge", n)
                time.sleep(SETTLE_S)  # the processes finish starting up before the batch
                row = one_batch(r, batch, ["edge"], {"hedge": hedge, "explore": 0.0})
                walls[label].append(row["wall"])
    return walls


def rates(t: dict[str, float]) -> str:
    error = t["wrong"] / t["accepted"] if t["accepted"] else 0.0
    overhead = t["extra"] / t["primary"] if t["primary"] else 0.0
    return (
        f"error {100 * error:6.2f}% ({t['wrong']:.0f} of {t['accepted']:.0f} accepted)  "
        f"overhead {100 * overhead:6.1f}% ({t['extra']:.0f} extra / {t['primary']:.0f})  "
        f"unresolved {t['unresolved']:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--hedge-workers", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", choices=["verification", "hedging"], action="append", default=[])
    args = parser.parse_args()
    stop_on_signals()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        found = {}
        if "verification" not in args.skip:
            found["independent"] = verification(args, Path(tmp), collude=False)
            found["colluding"] = verification(args, Path(tmp), collude=True)
        walls = hedging(args, Path(tmp)) if "hedging" not in args.skip else None

    print(
        f"trust benchmark: {args.workers} workers, 30% of them liars, {args.rounds} rounds "
        f"of {args.batch} questions; settled = rounds {args.rounds // 2 + 1}-{args.rounds}"
    )
    for kind, tiers in found.items():
        for tier, figures in tiers.items():
            print(f"  {kind} liars, {tier} tier")
            print(f"    cold    {rates(figures['cold'])}")
            print(f"    settled {rates(figures['settled'])}")
            trail = "  ".join(
                f"{100 * r['wrong'] / max(1, r['accepted']):.0f}/"
                f"{100 * r['extra'] / r['primary']:.0f}"
                for r in figures["rounds"]
            )
            print(f"    by round, error%/overhead%: {trail}")
    if found:
        print("  targets: error <= 1% of accepted answers; overhead <= 25% once settled")
        print("  plain two-fold replication: overhead 100% by construction")
    if walls is not None:
        medians = {k: statistics.median(v) for k, v in walls.items()}
        base = medians["even"]
        print(
            f"hedging: {8 * args.hedge_workers} sub-queries on {args.hedge_workers} workers x 2 "
            "slots (100 ms), a fresh swarm's first batch each time; 5% of workers 10x slower"
        )
        for label, values in walls.items():
            tries = ", ".join(f"{v:.3f}" for v in values)
            print(
                f"  {label:<18} median {medians[label]:6.3f} s  ({medians[label] / base:4.2f}x "
                f"the no-straggler time)  tries {tries}"
            )
        print("  target: with hedging at most 1.20x the no-straggler time")
    print(f"(bench wall time {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
