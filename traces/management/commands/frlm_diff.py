from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from traces.diff import format_trace_diff, run_diff


class Command(BaseCommand):
    help = (
        "Compare two runs' traces: what ran on one side only, what changed per node, and "
        "the first orchestration decision where they diverge."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("run_a")
        parser.add_argument("run_b")
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="print the whole diff as JSON"
        )
        parser.add_argument("--top", type=int, default=10, help="how many per-node deltas")

    def handle(
        self, *args: Any, run_a: str, run_b: str, as_json: bool, top: int, **options: Any
    ) -> None:
        """1. load and diff both traces (a missing or span-less trace is a one-line error),
        2. print the JSON or the summary."""
        try:
            diff = run_diff(run_a, run_b)
        except ValueError as exc:  # a malformed id, no stored trace, nothing to compare
            raise CommandError(str(exc)) from exc
        if as_json:
            self.stdout.write(json.dumps(diff, indent=2))
            return
        self.stdout.write(format_trace_diff(diff, top=top))
