from __future__ import annotations

import os
import socket

from frlm_web.commands import FrlmCommand, whole
from runs.orphans import CONDUCTOR_GROUP


class Command(FrlmCommand):
    help = "Run a conductor: a Celery worker on the queue `runs` that conducts FRLM runs."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--concurrency", type=whole(1), default=4, help="runs conducted at once (default 4)"
        )
        parser.add_argument(
            "--name",
            default=None,
            help="this conductor's Celery and presence name (default: conductor-HOST-PID)",
        )

    def handle(self, *args, concurrency: int, name: str | None, **options) -> None:
        from frlm_web.celery import run_worker
        from workers.backends import preload

        preload()  # the root model's client, before the first run's first turn
        run_worker(
            queue="runs",
            concurrency=concurrency,
            name=name or f"conductor-{socket.gethostname()}-{os.getpid()}",
            group=CONDUCTOR_GROUP,
            info={},
        )
