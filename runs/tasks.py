"""The conductor's Celery task: one per run, on the `runs` queue."""

from __future__ import annotations

from celery import shared_task

from runs.conductor import Conductor
from runs.models import Run


@shared_task(name="runs.conduct", ignore_result=True, acks_late=False)
def run_conduct(run_id: str) -> None:
    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return
    Conductor(run).conduct()
