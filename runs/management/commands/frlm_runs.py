from __future__ import annotations

from typing import Any

from frlm_web.commands import FrlmCommand, whole
from runs.models import Run


class Command(FrlmCommand):
    help = "List recent runs, newest first."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--limit", type=whole(1), default=20, help="how many runs to list (default 20)"
        )
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print the runs as a JSON array (cost as an exact decimal string)",
        )

    def handle(self, *args: Any, limit: int, as_json: bool, **options: Any) -> None:
        runs = list(Run.objects.all()[:limit])
        if as_json:
            self.print_json([_row(run) for run in runs])
            return
        for run in runs:
            wall = f"{run.wall_ms / 1000:.1f}s" if run.wall_ms else "-"
            self.stdout.write(
                f"{run.id}  {run.status:<9} {wall:>7}  {run.subqueries:>5} sq  "
                f"{run.question[:50]!r} -> {run.answer[:40]!r}"
            )


def _row(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "status": run.status,
        "created": run.created,
        "finished": run.finished,
        "wall_s": round(run.wall_ms / 1000, 3) if run.wall_ms else None,
        "subqueries": run.subqueries,
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
        "cost_usd": run.cost,
        "question": run.question,
        "answer": run.answer,
    }
