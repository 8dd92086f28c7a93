"""A run's policy: the limits and fanout rules the conductor enforces outside the REPL."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

from frlm_web.money import money


class PolicyError(ValueError):
    """One or more policy values are out of range; the message lists each."""


@dataclass(frozen=True)
class Policy:
    max_depth: int = 1  # how deep rlm_query may nest child RLMs (the root is depth 0)
    max_turns: int = 8  # root-model turns per RLM before it is asked for its best answer
    max_subqueries: int = 2000  # sub-queries (and child RLMs) in the whole run
    max_batch: int = 512  # prompts in one llm_query_batched call
    # Sub-queries of one batch out at once (0: as many as the workers have credit for);
    # 1 runs them one after another, as the original RLM's sequential sub-calls do.
    max_inflight: int = 0
    # Jobs for one trusted broker worker sent together in one Celery message (a bundle,
    # workers/wire.py); 0: the server's FRLM_BUNDLE_MAX; 1: each alone.
    bundle_max: int = 0
    subquery_timeout_s: float = 60.0  # one attempt of one sub-query
    max_retries: int = 1  # attempts after the first, on another venue where possible
    quorum: float = 1.0  # a batch proceeds once this fraction has returned
    batch_deadline_s: float = 600.0  # a batch proceeds at this deadline whatever returned
    max_errors: int = 3  # failed REPL cells a run rides out: one more fails it
    cell_timeout_s: float = 60.0  # wall clock of one REPL cell
    repl_cpu_s: int = 600  # CPU seconds of one REPL process, over all its cells
    cell_memory_mb: int = 2048  # memory of the REPL process
    scratch_mb: int = 256  # the REPL's writable space (a tmpfs), and its largest file
    output_chars: int = 8000  # REPL output shown to the root model per cell
    # Where sub-queries go: "score" (the scheduler: each to the worker expected to finish it
    # first, weighed by reputation, price and load), "shared" (one queue per venue, taken by
    # whichever worker is free: what Celery does by itself), "round_robin" (in turn).
    routing: str = "score"
    explore: float = 0.05  # share of sub-queries sent to a random eligible worker
    weight_latency: float = 1.0
    weight_reputation: float = 2.0  # exponent on the reputation score (0 ignores it)
    weight_price: float = 0.5
    weight_load: float = 0.2
    min_reputation: float = 0.2  # below it a worker gets work only by exploration
    # A worker priced above this many times the cheapest priced worker of the run's venues
    # gets no work from it (0: no limit); within it, weight_price weighs the price.
    max_price_ratio: float = 10.0
    # Verification: "best_effort" takes each reply as it comes; "redundant" sends copies to
    # distinct workers and accepts an answer when `agree` of them give it (workers past the
    # trust gate are copied only now and then), adding copies up to `max_replicas`, else
    # the sub-query is unresolved; "high_trust" has a validator (a worker of a trusted
    # venue) re-run a sample of the answers and sign an attestation of what it found.
    # llm_query(..., tier=...) overrides it per call; validate=... adds objective checks.
    tier: str = "best_effort"
    replicas: int = 2
    agree: int = 2
    max_replicas: int = 5
    agree_mode: str = "exact"  # exact | numeric | similar
    # Compute mobility: venues (comma-separated) that run the redundant tier's copies, e.g.
    # a trusted datacenter pod checking an edge swarm's answers; the answers themselves
    # then run on the run's other venues. Empty: copies go anywhere.
    verify_venues: str = ""
    # A premium lane: venues (comma-separated, e.g. a datacenter pod) kept for selected
    # steps only, while every other sub-query runs on the run's other venues. The steps:
    # "single" (an llm_query of one prompt, such as the merge of partial answers),
    # "retries" (an attempt after one failed or timed out), or "both". Empty: no lane.
    premium_venues: str = ""
    premium_steps: str = "single"
    # The high-trust tier's sample: the share of answers a validator re-runs when only
    # workers that have not passed the trust gate vouch for them; and on both checking
    # tiers, the share of a trusted venue's workers' answers that are checked.
    # validate_rate applies to a worker that has not yet passed check_warmup checks (all
    # of a new worker's answers, so a cold swarm's first round is as safe as its tenth).
    validate_rate: float = 1.0
    validate_trusted_rate: float = 0.02
    # Checks of workers nobody vouches for (redundant and high-trust tiers; issue 23): a
    # worker's answers are all checked until it has passed check_warmup checks in a row,
    # then check_floor of them (systematic sampling, its phase kept across runs); one
    # proven lie weighs lie_penalty good results (its score collapses and it is checked on
    # every answer again) and its recent answers are re-checked. probe_rate is the share of
    # known-answer probes mixed into each batch; a new worker gets one per batch as well.
    # At a floor of 4% an honest high-trust swarm paid 7.7-8.3% in checks (the target is 8),
    # at 3% 7.3-7.7%, with colluders' settled error 0.00% either way (bench/trust.py).
    check_floor: float = 0.03
    check_warmup: int = 10
    # "gate" (redundant and high-trust tiers): one answer of each untrusted worker in a
    # batch is checked as soon as it arrives, a new or suspect worker's first, a settled
    # worker's drawn at random among those it is expected to give (copied to another
    # worker; a dispute goes to a third worker, or to a validator on the high-trust tier,
    # where a validator checks it outright when the worker is new, suspect or its floor
    # check is due, or no settled peer unchecked in the batch is free), and until the
    # verdict the worker gets at most its slots less one of the batch's work past the
    # answers before it (runs/engine/fanout/vouching.py). A turncoat caught so has its
    # lies of the batch corrected, and no answer of a batch is one a liar knows is safe.
    # "first": the same with every worker's first answer, which catches a worker that
    # turned between batches within its slots less one, but a liar that answers its first
    # job of each batch honestly is left to the floor.
    # "batch": on the redundant tier every untrusted worker that answers in a batch takes
    # part in at least one check of it once the batch is in (its answer copied, or a copy
    # sent to it), so a turncoat is caught in the batch it turns in, after its share of it
    # (runs.trust.verify.cover); "off": the floor alone.
    check_cover: str = "gate"
    probe_rate: float = 0.01
    lie_penalty: float = 250.0
    # Hedging: a sub-query still running past this quantile of its venue's latency (in this
    # run) gets a duplicate on another worker once no fresh work is waiting; the first
    # acceptable reply wins and the other is cancelled. "off" never hedges.
    hedge: str = "p95"
    # Budgets in dollars (0: no cap): the whole run (root turns and sub-queries), each
    # sub-query over its attempts and copies, and per provider (model name=dollars, comma
    # separated). At the run's cap nothing more is dispatched and the run ends "partial".
    budget_usd: float = 0.0
    subquery_budget_usd: float = 0.0
    provider_budgets: str = ""
    fold_tokens: int = 60_000  # conversation size (tokens) past which older turns are folded

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Policy:
        """Build from user input, converting types; PolicyError names every bad value."""
        data = dict(data or {})
        known = {f.name: f for f in fields(cls)}
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key not in known:
                problems.append(f"policy.{key} is not a policy setting (known: {', '.join(known)})")
                continue
            if key in TEXTS:
                if not isinstance(raw, str) or not TEXTS[key].fullmatch(raw.strip()):
                    problems.append(f"policy.{key} must be {TEXT_HINTS[key]}, got {raw!r}")
                else:
                    values[key] = raw.strip()
                continue
            if key in CHOICES:
                if raw not in CHOICES[key]:
                    problems.append(
                        f"policy.{key} must be one of {', '.join(CHOICES[key])}, got {raw!r}"
                    )
                else:
                    values[key] = raw
                continue
            kind = int if known[key].type in ("int", int) else float
            try:
                value = kind(raw)
            except (TypeError, ValueError):
                problems.append(
                    f"policy.{key} must be {'an integer' if kind is int else 'a number'}, "
                    f"got {raw!r}"
                )
                continue
            low, high = RANGES[key]
            if not low <= value <= high:
                problems.append(f"policy.{key} must be between {low} and {high}, got {raw}")
                continue
            values[key] = value
        merged = {**{f.name: getattr(cls, f.name) for f in fields(cls)}, **values}
        if not merged["agree"] <= merged["replicas"] <= merged["max_replicas"]:
            problems.append(
                "policy.agree <= policy.replicas <= policy.max_replicas must hold, got "
                f"{merged['agree']}, {merged['replicas']}, {merged['max_replicas']}"
            )
        if problems:
            raise PolicyError("; ".join(problems))
        return cls(**values)


_VENUE = r"[a-z][a-z0-9_-]{0,31}"
_PROVIDER_CAP = r"[A-Za-z0-9_.:/@-]{1,100}=\d+(?:\.\d+)?"
TEXTS: dict[str, re.Pattern[str]] = {
    "verify_venues": re.compile(rf"(?:{_VENUE}(?:,{_VENUE})*)?"),
    "premium_venues": re.compile(rf"(?:{_VENUE}(?:,{_VENUE})*)?"),
    "provider_budgets": re.compile(rf"(?:{_PROVIDER_CAP}(?:,{_PROVIDER_CAP})*)?"),
}
TEXT_HINTS = {
    "verify_venues": "venue names separated by commas",
    "premium_venues": "venue names separated by commas",
    "provider_budgets": "MODEL=DOLLARS pairs separated by commas, e.g. gpt-4.1-mini=2.5",
}

CHOICES: dict[str, tuple[str, ...]] = {
    "routing": ("score", "shared", "round_robin"),
    "tier": ("best_effort", "redundant", "high_trust"),
    "hedge": ("off", "p90", "p95", "p99"),
    "agree_mode": ("exact", "numeric", "similar"),
    "premium_steps": ("single", "retries", "both"),
    "check_cover": ("gate", "first", "batch", "off"),
}

RANGES: dict[str, tuple[float, float]] = {
    "max_depth": (0, 5),
    "max_turns": (1, 50),
    "max_subqueries": (1, 100_000),
    "max_batch": (1, 4096),
    "max_inflight": (0, 4096),
    "bundle_max": (0, 64),
    "subquery_timeout_s": (0.1, 3600),
    "max_retries": (0, 5),
    "quorum": (0.05, 1.0),
    "batch_deadline_s": (0.5, 86_400),
    "max_errors": (0, 50),
    "cell_timeout_s": (0.5, 3600),
    "repl_cpu_s": (1, 86_400),
    "cell_memory_mb": (128, 65_536),
    "scratch_mb": (1, 65_536),
    "output_chars": (200, 1_000_000),
    "explore": (0.0, 1.0),
    "weight_latency": (0.0, 100.0),
    "weight_reputation": (0.0, 10.0),
    "weight_price": (0.0, 100.0),
    "weight_load": (0.0, 100.0),
    "min_reputation": (0.0, 1.0),
    "max_price_ratio": (0.0, 1e6),
    "replicas": (1, 9),
    "agree": (1, 9),
    "max_replicas": (1, 15),
    "fold_tokens": (500, 10_000_000),
    "validate_rate": (0.0, 1.0),
    "validate_trusted_rate": (0.0, 1.0),
    "check_floor": (0.0, 1.0),
    "check_warmup": (0, 1000),
    "probe_rate": (0.0, 1.0),
    "lie_penalty": (1.0, 10_000.0),
    "budget_usd": (0.0, 1_000_000.0),
    "subquery_budget_usd": (0.0, 1_000_000.0),
}


def provider_caps(text: str) -> dict[str, Decimal]:
    """policy.provider_budgets as {model name: exact dollars}."""
    pairs = (item.rpartition("=") for item in text.split(",") if item)
    return {name: money(value, what=f"provider {name}'s budget") for name, _, value in pairs}


def parse_assignments(items: list[str], option: str = "--policy") -> dict[str, str]:
    """`key=value` strings (from the command line's `option`) as a dict; PolicyError on a
    bad one, naming the option it came with, and on a key given twice (the last value won
    without a word: an experiment's `--tune hedge=p90,p99 --tune hedge=off` tried only
    `off`, a review found)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("policy.")
        if not sep or not key:
            raise PolicyError(f"{option} takes KEY=VALUE, got {item!r}")
        if key in out:
            raise PolicyError(
                f"{key} is given twice ({key}={out[key]} and {key}={value.strip()}): give "
                f"it once, with all its values if it takes several ({key}=v1,v2)"
            )
        out[key] = value.strip()
    return out
