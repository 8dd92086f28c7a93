from __future__ import annotations

import json
from dataclasses import fields
from decimal import Decimal
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, whole
from traces import store


class Command(FrlmCommand):
    # A read of the trace store: no system checks, and no app registry (frlm_web/light.py).
    requires_system_checks: list[str] = []
    help = "Print a run's span tree with timings (or its events as JSON lines)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", help="the run whose trace to print (see frlm_runs)")
        shown = parser.add_mutually_exclusive_group()
        shown.add_argument("--events", action="store_true", help="print raw events as JSON lines")
        shown.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print the span tree as one JSON object: {run_id, spans: [span with its "
            "children, instants and timings]}; cost as an exact decimal string",
        )
        parser.add_argument(
            "--max-children",
            type=whole(1),
            default=12,
            help="children shown under one span before the rest are summed up (default 12)",
        )

    def handle(
        self,
        *args,
        run_id: str,
        events: bool,
        as_json: bool,
        max_children: int,
        **options,
    ) -> None:
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
        if as_json:
            self.print_json({"run_id": run_id, "spans": [_node(root) for root in roots]})
            return
        self.stdout.write(store.format_span_tree(roots, max_children=max_children))


def _node(node: store.SpanNode) -> dict[str, Any]:
    """A span and its subtree as JSON: its fields as stored, its cost as the exact decimal
    its float spells (money is never a JSON float here, frlm_web/commands.py)."""
    data = {f.name: getattr(node, f.name) for f in fields(node) if f.name != "children"}
    if node.cost is not None:
        data["cost"] = Decimal(repr(node.cost))
    data["children"] = [_node(child) for child in node.children]
    return data
