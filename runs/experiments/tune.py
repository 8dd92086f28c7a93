"""The policy loop: `--tune KEY=v1,v2,...` (repeatable) on the suite's tune_baseline.

Objective: the median wall time of the baseline's runs (p50 latency, lower is better) at
equal accuracy: a change that solves fewer runs than the policy it would replace is never
kept, however fast. Each round tries every remaining key's values, one change at a time
from the current policy, on the same task instances (the suite's tasks and seeds), and
measures the change's delta of the objective with a paired bootstrap 95% interval over the
(task, seed) pairs. The change with the lowest delta whose whole interval is below zero is
kept and its key leaves the loop; the loop stops when no change helps by more than the
noise (no interval below zero) or no key is left.

tune.json: {"objective", "baseline", "steps": [{key, value, objective, delta, ci_low,
ci_high, kept, accuracy, round}], "final_policy"}."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from runs.engine.policy import Policy, PolicyError, parse_assignments
from runs.experiments import stats
from runs.experiments.runner import RunRecord, SuiteRunner, plan_runs
from runs.experiments.suite import Suite

OBJECTIVE = "p50 wall seconds of the tuned baseline's runs, at equal accuracy (lower is better)"


class TuneStep(TypedDict):
    round: int
    key: str
    value: Any
    objective: float
    delta: float
    ci_low: float
    ci_high: float
    kept: bool
    accuracy: float


def parse_tune(items: list[str], option: str = "--tune") -> dict[str, list[str]]:
    """`KEY=v1,v2` strings as {key: [values]}; ValueError names a bad key or value, and
    where it came from: the command's `option`, or on the web form "a line"."""
    out: dict[str, list[str]] = {}
    for key, values in parse_assignments(items, option).items():
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not options:
            raise ValueError(f"{option} {key}= names no values; give KEY=v1,v2,...")
        for value in options:
            try:
                Policy.from_dict({key: value})
            except PolicyError as exc:
                raise ValueError(f"{option} {key}={value}: {exc}") from exc
        out[key] = options
    return out


def planned_tune_runs(suite: Suite, tune: dict[str, list[str]]) -> int:
    """The runs of the loop's first round, with the start policy's own warm measurement
    (later rounds add theirs when they start)."""
    units = len(list(plan_runs(suite, (suite.tune_baseline,))))
    return units * (1 + sum(len(values) for values in tune.values()))


def tune_policy(
    suite: Suite,
    out: Path,
    tune: dict[str, list[str]],
    runner: SuiteRunner,
    base_records: list[RunRecord],
) -> dict[str, Any]:
    """1. measure the start policy again (tune step 0), 2. each round, measure every
    remaining change from the current policy, 3. keep the best that helps beyond the noise,
    4. stop when none does; write tune.json.

    The suite's own runs of the baseline (`base_records`) are not the first measurement:
    they ran while the federation was cold (new workers are probed and fully checked for
    their first answers), so every change measured after them looked faster (seen: all
    seven changes of a first round "helped", by 0.34 to 0.68 s). Step 0 runs on the same
    warm federation as the changes that follow it."""
    baseline = suite.tune_baseline
    current = suite.baseline_policy(baseline)
    start_records = [
        runner.run(item, policy=current, tune_step=0) for item in plan_runs(suite, (baseline,))
    ]
    current_records = start_records
    remaining = dict(tune)
    steps: list[TuneStep] = []
    step_no, round_no, first = 0, 0, True
    while remaining:
        round_no += 1
        if not first:
            runner.total += len(current_records) * sum(len(v) for v in remaining.values())
        first = False
        tried = []
        for key, values in remaining.items():
            for value in values:
                step_no += 1
                policy = {**current, key: value}
                records = [
                    runner.run(item, policy=policy, tune_step=step_no)
                    for item in plan_runs(suite, (baseline,))
                ]
                step = compare(current_records, records, key, value, round_no)
                steps.append(step)
                tried.append((step, policy, records))
        helping = [
            t for t in tried if t[0]["ci_high"] < 0 and _solved(t[2]) >= _solved(current_records)
        ]
        if not helping:
            break
        best = min(helping, key=lambda t: t[0]["delta"])
        best[0]["kept"] = True
        current, current_records = best[1], best[2]
        del remaining[best[0]["key"]]
    start = Policy.from_dict(suite.baseline_policy(baseline)).to_dict()
    final = Policy.from_dict(current).to_dict()
    result = {
        "objective": OBJECTIVE,
        "baseline": baseline,
        "start_policy": start,
        "start_objective": objective(start_records),
        "suite_objective": objective(base_records),  # the same policy, cold, in the suite
        "steps": steps,
        "final_policy": final,
        "changed": {key: value for key, value in final.items() if start[key] != value},
    }
    (out / "tune.json").write_text(json.dumps(result, indent=2))
    return result


def objective(records: list[RunRecord]) -> float:
    return float(np.median([r["wall_s"] for r in records])) if records else 0.0


def _solved(records: list[RunRecord]) -> int:
    return sum(1 for r in records if r["correct"])


def _pairs(before: list[RunRecord], after: list[RunRecord]) -> tuple[np.ndarray, np.ndarray]:
    """The two measurements' wall times, paired by task instance."""

    def unit(r: RunRecord) -> tuple[str, int]:
        return (r["task_id"], r["seed"])

    first = {unit(r): r["wall_s"] for r in before}
    pairs = [(first[unit(r)], r["wall_s"]) for r in after if unit(r) in first]
    if not pairs:
        raise ValueError("the two measurements share no task instance to compare")
    a, b = zip(*pairs, strict=True)
    return np.asarray(a, dtype=float), np.asarray(b, dtype=float)


def compare(
    before: list[RunRecord], after: list[RunRecord], key: str, value: Any, round_no: int
) -> TuneStep:
    """The change's objective and its delta from `before`, with a paired bootstrap 95%
    interval (task instances resampled, both medians taken over the same resample)."""
    a, b = _pairs(before, after)

    def delta(rows: np.ndarray) -> float:
        picks = rows.astype(int)
        return float(np.median(b[picks]) - np.median(a[picks]))

    interval = stats.bootstrap([float(i) for i in range(len(a))], delta)
    return TuneStep(
        round=round_no,
        key=key,
        value=value,
        objective=objective(after),
        delta=interval["value"],
        ci_low=interval["low"],
        ci_high=interval["high"],
        kept=False,
        accuracy=_solved(after) / len(after) if after else 0.0,
    )
