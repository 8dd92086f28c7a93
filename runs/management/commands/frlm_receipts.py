from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runs.receipts import format_report, receipts_verify


class Command(BaseCommand):
    help = (
        "Check a run's receipts: every worker signature, every conductor countersignature "
        "and every link of the chain. Prints OK with the count, or names the first broken "
        "link and exits non-zero."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        verify = actions.add_parser("verify", help="check the receipt chain of one run")
        verify.add_argument("run_id")
        verify.add_argument(
            "--json", dest="as_json", action="store_true", help="print the report as JSON"
        )

    def handle(self, *args: Any, action: str, run_id: str, as_json: bool, **options: Any) -> None:
        """1. read the run's Receipt.Emit events and check the chain (a malformed id or a
        run with no trace is a one-line error), 2. print the report, 3. fail when broken."""
        try:
            report = receipts_verify(run_id)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(report, indent=2) if as_json else format_report(report))
        if not report["ok"]:
            broken = report["broken"]
            assert broken is not None
            raise CommandError(
                f"receipt chain of run {run_id} broken at receipt {broken['position']}: "
                f"{broken['problem']}",
                returncode=2,
            )
