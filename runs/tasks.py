"""The conductor's Celery task: one per run, on the `runs` queue."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

from runs.conductor import Conductor, conductor_name
from runs.models import Run
from runs.orphans import runs_fail_orphaned


@worker_ready.connect
def _fail_orphans(**_: object) -> None:
    """A conductor starting (or restarting after a crash) fails the runs a dead one left."""
    if conductor_name():
        runs_fail_orphaned()


@shared_task(name="runs.conduct", ignore_result=True, acks_late=False)
def run_conduct(run_id: str) -> None:
    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return
    Conductor(run).conduct()
