"""Verification policy, simulated: runs.trust.verify's redundant tier, adaptive replication gate
and validator sampling over a simulated swarm where a share of the workers lie, with no
processes, queues or models (the real swarm's bench, bench/trust.py of issue 6, needs the
fanout wired to these modules). Then the cost of each trust operation a fanout will call
per sub-query: budget reserve+settle, a redundant decision, issuing a receipt, checking one.

Prints, per scenario, over the second half of the questions (once reputations settle):
the error rate of accepted answers, the verification overhead in extra sub-queries per
primary one, and the share left unresolved. Plain two-fold replication is the reference.

    .venv/bin/python bench/verify_policy.py [--questions 20000] [--workers 50]
        [--liars 0.3] [--lie-rate 0.5] [--validate 0.05] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import django

# The project's packages before this folder's modules: bench/traces.py is not the app
# `traces` (run as a script, this folder comes first on the path, and Django's setup took
# the bench for the app and failed).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "frlm_web.settings_isolated")
django.setup()

from runs.trust.budget import Budget, Caps, Price  # noqa: E402
from runs.trust.receipts import ReceiptChain, chain_verify, receipt_worker_sign  # noqa: E402
from runs.trust.verify import (  # noqa: E402
    RedundancyPolicy,
    Reply,
    VerificationTally,
    consecutive_valid_after,
    judgements,
    redundant_decide,
    should_replicate,
    should_validate,
)
from workers import keys  # noqa: E402


@dataclass
class Scenario:
    name: str
    adaptive: bool  # False: every sub-query replicated (plain replication)
    collude: bool  # liars give the same wrong answer
    routing: str  # "uniform" or "reputation"
    # Validator sampling: "" none, "all" a fixed share of accepted answers (--validate),
    # "gate" runs.trust.verify.should_validate (often when only untrusted workers vouch).
    sampling: str = ""


@dataclass
class Figures:
    error_rate: float
    overhead: float
    unresolved: float
    liar_share: float  # primary sub-queries routed to liars


class Swarm:
    def __init__(self, n: int, liars: float, lie_rate: float, rng: random.Random) -> None:
        self.ids = [f"w{i}" for i in range(n)]
        self.liars = set(rng.sample(self.ids, round(n * liars)))
        self.lie_rate = lie_rate
        self.rng = rng
        self.count = dict.fromkeys(self.ids, 0)  # consecutive valid
        self.valid = dict.fromkeys(self.ids, 0.0)
        self.invalid = dict.fromkeys(self.ids, 0.0)

    def answer(self, worker: str, question: int, collude: bool) -> str:
        if worker in self.liars and self.rng.random() < self.lie_rate:
            return f"wrong {question}" if collude else f"wrong {self.rng.randrange(10**9)}"
        return f"right {question}"

    def route(self, avoid: frozenset[str], routing: str) -> str:
        pool = [w for w in self.ids if w not in avoid]
        if routing == "uniform":
            return self.rng.choice(pool)
        # A stand-in for issue 5's scheduler: the better Beta score of two random picks.
        a, b = self.rng.sample(pool, 2)
        return max((a, b), key=self.score)

    def score(self, worker: str) -> float:
        return (self.valid[worker] + 1) / (self.valid[worker] + self.invalid[worker] + 2)

    def judge(self, worker: str, ok: bool) -> None:
        self.count[worker] = consecutive_valid_after(self.count[worker], ok)
        # Forgetting: recent behaviour weighs most.
        self.valid[worker] = 0.98 * self.valid[worker] + ok
        self.invalid[worker] = 0.98 * self.invalid[worker] + (not ok)


def simulate(scenario: Scenario, args: argparse.Namespace) -> Figures:
    rng = random.Random(args.seed)
    swarm = Swarm(args.workers, args.liars, args.lie_rate, rng)
    policy = RedundancyPolicy(replicas=2, agree=2, max_replicas=5)
    tally = VerificationTally()
    accepted = wrong = unresolved = to_liars = 0
    settle_at = args.questions // 2
    for q in range(args.questions):
        if q == settle_at:
            tally = VerificationTally()
            accepted = wrong = unresolved = to_liars = 0
        tally.add_primary()
        first = swarm.route(frozenset(), scenario.routing)
        to_liars += first in swarm.liars
        replies = [Reply(first, "edge", swarm.answer(first, q, scenario.collude))]
        if scenario.adaptive and not should_replicate(swarm.count[first], rng):
            answer: str | None = replies[0].text
            agreed: tuple[str, ...] = (first,)
        else:
            while True:
                decision = redundant_decide(replies, policy)
                if decision.outcome != "more":
                    break
                for _ in range(decision.dispatch):
                    avoid = decision.avoid_workers | {r.worker_id for r in replies}
                    worker = swarm.route(avoid, scenario.routing)
                    tally.add_extra("replica")
                    replies.append(Reply(worker, "edge", swarm.answer(worker, q, scenario.collude)))
            for worker, ok in judgements(decision).items():
                swarm.judge(worker, ok)
            answer, agreed = decision.text, decision.agreed
        if answer is None:
            unresolved += 1
            continue
        if scenario.sampling == "all":
            sample = rng.random() < args.validate
        elif scenario.sampling == "gate":
            sample = should_validate([swarm.count[w] for w in agreed], rng)
        else:
            sample = False
        if sample:
            tally.add_extra("validator")
            if answer != f"right {q}":  # the trusted validator's re-run diverges
                for worker in agreed:
                    swarm.judge(worker, False)
                answer = f"right {q}"
        accepted += 1
        wrong += answer != f"right {q}"
    figures = tally.figures()
    return Figures(
        error_rate=wrong / max(accepted, 1),
        overhead=figures["overhead"],
        unresolved=unresolved / (args.questions - settle_at),
        liar_share=to_liars / (args.questions - settle_at),
    )


def per_op_us(fn, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - started) / n * 1e6


def costs() -> None:
    budget = Budget("bench", Caps(run=1e9, subquery=1.0, providers={"sim": 1e9}))
    price = Price(0.00015, 0.0006)

    def reserve_settle(i: int) -> None:
        held = budget.reserve(
            subquery=f"sq{i}",
            provider="sim",
            worker_id="w1",
            tokens_in=800,
            tokens_out=80,
            price=price,
        )
        budget.settle(held.id, tokens_in=790, tokens_out=75)

    policy = RedundancyPolicy(replicas=3, agree=2, max_replicas=5)
    three = [Reply(f"w{k}", "edge", t) for k, t in enumerate(["42", "41", " 42"])]
    worker, conductor = keys.generate(), keys.generate()
    worker_pub = keys.public_b64(worker)
    chain = ReceiptChain("bench")
    issued = []

    def issue(i: int) -> None:
        issued.append(
            chain.issue(
                span=f"sq{i}",
                attempt=f"{i}.1",
                worker="w1",
                input_sha256="a" * 64,
                output_sha256="b" * 64,
                tokens_in=800,
                tokens_out=80,
                price_in=0.00015,
                price_out=0.0006,
                cost=0.00017,
                verdict="accepted",
                worker_sign=lambda r: receipt_worker_sign(r, worker),
                worker_key=worker_pub,
                conductor_key=conductor,
            )
        )

    n = 2000
    rows = [
        ("budget reserve + settle", per_op_us(reserve_settle, n * 5)),
        ("redundant decision (3 replies)", per_op_us(lambda i: redundant_decide(three, policy), n)),
        ("receipt issue (sign, check, countersign)", per_op_us(issue, n)),
    ]
    started = time.perf_counter()
    report = chain_verify(
        "bench",
        issued,
        recorded={"count": len(issued), "head": chain.head},
        worker_keys={"w1": worker_pub},
        conductor_key=keys.public_b64(conductor),
    )
    rows.append(("receipt check in chain_verify", (time.perf_counter() - started) / n * 1e6))
    assert report["ok"], report
    print("\ncost per operation (one thread):")
    for name, us in rows:
        print(f"  {name:<42} {us:8.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--liars", type=float, default=0.3)
    parser.add_argument("--lie-rate", type=float, default=0.5)
    parser.add_argument("--validate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    v = args.validate
    scenarios = [
        Scenario("plain 2-fold replication, independent liars", False, False, "uniform"),
        Scenario("adaptive, independent liars, uniform routing", True, False, "uniform"),
        Scenario("adaptive, independent liars, reputation routing", True, False, "reputation"),
        Scenario("adaptive, colluding liars, reputation routing", True, True, "reputation"),
        Scenario(f"  + validator re-runs {v:.0%} of answers", True, True, "reputation", "all"),
        Scenario("  + validator sampling by should_validate", True, True, "reputation", "gate"),
        Scenario("plain 2-fold replication, colluding liars", False, True, "uniform"),
    ]
    print(
        f"{args.workers} simulated workers, {args.liars:.0%} liars lying on "
        f"{args.lie_rate:.0%} of their answers; {args.questions} questions, figures over "
        "the second half; policy: 2 replicas, 2 to agree, 5 at most"
    )
    print(f"{'scenario':<50} {'error':>7} {'overhead':>9} {'unresolved':>11} {'to liars':>9}")
    for scenario in scenarios:
        f = simulate(scenario, args)
        print(
            f"{scenario.name:<50} {f.error_rate:7.2%} {f.overhead:9.1%} {f.unresolved:11.2%} "
            f"{f.liar_share:9.1%}"
        )
    costs()


if __name__ == "__main__":
    main()
