from __future__ import annotations

import json

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, whole
from traces import store


class Command(FrlmCommand):
    # A read of the trace store: no system checks, and no app registry (frlm_web/light.py).
    requires_system_checks: list[str] = []
    help = "Print a run's span tree with timings (or its events as JSON lines)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", help="the run whose trace to print (see frlm_runs)")
        parser.add_argument("--events", action="store_true", help="print raw events as JSON lines")
        parser.add_argument(
            "--max-children",
            type=whole(1),
            default=12,
            help="children shown under one span before the rest are summed up (default 12)",
        )

    def handle(self, *args, run_id: str, events: bool, max_children: int, **options) -> None:
        try:
            roots = store.span_tree(run_id)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not roots:
            raise CommandError(
                f"no trace events stored for run {run_id!r}; check the id with "
                "`python manage.py frlm_runs`, and that the recorder is running"
            )
        if events:
            for ev in store.read_events(run_id):
                self.stdout.write(json.dumps(ev, default=str))
            return
        self.stdout.write(store.format_span_tree(roots, max_children=max_children))
