"""Run a suite: every (task x baseline x seed) as an ordinary run on the suite's federation,
one at a time so their latencies do not disturb each other, and write what the report reads:

- suite.json: the suite as resolved (load_suite reads it back);
- machine.json: the machine and the code version, so a reader can rerun it;
- runs.jsonl: one object per run (RunRecord), appended as each run ends;
- tune.json: the policy loop's steps, when asked for (runs.experiments.tune).

`run_suite` prints nothing and never exits: a caller (the command, the web launcher's
Celery task) sees progress through its callback and problems as exceptions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings

from frlm_web.money import money_str
from runs.experiments.federation import federation
from runs.experiments.suite import Suite
from runs.models import Run
from runs.services import ContextSpec, run_cancel, run_create, run_launch
from runs.taskgen import answer_score
from workers.backends import ModelSpec, model_spec


class RunRecord(TypedDict):
    run_id: str
    task_id: str
    family: str
    size_tokens: int
    task_seed: int
    baseline: str
    seed: int
    tune_step: int | None
    policy: dict[str, Any]
    venues: list[str]
    status: str
    error: str
    answer: str
    expected: str
    correct: bool
    score: float
    wall_s: float
    cost_usd: str
    tokens_in: int
    tokens_out: int
    sub_queries: int
    failed_sub_queries: int
    turns: int


Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Planned:
    """One run of the suite, before it runs."""

    task_id: str
    family: str
    tokens: int
    task_seed: int
    baseline: str
    seed: int


def plan_runs(suite: Suite, baselines: tuple[str, ...] | None = None) -> Iterator[Planned]:
    """Seed by seed, task by task, every baseline on the same task instance in turn: a
    slow spell of the machine falls on all baselines alike, and their runs pair up."""
    for seed in suite.seeds:
        for spec in suite.tasks:
            for index in range(spec.count):
                for baseline in baselines or suite.baselines:
                    yield Planned(
                        task_id=f"{spec.family}-{spec.tokens}-{index}",
                        family=spec.family,
                        tokens=spec.tokens,
                        task_seed=seed * 1000 + index,
                        baseline=baseline,
                        seed=seed,
                    )


def run_suite(
    suite: Suite,
    output_dir: str | Path,
    *,
    progress: Progress | None = None,
    endpoint: str | None = None,
    tune: dict[str, list[str]] | None = None,
) -> Path:
    """1. write suite.json and machine.json, 2. bring up the federation, 3. run every
    planned run in order, appending each to runs.jsonl, 4. with `tune` ({key: [values]}),
    run the policy loop on the suite's tune_baseline, 5. stop what was started."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    models = suite_models(suite, endpoint)
    (out / "suite.json").write_text(
        json.dumps({**suite.to_dict(), "endpoint": models[0].base_url}, indent=2)
    )
    (out / "machine.json").write_text(json.dumps(machine(), indent=2))
    (out / "runs.jsonl").write_text("")
    planned = list(plan_runs(suite))
    total = len(planned)
    if tune:
        from runs.experiments.tune import planned_tune_runs

        total += planned_tune_runs(suite, tune)
    runner = SuiteRunner(suite, out, models, progress, total)
    with federation(suite, out):
        records = [
            runner.run(item, policy=suite.baseline_policy(item.baseline)) for item in planned
        ]
        if tune:
            from runs.experiments.tune import tune_policy

            base = [r for r in records if r["baseline"] == suite.tune_baseline]
            tune_policy(suite, out, tune, runner, base)
    return out


def suite_models(suite: Suite, endpoint: str | None) -> tuple[ModelSpec, ModelSpec]:
    """The root and worker models: the simulated ones, or the model at the endpoint."""
    url = endpoint or suite.endpoint
    if not url:
        return model_spec("sim", role="root"), model_spec("sim", role="worker")
    name = suite.model or os.environ.get("FRLM_EXPERIMENT_MODEL", "")
    if not name:
        raise ValueError(
            'a model endpoint needs the model\'s name: set "model" in the suite file or '
            "FRLM_EXPERIMENT_MODEL"
        )
    spec = f"openai:{name}"
    return (
        model_spec(spec, role="root", base_url=url),
        model_spec(spec, role="worker", base_url=url),
    )


class SuiteRunner:
    """Runs one planned run at a time and records it (the tuning loop shares it)."""

    def __init__(
        self,
        suite: Suite,
        out: Path,
        models: tuple[ModelSpec, ModelSpec],
        progress: Progress | None,
        total: int,
    ) -> None:
        self.suite, self.out, self.models = suite, out, models
        self.progress, self.total, self.done = progress, total, 0

    def run(
        self, item: Planned, *, policy: dict[str, Any], tune_step: int | None = None
    ) -> RunRecord:
        """Create the run through the services (as the launcher does), launch it, wait for
        its end (cancelling it past the suite's timeout_s), record it."""
        run = run_create(
            question="",
            context=ContextSpec(task=item.family, tokens=item.tokens, seed=item.task_seed),
            policy=policy,
            root_model=self.models[0],
            worker_model=self.models[1],
            venues=self.suite.baseline_venues(item.baseline),
        )
        run_launch(run)
        run = wait_done(run, self.suite.timeout_s)
        record = run_record(run, item, tune_step)
        with open(self.out / "runs.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
        self.done += 1
        if self.progress is not None:
            self.progress(
                {
                    "done": self.done,
                    "total": self.total,
                    "run_id": run.id,
                    "baseline": item.baseline,
                    "task_id": item.task_id,
                    "status": run.status,
                    "correct": record["correct"],
                    "wall_s": record["wall_s"],
                    "tune_step": tune_step,
                }
            )
        return record


def wait_done(run: Run, timeout_s: float) -> Run:
    """The run once it has ended; past `timeout_s` it is cancelled, and given a minute to
    end (the conductor stops it at its next step); then it is recorded as it stands."""
    deadline = time.monotonic() + timeout_s
    cancelled = False
    while True:
        run.refresh_from_db()
        if run.done:
            return run
        if time.monotonic() > deadline:
            if cancelled:
                return run
            run_cancel(run)
            cancelled, deadline = True, time.monotonic() + 60
        time.sleep(0.1)


def run_record(run: Run, item: Planned, tune_step: int | None) -> RunRecord:
    answer = run.answer or ""
    score = answer_score(run.task, run.expected_answer, answer) if answer else 0.0
    if run.wall_ms is not None:
        wall = run.wall_ms / 1000
    elif run.started and run.finished:
        wall = (run.finished - run.started).total_seconds()
    else:
        wall = 0.0
    return RunRecord(
        run_id=run.id,
        task_id=item.task_id,
        family=item.family,
        size_tokens=item.tokens,
        task_seed=item.task_seed,
        baseline=item.baseline,
        seed=item.seed,
        tune_step=tune_step,
        policy=dict(run.policy),
        venues=list(run.venues),
        status=run.status,
        error=run.error,
        answer=answer,
        expected=run.expected_answer,
        correct=run.status == Run.Status.SUCCEEDED and score >= 1.0,
        score=float(score),
        wall_s=round(float(wall), 4),
        cost_usd=money_str(run.cost),
        tokens_in=run.tokens_in,
        tokens_out=run.tokens_out,
        sub_queries=run.subqueries,
        failed_sub_queries=run.subqueries_failed,
        turns=run.turns,
    )


def machine() -> dict[str, Any]:
    """What ran the suite: enough for a reader to judge and rerun it."""
    commit, dirty = _git("rev-parse", "HEAD"), _git("status", "--porcelain")
    return {
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": commit or None,
        "git_dirty": bool(dirty) if commit else None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(settings.BASE_DIR), *args],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
