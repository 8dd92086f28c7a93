"""The report's four tables, computed from a suite's run rows (runs.jsonl) and their
traces. Every table is {title, note, labels, columns, rows}: a row is {"label": {...},
"values": {column: number}}, every value a finite number computed from stored runs; a
group whose figure is undefined (no solved task, no verdict) is left out and the note says
which and why."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, TypedDict

from runs.experiments import stats
from runs.experiments.measures import (
    RunTrace,
    dishonest_workers,
    trusted_workers,
    verdicts,
    worker_names,
)

BASELINE_ORDER = [
    "rlm_sequential",
    "local_only",
    "fed_best_effort",
    "fed_redundancy",
    "fed_validator",
    "fed_premium",
]
REFERENCE = "rlm_sequential"


class Row(TypedDict):
    label: dict[str, str]
    values: dict[str, float]


class Table(TypedDict):
    key: str
    title: str
    note: str
    labels: list[str]
    columns: list[str]
    rows: list[Row]


def by_baseline(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["baseline"]].append(row)
    order = {name: i for i, name in enumerate(BASELINE_ORDER)}
    return dict(sorted(groups.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])))


def latency_table(rows: list[dict[str, Any]]) -> Table:
    """Table 1: end-to-end wall clock per baseline, and its median's ratio to RLM with
    sequential sub-calls."""
    groups = by_baseline(rows)
    reference = [r["wall_s"] for r in groups.get(REFERENCE, [])]
    columns = ["runs", "p50_s", "p95_s", "mean_s", "mean_ci_low", "mean_ci_high"]
    if reference:
        columns += ["p50_ratio", "ratio_ci_low", "ratio_ci_high"]
    out = []
    for baseline, group in groups.items():
        walls = [r["wall_s"] for r in group]
        ci = stats.bootstrap_mean(walls)
        values = {
            "runs": len(walls),
            "p50_s": stats.p50(walls),
            "p95_s": stats.p95(walls),
            "mean_s": ci["value"],
            "mean_ci_low": ci["low"],
            "mean_ci_high": ci["high"],
        }
        if reference:
            ratio = stats.bootstrap_ratio(walls, reference)
            values.update(
                p50_ratio=ratio["value"], ratio_ci_low=ratio["low"], ratio_ci_high=ratio["high"]
            )
        out.append(Row(label={"baseline": baseline}, values=values))
    note = "Wall clock of each run, seconds; 95% bootstrap interval of the mean"
    note += (
        f"; ratio of medians to {REFERENCE} with its bootstrap interval."
        if reference
        else f"; no {REFERENCE} runs, so no ratio."
    )
    return Table(
        key="latency",
        title="Table 1. End-to-end latency by baseline",
        note=note,
        labels=["baseline"],
        columns=columns,
        rows=out,
    )


def cost_table(rows: list[dict[str, Any]], model_s: dict[str, float]) -> Table:
    """Table 2: what a solved task cost per baseline: tokens, dollars and model-seconds
    (the compute units: root turns plus workers' model calls, from the traces) over all the
    baseline's runs, divided by the tasks it solved."""
    out, unbounded = [], []
    for baseline, group in by_baseline(rows).items():
        solved = [bool(r["correct"]) for r in group]
        if not any(solved):
            unbounded.append(baseline)
            continue
        usd = stats.bootstrap_sum_ratio([float(r["cost_usd"]) for r in group], solved)
        tokens = [r["tokens_in"] + r["tokens_out"] for r in group]
        tok = stats.bootstrap_sum_ratio(tokens, solved)
        compute = stats.bootstrap_sum_ratio([model_s.get(r["run_id"], 0.0) for r in group], solved)
        out.append(
            Row(
                label={"baseline": baseline},
                values={
                    "runs": len(group),
                    "solved": sum(solved),
                    "tokens_in_per_solved": sum(r["tokens_in"] for r in group) / sum(solved),
                    "tokens_out_per_solved": sum(r["tokens_out"] for r in group) / sum(solved),
                    "tokens_per_solved": tok["value"],
                    "tokens_ci_low": tok["low"],
                    "tokens_ci_high": tok["high"],
                    "usd_per_solved": usd["value"],
                    "usd_ci_low": usd["low"],
                    "usd_ci_high": usd["high"],
                    "model_s_per_solved": compute["value"],
                    "model_s_ci_low": compute["low"],
                    "model_s_ci_high": compute["high"],
                },
            )
        )
    note = (
        "All runs' spending divided by the tasks solved; 95% bootstrap intervals over runs. "
        "Model-seconds: the root's turns plus the workers' model calls, from the traces."
    )
    if unbounded:
        note += f" Solved nothing (cost per solved task unbounded): {', '.join(unbounded)}."
    return Table(
        key="cost",
        title="Table 2. Cost per solved task",
        note=note,
        labels=["baseline"],
        columns=list(out[0]["values"]) if out else [],
        rows=out,
    )


def success_table(rows: list[dict[str, Any]]) -> Table:
    """Table 3: the share of tasks answered correctly, per baseline and family."""
    out = []
    for baseline, group in by_baseline(rows).items():
        families: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in group:
            families[row["family"]].append(row)
        for family, runs in sorted(families.items()):
            solved = sum(bool(r["correct"]) for r in runs)
            rate = stats.wilson(solved, len(runs))
            out.append(
                Row(
                    label={"baseline": baseline, "family": family},
                    values={
                        "runs": len(runs),
                        "solved": solved,
                        "success_rate": rate["value"],
                        "ci_low": rate["low"],
                        "ci_high": rate["high"],
                        "mean_score": stats.mean([float(r["score"]) for r in runs]),
                    },
                )
            )
    return Table(
        key="success",
        title="Table 3. Task success rate",
        note="Share of runs whose answer is exactly right; 95% Wilson score interval.",
        labels=["baseline", "family"],
        columns=["runs", "solved", "success_rate", "ci_low", "ci_high", "mean_score"],
        rows=out,
    )


def detection_table(
    rows: list[dict[str, Any]], traces: dict[str, RunTrace], suite: dict[str, Any], base: Any
) -> Table:
    """Table 4: per baseline and kind of dishonest worker, the share of their judged
    replies the verifiers did not accept (detection), and the share of honest, untrusted
    workers' judged replies they did not accept (false positives), with the part of those
    that known-answer probes made shown apart."""
    dishonest = dishonest_workers(suite, base)
    judged = {r["run_id"]: verdicts(traces[r["run_id"]]) for r in rows if r["run_id"] in traces}
    ids = {w for vs in judged.values() for w, _, _ in vs}
    names = worker_names(ids)
    trusted = trusted_workers(ids)
    out, skipped = [], []
    for baseline, group in by_baseline(rows).items():
        tally: dict[str, list[tuple[bool, str]]] = defaultdict(list)  # kind -> verdicts
        caught: dict[str, set[str]] = defaultdict(set)
        seen: dict[str, set[str]] = defaultdict(set)
        for row in group:
            for worker, accepted, verifier in judged.get(row["run_id"], []):
                if worker in trusted:
                    continue  # a validator or datacenter pod: taken on trust, not judged
                kind = dishonest.get(names.get(worker, worker), "honest")
                tally[kind].append((accepted, verifier))
                seen[kind].add(worker)
                if not accepted:
                    caught[kind].add(worker)
        honest = tally.get("honest", [])
        honest_no = sum(not a for a, _ in honest)
        probe_no = sum(not a for a, v in honest if v == "probe")
        others = [a for a, v in honest if v != "probe"]
        for kind in ("lying", "colluding"):
            flags = [a for a, _ in tally.get(kind, [])]
            if not flags or not honest:
                if any(k == kind for k in dishonest.values()):
                    skipped.append(f"{baseline}/{kind}")
                continue
            hit = stats.wilson(sum(not a for a in flags), len(flags))
            fp = stats.wilson(honest_no, len(honest))
            out.append(
                Row(
                    label={"baseline": baseline, "workers": kind},
                    values={
                        "judged": len(flags),
                        "not_accepted": sum(not a for a in flags),
                        "detection_rate": hit["value"],
                        "detection_ci_low": hit["low"],
                        "detection_ci_high": hit["high"],
                        "workers_caught": len(caught[kind]),
                        "workers_judged": len(seen[kind]),
                        "honest_judged": len(honest),
                        "honest_not_accepted": honest_no,
                        "false_positive_rate": fp["value"],
                        "fp_ci_low": fp["low"],
                        "fp_ci_high": fp["high"],
                        "honest_probe_not_accepted": probe_no,
                        "honest_judged_without_probes": len(others),
                        "fp_rate_without_probes": (
                            sum(not a for a in others) / len(others) if others else 0.0
                        ),
                    },
                )
            )
    note = (
        "From the runs' Verify.* events, one verdict per judged reply of an untrusted worker "
        "(workers on trusted venues, the validators and datacenter pods, are left out on both "
        "sides): redundancy's agreed (accepted) and outvoted (not), every reply of an "
        "unresolved vote (not accepted), an objective check, a validator's signed "
        "attestation on the judged worker (a refused attestation or a validator's missing "
        "answer judges no worker), and a known-answer probe (Verify.Probe). Detection: the "
        "share of dishonest workers' verdicts that did not accept the reply; false positive: "
        "the same share for honest workers; honest_probe_not_accepted and "
        "fp_rate_without_probes (over honest_judged_without_probes, 0 when there are none) show "
        "how much of it the probes made. 95% Wilson intervals. "
        f"Dishonest workers per the suite's federation: {len(dishonest)}."
    )
    if skipped:
        note += f" No verdicts on both sides (no rate): {', '.join(skipped)}."
    return Table(
        key="detection",
        title="Table 4. Detection of lying and colluding workers",
        note=note,
        labels=["baseline", "workers"],
        columns=list(out[0]["values"]) if out else [],
        rows=out,
    )
