from __future__ import annotations

import argparse
import re
from datetime import timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from frlm_web.commands import FrlmCommand
from runs import retention
from runs.models import Run
from traces.prune import prune

_AGE = re.compile(r"^(\d+)([dhm])\Z")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}
# The longest age taken: a run older than a century cannot exist, and much longer ages
# overflow Python's dates.
_MAX_AGE = timedelta(days=36500)


def age(text: str) -> timedelta:
    """An argparse type: an age such as 30d, 12h or 90m, at most a century."""
    match = _AGE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"takes an age like 30d, 12h or 90m, not {text[:100]!r}")
    count, unit = int(match.group(1)), match.group(2)
    if count > _MAX_AGE / timedelta(**{_UNITS[unit]: 1}):
        raise argparse.ArgumentTypeError(
            f"takes an age of at most 36500d (a century, 876000h, 52560000m), not {text!r}"
        )
    return timedelta(**{_UNITS[unit]: count})


age.__name__ = "age"


class Command(FrlmCommand):
    help = (
        "Remove the trace events of runs that finished longer ago than --older-than, the "
        "copies of their contexts FRLM wrote (a generated task's, an upload's) that no other "
        "run reads, and the stored prompts and replies nothing references any more. Run rows "
        "stay; such a run can no longer be replayed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--older-than", required=True, type=age, help="an age: 30d, 12h or 90m")
        parser.add_argument("--dry-run", action="store_true", help="say what would go")
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print what was (or would be) removed as one JSON object",
        )

    def handle(
        self, *args, older_than: timedelta | str, dry_run: bool, as_json: bool, **options
    ) -> None:
        if isinstance(older_than, str):  # call_command(older_than="30d") passes it unparsed
            try:
                older_than = age(older_than)
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"--older-than {exc}") from None
        cutoff = timezone.now() - older_than
        old = list(Run.objects.filter(finished__lt=cutoff).values_list("id", flat=True))
        copies = retention.context_copies(old)
        result = prune(old, dry_run=dry_run)
        if not dry_run:
            retention.remove(copies)
        if as_json:
            self.print_json(
                {
                    "dry_run": dry_run,
                    "cutoff": cutoff,
                    "runs": list(result.runs),
                    "blobs": result.blobs,
                    "bytes": result.bytes,
                    "contexts": len(copies.paths),
                    "context_bytes": copies.bytes,
                }
            )
            return
        verb = "would remove" if dry_run else "removed"
        self.stdout.write(
            f"{verb} the events of {len(result.runs)} run(s) finished before "
            f"{cutoff:%Y-%m-%d %H:%M} UTC, and {result.blobs} unreferenced blob(s) "
            f"({result.bytes / 1e6:.1f} MB), and {len(copies.paths)} context "
            f"cop{'y' if len(copies.paths) == 1 else 'ies'} "
            f"({copies.bytes / 1e6:.1f} MB)"
        )
