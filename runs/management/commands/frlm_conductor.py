from __future__ import annotations

import os
import socket

from django.core.management.base import BaseCommand

from runs.orphans import CONDUCTOR_GROUP


class Command(BaseCommand):
    help = "Run a conductor: a Celery worker on the queue `runs` that conducts FRLM runs."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--concurrency", type=int, default=4, help="runs at once")
        parser.add_argument("--name", default=None)

    def handle(self, *args, concurrency: int, name: str | None, **options) -> None:
        from frlm_web.celery import run_worker

        run_worker(
            queue="runs",
            concurrency=concurrency,
            name=name or f"conductor-{socket.gethostname()}-{os.getpid()}",
            group=CONDUCTOR_GROUP,
            info={},
        )
