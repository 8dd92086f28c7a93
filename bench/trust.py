"""Trust benchmark: verification and hedging on real simulated swarms.

Prints, measured in one run on real Redis, Celery workers, the worker runtime and the
simulated model server (each scenario on a fresh private stack or with every reputation
wiped, so reputations start from nothing), on both checking tiers (redundant: the swarm
alone, copies to other workers of it; high trust: the swarm answers, a trusted venue's
validator re-runs a sample and signs what it found):
1. a swarm where 30% of the workers lie, each making up its own wrong answer, then one
   where they collude (all give the same wrong answer to a question): the error rate of
   accepted answers in the first round (cold) and once reputations settle, and the
   verification overhead in extra sub-queries (copies, validators, probes) per primary one
   (targets: first round on the high-trust tier with colluders at most 2% wrong; settled
   at most 1% wrong at at most 25% overhead);
2. a swarm with no liar at all: the overhead (target at most 8%) and each worker's share
   of the sub-queries against its fair share (target: none below half of it). With
   --rounds 16 the settled rounds (9-16) are the steady state: a worker's floor checks
   start at a random phase after its warm-up, so the first rounds after it may see
   fewer or more of them;
3. a turncoat: one worker of 8 starts lying after the swarm's reputations have settled;
   the sub-queries sent from the moment it turns (its first lie) until its share of the
   last 100 falls below 5%, and how many of its lies were accepted (targets: at most 100
   and 5); also counted from the start of the batch it first lied in;
4. a swarm where 5% of the workers are ten times slower: the wall time of its first batch
   (nothing knows yet which workers are slow) with hedging against without, as a ratio of
   the same batch on a swarm with no slow worker (target at most 1.2x with hedging).

Scenarios 1-3 run with each policy.check_cover that --cover names, in turn (default the
product's own, "gate"; `--cover gate,first` compares the gate's answer drawn at random with
the first answer of each batch, side by side), and print the settled batches' wall time.

    .venv/bin/python bench/trust.py [--quick] [--workers 10] [--rounds 8] [--batch 100]
        [--hedge-workers 20] [--repeat 3] [--tier redundant|high_trust] [--cover gate,first]
        [--skip verification|independent|colluding|honest|turncoat|hedging]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections import Counter
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
    return batch_figures(round_, n, venues, policy)[0]


def batch_figures(
    round_: int, n: int, venues: list[str], policy: dict
) -> tuple[dict[str, float], object]:
    """one_batch's figures, and the run."""
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
        **{f"extra:{k}": float(v) for k, v in (figures.get("by_kind") or {}).items()},
    }, run


