"""Writes on experiments launched from the web console: create one (its suite and policy
loop checked first), start it after commit, and record its progress and its end. The
Celery task (runs.tasks.experiment_conduct) calls the runner and the report through these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.experiments.runner import plan_runs
from runs.experiments.suite import Suite, SuiteError, load_suite
from runs.experiments.tune import parse_tune
from runs.models import Experiment

SUITES = ("small", "default")


def experiments_dir() -> Path:
    return Path(settings.DATA_DIR) / "experiments"


def experiment_create(
    *, suite_name: str, tune: list[str], user: Any, option: str = "--tune"
) -> Experiment:
    """A queued experiment of a built-in suite; ValueError (SuiteError among them) says
    in one line what is wrong with the suite or a tune item."""
    if suite_name not in SUITES:
        raise SuiteError(f"suite must be one of {', '.join(SUITES)}, got {suite_name!r}")
    suite: Suite = load_suite(suite_name)
    loop = parse_tune([t for t in tune if t.strip()], option)
    experiment = Experiment.objects.create(
        created_by=user if getattr(user, "is_authenticated", False) else None,
        suite_name=suite.name,
        suite=suite.to_dict(),
        tune=loop,
        total=len(list(plan_runs(suite))),
        output_dir="",
    )
    experiment.output_dir = str(experiments_dir() / f"x{experiment.pk}")
    experiment.save(update_fields=["output_dir"])
    return experiment


def experiment_launch(experiment: Experiment) -> None:
    """Enqueue its task once the row is committed (the task reads it)."""
    from runs.tasks import experiment_conduct

    transaction.on_commit(lambda: experiment_conduct.delay(experiment.pk))


def experiment_progress(experiment_id: int, info: dict[str, Any]) -> None:
    """The runner's progress callback: runs done of the total (the policy loop adds runs
    as it goes, so the total may grow)."""
    Experiment.objects.filter(pk=experiment_id).update(
        status=Experiment.Status.RUNNING,
        done=int(info.get("done", 0)),
        total=int(info.get("total", 0)),
    )


def experiment_start(experiment_id: int) -> bool:
    """Mark it running; False when it is not queued (already taken, or ended): a
    redelivered task must not run a suite twice."""
    return bool(
        Experiment.objects.filter(pk=experiment_id, status=Experiment.Status.QUEUED).update(
            status=Experiment.Status.RUNNING
        )
    )


def experiment_finish(experiment_id: int, *, report: Path | None, error: str = "") -> None:
    Experiment.objects.filter(pk=experiment_id).update(
        status=Experiment.Status.FAILED if error else Experiment.Status.DONE,
        error=error,
        report_path=str(report or ""),
        finished=timezone.now(),
    )
