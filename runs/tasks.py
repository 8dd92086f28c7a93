"""The conductor's Celery task: one per run, on the `runs` queue."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from celery.signals import worker_ready
from django.utils import timezone

from frlm_web.celery import app
from frlm_web.redis_client import get_redis
from runs.engine.conductor import Conductor, conductor_name
from runs.lease import watch_start
from runs.models import Run
from runs.orphans import runs_fail_orphaned
from runs.services import CONDUCT_TASK
from workers.services import departed_bindings_sweep

log = logging.getLogger(__name__)


@worker_ready.connect
def _fail_orphans(**_: object) -> None:
    """A conductor starting (or restarting after a crash) fails the runs a dead one left, and
    from then on watches the other conductors' leases."""
    if conductor_name():
        runs_fail_orphaned()
        watch_start(conductor_name())
        # Housekeeping, off the consumer's thread: a Redis that went away during the sweep
        # held that thread while the client rode the outage out (about a minute), and the
        # conductor could neither take runs nor stop on SIGTERM meanwhile.
        threading.Thread(target=_sweep_bindings, name="frlm-bindings-sweep", daemon=True).start()


def _sweep_bindings() -> None:
    try:
        swept = departed_bindings_sweep(get_redis())
    except Exception:
        log.exception("could not sweep departed workers' queue bindings")
    else:
        if swept:
            log.info("dropped the queue bindings of %d departed workers", swept)


@app.task(name=CONDUCT_TASK, ignore_result=True, acks_late=False)
def run_conduct(run_id: str) -> None:
    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return
    try:
        conductor = Conductor(run)
    except Exception as exc:
        # A run this conductor cannot even set up (a policy from a newer version, a
        # missing model) ends now with the reason, instead of waiting forever.
        log.exception("run %s cannot be conducted", run_id)
        Run.objects.filter(id=run_id, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(
            status=Run.Status.FAILED,
            error=f"the conductor could not set the run up: {exc}",
            finished=timezone.now(),
        )
        return
    conductor.conduct()


@app.task(name="runs.experiment", ignore_result=True, acks_late=False)
def experiment_conduct(experiment_id: int) -> None:
    """Run an experiment's suite (each run an ordinary run, conducted by the conductors),
    then build its report. It holds one conductor slot for the suite's length, so a
    conductor needs --concurrency of 2 or more to serve both it and the suite's runs."""
    from runs.experiments import services
    from runs.experiments.report import build_report
    from runs.experiments.runner import run_suite
    from runs.experiments.suite import load_suite
    from runs.models import Experiment

    if not services.experiment_start(experiment_id):
        return
    experiment = Experiment.objects.get(pk=experiment_id)
    out = Path(experiment.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite-request.json").write_text(json.dumps(experiment.suite))
    try:
        suite = load_suite(out / "suite-request.json")
        run_suite(
            suite,
            out,
            progress=lambda info: services.experiment_progress(experiment_id, info),
            tune=experiment.tune or None,
        )
        report = build_report(out)
    except Exception as exc:
        log.exception("experiment %s failed", experiment_id)
        services.experiment_finish(experiment_id, report=None, error=f"{type(exc).__name__}: {exc}")
        return
    services.experiment_finish(experiment_id, report=report)