def totals(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {"accepted", "wrong", "unresolved", "primary", "extra"}
    keys |= {k for r in rows for k in r if k.startswith("extra:")}
    return {k: sum(r.get(k, 0.0) for r in rows) for k in sorted(keys)}


def reset_reputations() -> None:
    """Forget what the fleet learned, so the next tier starts with a cold swarm."""
    client = get_redis()
    for pattern in ("frlm:rep:*", "frlm:worker:*:strikes", "frlm:circuit:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


TIERS = {
    "redundant": {"tier": "redundant"},
    "high_trust": {"tier": "high_trust", "verify_venues": "local"},
}
# The venues each tier's runs name. The swarm alone on the redundant tier: its copies go to
# other workers of the swarm. (With the validators' trusted venue named too, it took about
# two thirds of the answers there, so the swarm's workers, liars and turncoat included, had
# a third of the work and the figures were the trusted venue's as much as the swarm's.) On
# the high-trust tier the validators' venue only checks (verify_venues): the answers are
# the swarm's.
RUN_VENUES = {"redundant": ["edge"], "high_trust": ["edge", "local"]}


def verification(args: argparse.Namespace, directory: Path, kind: str) -> dict:
    """Rounds of batches on a fresh swarm (30% independent or colluding liars, or none);
    figures for the first round (cold) and for the second half (settled), per tier, and
    each worker's share of the settled rounds' sub-queries."""
    from frlm_web.stack import VenueSpec

    faults = {
        "independent": {"lie_share": 0.3},
        "colluding": {"lie_share": 0.3, "collude": 1.0},
        "honest": {},
    }[kind]
    profile = swarm_profile(directory, kind, **faults)
    # The validators: a trusted venue of the operator's own, which answers nothing else.
    venues = [VenueSpec("edge", swarm=str(profile), workers=args.workers)]
    venues.append(VenueSpec("local", concurrency=8))
    out: dict[str, dict] = {}
    with private_stack(venues):
        wait_for_workers("edge", args.workers)
        time.sleep(SETTLE_S)  # the processes finish starting up before the first batch
        # One unjudged batch gets every process going (a worker still warming up would
        # time out and trip its breaker); then everything learned is forgotten, so the
        # tier's first round is still a cold swarm's.
        one_batch(-1, args.batch, ["edge"], {"tier": "best_effort"})
        for (tier, policy), cover in itertools.product(TIERS.items(), args.covers):
            if tier not in args.tiers:
                continue
            reset_reputations()
            rounds, shares = [], Counter()
            for r in range(args.rounds):
                row, run = batch_figures(
                    r, args.batch, RUN_VENUES[tier], {**policy, "check_cover": cover}
                )
                rounds.append(row)
                if r >= args.rounds // 2:
                    shares.update(edge_senders(run.id))
            out[covered(tier, cover, args.covers)] = {
                "cold": totals(rounds[:1]),
                "settled": totals(rounds[args.rounds // 2 :]),
                "rounds": rounds,
                "shares": shares,
                "records": records(list(shares)),
            }
    return out


def covered(tier: str, cover: str, covers: list[str]) -> str:
    """The tier's name in the report, with its check_cover when several are compared."""
    return tier if len(covers) == 1 else f"{tier} (check_cover={cover})"


def records(worker_ids: list[str]) -> dict[str, dict]:
    """Each worker's reputation as the scheduler last read it, to tell why a share is low."""
    from workers.reputation import load

    return {wid: rep.as_dict() for wid, rep in load(get_redis(), worker_ids).items()}


def run_events(run_id: str) -> list[dict]:
    """The run's events once the recorder has stored its end."""
    from traces import store

    deadline = time.monotonic() + 30
    while True:
        events = store.read_events(run_id)
        if any(e["name"] == "Run.Done" for e in events) or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def edge_senders(run_id: str, since_ns: float = 0) -> Counter:
    return Counter(
        e["worker_id"]
        for e in run_events(run_id)
        if e["name"] == "SubQuery.Submit"
        and e["phase"] == "start"
        and e["venue"] == "edge"
        and e["ts"] >= since_ns
    )


WINDOW = 100


def turncoat(args: argparse.Namespace, directory: Path, tier: str, cover: str) -> dict:
    """One worker of 8 turns liar once reputations have settled under the tier. Counts the
    sub-queries (probes left out) sent to the swarm from the first batch it lies in until
    its share of the last WINDOW falls below 5%, and the wrong answers accepted meanwhile
    (every one is its lie: the others are honest)."""
    from routing import process_started

    from frlm_web.stack import VenueSpec
    from workers.swarm import devices, profile_load
    from workers.venues import live_workers

    workers = 8
    path = directory / f"turncoat-{tier}.toml"
    path.write_text(
        f"""description = "trust benchmark: one device starts lying after {args.warm_s:g} s"
concurrency = 4
[latency]
median_ms = 30
spread = 0.0
[faults]
lie_share = {1 / workers}
lie_rate = 1.0
lie_after_s = {args.warm_s}
"""
    )
    (liar_name,) = [d.name for d in devices(profile_load(str(path)), "edge", workers, 0) if d.liar]
    policy = {**TIERS[tier], "check_cover": cover}
    n = 64
    venues = [VenueSpec("edge", swarm=str(path), workers=workers)]
    venues.append(VenueSpec("local", concurrency=8))
    with private_stack(venues):
        wait_for_workers("edge", workers)
        (entry,) = [w for w in live_workers(get_redis(), "edge") if w["label"] == liar_name]
        liar = entry["worker_id"]
        turns_at = process_started(int(entry["pid"])) + args.warm_s
        round_ = warm_rounds = 0
        sent: list[str] = []
        why: Counter = Counter()  # the liar's sub-queries by kind and route, for the record
        by_round: list[int] = []  # the liar's sub-queries in each round from the lying one
        lies = 0
        passed = None
        turned = False
        first_lie: int | None = None  # its first lying sub-query's place in `sent`
        while passed is None and len(sent) < 5000:
            row, run = batch_figures(round_, n, RUN_VENUES[tier], policy)
            round_ += 1
            events = sorted(run_events(run.id), key=lambda e: e["seq"])
            if not turned:
                # The count starts with the first batch it lies in: the device's clock starts
                # when its process has imported everything, which on a loaded machine is
                # long after the process started, so the planned moment is only a lower bound.
                turned = time.time() >= turns_at and lied(row, events, liar)
                if not turned:
                    warm_rounds += 1
                    # Rounds of the gated tiers take half a second: a count of them ran
                    # out before the turn (400 rounds, 240 s warm-up); the clock does not.
                    if time.time() > turns_at + 180:
                        raise SystemExit(
                            f"the turncoat {liar} never lied in {round_} rounds, 180 s past "
                            "its turn"
                        )
                    continue
            lies += int(row["wrong"])
            by_round.append(0)
            ends = {
                e["span_id"]: e
                for e in events
                if e["name"] == "SubQuery.Submit" and e["phase"] == "end"
            }
            for e in events:
                # Probes are not work: a probe sent to the liar is how it is caught, not
                # a share of the run's traffic (bench/routing.py counts the same way).
                if (
                    e["name"] == "SubQuery.Submit"
                    and e["phase"] == "start"
                    and e["venue"] == "edge"
                    and e["attrs"].get("copy") != "probe"
                ):
                    sent.append(e["worker_id"])
                    if first_lie is None and e["worker_id"] == liar:
                        if is_lie(ends.get(e["span_id"]), round_ - 1, n):
                            first_lie = len(sent) - 1
                    if e["worker_id"] == liar:
                        why[f"{e['attrs'].get('copy') or 'answer'}/{e['attrs'].get('route')}"] += 1
                        by_round[-1] += 1
                    window = sent[-WINDOW:]
                    if len(window) == WINDOW and window.count(liar) / WINDOW < 0.05:
                        passed = len(sent)
                        break
        record = records([liar])[liar]
    since = first_lie or 0
    return {
        "passed": float(passed if passed is not None else -1),
        "passed_from_lie": float(passed - since if passed is not None else -1),
        "liar_sent": float(sent[: passed or len(sent)].count(liar)),
        "liar_sent_from_lie": float(sent[since : passed or len(sent)].count(liar)),
        "accepted_lies": float(lies),
        "warm_rounds": float(warm_rounds),
        "why": dict(why),
        "by_round": by_round,
        "record": record,
    }


def is_lie(end: dict | None, round_: int, n: int) -> bool:
    """Whether a sub-query's reply (its Submit span's end payload) is none of the batch's
    true answers: the turncoat's lie."""
    from traces.blobs import blob_get

    if end is None or not end.get("payload_ref"):
        return False
    text = blob_get(end["payload_ref"])
    return text is not None and text not in {truth(round_, i) for i in range(n)}


def lied(row: dict[str, float], events: list[dict], liar: str) -> bool:
    """Whether the turncoat lied in this batch: a wrong answer was accepted (every worker
    but it is honest), or it was outvoted, diverged from a validator or failed a probe."""
    if row["wrong"]:
        return True
    for e in events:
        if e["name"] == "Verify.Redundant" and liar in (e["attrs"].get("disagreed") or []):
            return True
        if e["name"] == "Verify.Gate" and liar in (e["attrs"].get("caught") or []):
            return True
        if e["name"] in ("Verify.Attest", "Verify.Probe") and e["worker_id"] == liar:
            if e["status"] == "rejected":
                return True
    return False


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
    kinds = ", ".join(f"{k[6:]} {v:.0f}" for k, v in t.items() if k.startswith("extra:") and v)
    return (
        f"error {100 * error:6.2f}% ({t['wrong']:.0f} of {t['accepted']:.0f} accepted)  "
        f"overhead {100 * overhead:6.1f}% ({t['extra']:.0f} extra / {t['primary']:.0f}"
        + (f": {kinds}" if kinds else "")
        + f")  unresolved {t['unresolved']:.0f}"
    )


def shares_line(shares: Counter, workers: int) -> str:
    total = sum(shares.values())
    if not total:
        return "no sub-queries"
    fair = 1 / workers
    each = sorted(shares.get(w, 0) / total for w in shares)
    each += [0.0] * (workers - len(each))
    lowest = min(each)
    return (
        f"lowest share {100 * lowest:.1f}% = {lowest / fair:.2f}x its fair {100 * fair:.1f}% "
        f"(target >= 0.50x); shares {' '.join(f'{100 * x:.0f}' for x in sorted(each))}"
    )


def report_kind(kind: str, tiers: dict, workers: int) -> None:
    for tier, figures in tiers.items():
        print(f"  {kind} {'workers' if kind == 'honest' else 'liars'}, {tier} tier")
        print(f"    cold    {rates(figures['cold'])}")
        print(f"    settled {rates(figures['settled'])}")
        print(f"    all     {rates(totals(figures['rounds']))}")
        trail = "  ".join(
            f"{100 * r['wrong'] / max(1, r['accepted']):.0f}/{100 * r['extra'] / r['primary']:.0f}"
            for r in figures["rounds"]
        )
        print(f"    by round, error%/overhead%: {trail}")
        settled = [r["wall"] for r in figures["rounds"][len(figures["rounds"]) // 2 :]]
        print(f"    settled batch wall, median {1000 * statistics.median(settled):.0f} ms")
        if kind == "honest":
            print(f"    settled {shares_line(figures['shares'], workers)}")
            total = sum(figures["shares"].values()) or 1
            for wid, rec in sorted(figures["records"].items()):
                share = figures["shares"][wid] / total * workers
                print(
                    f"      {wid[:12]} {share:4.2f}x  score {rec['score']}  completion "
                    f"{rec['completion']}  agreement {rec['agreement']}  validation "
                    f"{rec['validation']}  latency {rec['latency_ms']} ms"
                )
    print(end="", flush=True)


def report_turncoat(tier: str, t: dict, warm_s: float) -> None:
    print(
        f"turncoat, {tier} tier: one worker of 8 turns liar after {warm_s:g} s: "
        f"{t['passed_from_lie']:.0f} sub-queries sent from its first lie until its share of "
        f"the last {WINDOW} fell below 5% ({t['liar_sent_from_lie']:.0f} of them to it); "
        f"its lies accepted: {t['accepted_lies']:.0f} (targets: <= 100 sub-queries, <= 5 "
        f"lies); {t['warm_rounds']:.0f} honest rounds of 64 before it turned"
        + ("" if t["warm_rounds"] else " (it lied from the start: raise --warm-s)"),
        flush=True,
    )
    print(
        f"  counted from the start of the batch it first lied in: {t['passed']:.0f} "
        f"sub-queries ({t['liar_sent']:.0f} of them to it)",
        flush=True,
    )
    kinds = "  ".join(f"{k} {v}" for k, v in sorted(t["why"].items()))
    print(f"  its sub-queries by kind/route: {kinds}; its record at the end: {t['record']}")
    print(
        "  its sub-queries in each round of 64, from the one it first lied in: "
        + " ".join(str(n) for n in t["by_round"])
    )


def report_hedging(walls: dict[str, list[float]], hedge_workers: int) -> None:
    medians = {k: statistics.median(v) for k, v in walls.items()}
    base = medians["even"]
    print(
        f"hedging: {8 * hedge_workers} sub-queries on {hedge_workers} workers x 2 "
        "slots (100 ms), a fresh swarm's first batch each time; 5% of workers 10x slower"
    )
    for label, values in walls.items():
        tries = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"  {label:<18} median {medians[label]:6.3f} s  ({medians[label] / base:4.2f}x "
            f"the no-straggler time)  tries {tries}"
        )
    print("  target: with hedging at most 1.20x the no-straggler time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no hedging")
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--warm-s", type=float, default=150.0)
    parser.add_argument("--hedge-workers", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--skip",
        choices=["verification", "independent", "colluding", "honest", "turncoat", "hedging"],
        action="append",
        default=[],
    )
    parser.add_argument(
        "--tier", dest="tiers", choices=list(TIERS), action="append", help="only this tier"
    )
    parser.add_argument(
        "--cover",
        default="gate",
        help="policy.check_cover values to measure side by side, comma-separated (e.g. gate,first)",
    )
    args = parser.parse_args()
    args.tiers = args.tiers or list(TIERS)
    args.covers = [c.strip() for c in args.cover.split(",") if c.strip()]
    stop_on_signals()
    if args.quick:
        # The turncoat turns 240 s after its process started: on a loaded machine the
        # swarm took up to 200 s to start, and it must earn its record honestly first.
        args.rounds, args.warm_s = 6, 240.0
        args.skip.append("hedging")
    started = time.monotonic()
    print(
        f"trust benchmark: {args.workers} workers, 30% of them liars (none in 'honest'), "
        f"{args.rounds} rounds of {args.batch} questions; settled = rounds "
        f"{args.rounds // 2 + 1}-{args.rounds}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        kinds = [] if "verification" in args.skip else ["independent", "colluding"]
        kinds += ["honest"]
        kinds = [k for k in kinds if k not in args.skip]
        for kind in kinds:
            report_kind(kind, verification(args, Path(tmp), kind), args.workers)
        if kinds:
            print(
                "  targets: colluders on the high-trust tier: cold error <= 2%; settled error "
                "<= 1% at overhead <= 25%; honest only: overhead <= 8%\n"
                "  plain two-fold replication: overhead 100% by construction",
                flush=True,
            )
        if "turncoat" not in args.skip:
            for tier, cover in itertools.product(args.tiers, args.covers):
                report_turncoat(
                    covered(tier, cover, args.covers),
                    turncoat(args, Path(tmp), tier, cover),
                    args.warm_s,
                )
        walls = hedging(args, Path(tmp)) if "hedging" not in args.skip else None
    if walls is not None:
        report_hedging(walls, args.hedge_workers)
    print(f"(bench wall time {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
