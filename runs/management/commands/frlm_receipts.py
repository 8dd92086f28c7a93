from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand
from runs.trust.receipts import conductor_public_key, format_report, receipts_verify
from workers import keys

# A chain found broken: apart from 2, a usage error, and 1, a run or key that cannot be
# checked, so a script can tell them apart (it was 2, a review).
BROKEN_EXIT = 3


class Command(FrlmCommand):
    help = (
        "Check a run's receipts: every worker signature against the registry's keys, every "
        "conductor countersignature against the conductor's key, every link of the chain, "
        "and its count and hash against what the run recorded. Prints OK with the count, or "
        "names the first broken link and exits 3."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        verify = actions.add_parser("verify", help="check the receipt chain of one run")
        verify.add_argument("run_id", help="the run whose receipts to check (see frlm_runs)")
        verify.add_argument(
            "--json", dest="as_json", action="store_true", help="print the report as JSON"
        )
        verify.add_argument(
            "--conductor-key",
            metavar="B64",
            help="the conductor's public key (base64) when checking on another machine; "
            "default: the key of FRLM_CONDUCTOR_KEY_FILE here (without either, nothing is "
            "checked)",
        )
        key = actions.add_parser(
            "key", help="print the conductor's public key, for --conductor-key elsewhere"
        )
        key.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help='print {"conductor_key": ..., "key_file": ...} as JSON',
        )

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "key":
            self.key(options["as_json"])
        else:
            self.verify(options["run_id"], options["as_json"], options["conductor_key"])

    def key(self, as_json: bool) -> None:
        public = conductor_public_key()
        if public is None:
            raise CommandError(
                f"no conductor key file here ({settings.FRLM_CONDUCTOR_KEY_FILE}): the "
                "conductor makes it when it first countersigns; run this where the conductor "
                "runs, with its FRLM_CONDUCTOR_KEY_FILE"
            )
        if as_json:
            self.print_json(
                {"conductor_key": public, "key_file": str(settings.FRLM_CONDUCTOR_KEY_FILE)}
            )
        else:
            self.stdout.write(public)

    def verify(self, run_id: str, as_json: bool, conductor_key: str | None) -> None:
        """1. read the run's Receipt.Emit events and what the run recorded of its chain, and
        check the chain (a malformed id or key, a run with no trace or no recorded chain, or
        no conductor key to check with is a one-line error, exit 1), 2. print the report,
        3. exit BROKEN_EXIT (3) when the chain is broken."""
        try:
            if conductor_key is not None:
                keys.public_from_b64(conductor_key)
            report = receipts_verify(run_id, conductor_key=conductor_key)
        except ValueError as exc:
            raise CommandError(
                f"--conductor-key: {exc}" if isinstance(exc, keys.BadKey) else str(exc)
            ) from exc
        if as_json:
            self.print_json(report)
        else:
            self.stdout.write(format_report(report))
        if not report["ok"]:
            broken = report["broken"]
            assert broken is not None
            raise CommandError(
                f"receipt chain of run {run_id} broken at receipt {broken['position']}: "
                f"{broken['problem']}",
                returncode=BROKEN_EXIT,
            )
