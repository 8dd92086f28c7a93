from __future__ import annotations

from django.core.management.base import BaseCommand

from runs.models import Run


class Command(BaseCommand):
    help = "List recent runs."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--limit", type=int, default=20)

    def handle(self, *args, limit: int, **options) -> None:
        for run in Run.objects.all()[:limit]:
            wall = f"{run.wall_ms / 1000:.1f}s" if run.wall_ms else "-"
            self.stdout.write(
                f"{run.id}  {run.status:<9} {wall:>7}  {run.subqueries:>5} sq  "
                f"{run.question[:50]!r} -> {run.answer[:40]!r}"
            )
