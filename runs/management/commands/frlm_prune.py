from __future__ import annotations

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


class Command(FrlmCommand):
    help = (
        "Remove the trace events of runs that finished longer ago than --older-than, the "
        "copies of their contexts FRLM wrote (a generated task's, an upload's) that no other "
        "run reads, and the stored prompts and replies nothing references any more. Run rows "
        "stay; such a run can no longer be replayed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--older-than", required=True, help="an age: 30d, 12h or 90m")
        parser.add_argument("--dry-run", action="store_true", help="say what would go")
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print what was (or would be) removed as one JSON object",
        )

    def handle(self, *args, older_than: str, dry_run: bool, as_json: bool, **options) -> None:
        match = _AGE.match(older_than.strip())
        if not match:
            raise CommandError(
                f"--older-than takes an age like 30d, 12h or 90m, not {older_than!r}"
            )
        count, unit = int(match.group(1)), match.group(2)
        if count > _MAX_AGE / timedelta(**{_UNITS[unit]: 1}):
            raise CommandError(
                f"--older-than may be at most 36500d (a century, 876000h, 52560000m), "
                f"not {older_than!r}"
            )
        age = timedelta(**{_UNITS[unit]: count})
        cutoff = timezone.now() - age
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
            f"({result.bytes / 1e6:.1f} MB), and {len(copies.paths)} context copie(s) "
            f"({copies.bytes / 1e6:.1f} MB)"
        )
