"""Real small experiments for the report and page tests: runs of the stack's conductor on a
federation with a lying swarm, written out as the runner writes a suite's output directory
(suite.json, machine.json, runs.jsonl)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings

from frlm_web.money import money_str
from runs.taskgen import answer_score
from tests.helpers import finish, launch, trace

# Baselines as the suite's runner stands them up: venues and policy per baseline.
BASELINES = {
    "rlm_sequential": (["local"], {"max_batch": 1}),
    "local_only": (["local"], {}),
    "fed_best_effort": (["local", "edge", "mob"], {}),
    # Only the half-lying swarm: every vote has liars in it, so Table 4 always has rows.
    "fed_redundancy": (["mob"], {"tier": "redundant", "replicas": 2, "agree": 2}),
    "fed_validator": (["local", "mob"], {"tier": "high_trust", "validate_rate": 1.0}),
}
TASKS = [("sniah", 8000, 1), ("sniah", 8000, 2)]
HOSTILE = "<script>alert('pwned')</script>"


def _row(run, baseline: str, task_id: str, family: str, tokens: int, seed: int) -> dict:
    score = answer_score(run.task, run.expected_answer, run.answer)
    return {
        "run_id": run.id,
        "task_id": task_id,
        "family": family,
        "size_tokens": tokens,
        "baseline": baseline,
        "seed": seed,
        "tune_step": None,
        "policy": run.policy,
        "status": run.status,
        "answer": run.answer,
        "expected": run.expected_answer,
        "correct": bool(run.correct),
        "score": score,
        "wall_s": (run.wall_ms or 0) / 1000,
        "cost_usd": money_str(run.cost),
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
        "sub_queries": run.subqueries,
        "failed_sub_queries": run.subqueries_failed,
    }


def _machine() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu_count": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit,
        "git_dirty": False,
        "date": datetime.now(UTC).isoformat(),
    }


@pytest.fixture
def experiment_dir(swarm_factory, tmp_path) -> Path:
    """An output directory of real runs: each baseline on each task, on local, edge and a
    swarm `mob` of four workers two of which always lie; the last run's answer is replaced by
    a hostile string, as a model could write."""
    swarm = swarm_factory("mob", 4, lie_share=0.5, latency=30)
    liars = sorted(d.name for d in swarm.devices if d.liar)
    rows = []
    for baseline, (venues, policy) in BASELINES.items():
        launched = [
            (
                launch(task=family, tokens=tokens, seed=seed, venues=venues, policy=policy),
                f"{family}-{tokens}-{seed}",
                family,
                tokens,
                seed,
            )
            for family, tokens, seed in TASKS
        ]
        for run, task_id, family, tokens, seed in launched:
            finish(run, timeout=120)
            trace(run)
            rows.append(_row(run, baseline, task_id, family, tokens, seed))
    rows[-1]["answer"] = HOSTILE
    out = tmp_path / "experiment"
    out.mkdir()
    suite = {
        "name": "test",
        "tasks": [{"family": f, "size_tokens": t, "seed": s} for f, t, s in TASKS],
        "baselines": {b: {"venues": v, "policy": p} for b, (v, p) in BASELINES.items()},
        "seeds": [1],
        "federation": {
            "venues": [
                {"name": "mob", "profile": "mob", "workers": 4, "seed": 0, "liars": liars},
            ],
        },
    }
    (out / "suite.json").write_text(json.dumps(suite, indent=2))
    (out / "machine.json").write_text(json.dumps(_machine(), indent=2))
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out
