from __future__ import annotations

from argparse import ArgumentParser
from decimal import Decimal
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, whole
from traces.diff import format_trace_diff, run_diff


class Command(FrlmCommand):
    # Django's system checks import every URL module and view (a second, more than the
    # diff itself takes); a read of the trace store needs none of them.
    requires_system_checks: list[str] = []
    help = (
        "Compare two runs' traces: what ran on one side only, what changed per node, and "
        "the first orchestration decision where they diverge."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("run_a", help="the first run's id (see frlm_runs)")
        parser.add_argument("run_b", help="the second run's id")
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="print the whole diff as JSON"
        )
        parser.add_argument(
            "--top", type=whole(1), default=10, help="how many per-node deltas (default 10)"
        )

    def handle(
        self, *args: Any, run_a: str, run_b: str, as_json: bool, top: int, **options: Any
    ) -> None:
        """1. load and diff both traces (a missing or span-less trace is a one-line error),
        2. print the JSON or the summary."""
        try:
            diff = run_diff(run_a, run_b)
        except ValueError as exc:  # a malformed id, no stored trace, nothing to compare
            raise CommandError(
                f"{exc}; check the ids with `python manage.py frlm_runs`, and that the "
                "recorder is running"
            ) from exc
        if as_json:
            self.print_json(_money_exact(diff))
            return
        self.stdout.write(format_trace_diff(diff, top=top))


def _money_exact(data: Any) -> Any:
    """The diff with every `cost` (a node's, or its a/b/delta pair) as a Decimal, which
    print_json writes as a decimal string, as every command's --json writes money: the
    floats the page draws from printed as 1.71e-05 (a review). They are the diff's float
    sums, rounded to 8 places (traces/diff/walk.py), not the receipts' exact amounts."""
    if isinstance(data, dict):
        return {
            key: _cost(value) if key == "cost" else _money_exact(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [_money_exact(item) for item in data]
    return data


def _cost(value: Any) -> Any:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {key: _cost(item) for key, item in value.items()}
    return value
