from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, assignment, number, whole


class Command(FrlmCommand):
    # Django's system checks import every URL module and view: a second before a replay
    # can start, for checks that the web server and the conductor run themselves.
    requires_system_checks: list[str] = []
    help = (
        "Re-execute a run from its cassette (its recorded model replies): all of it, with no "
        "model calls, or its first K root turns and live after them with a changed policy or "
        "model (--from-turn K --set policy.KEY=VALUE)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", help="the run to replay (see frlm_runs)")
        parser.add_argument(
            "--from-turn",
            type=whole(0),
            default=None,
            metavar="K",
            help="replay root turns 1..K from the cassette, then go on live",
        )
        parser.add_argument(
            "--set",
            action="append",
            type=assignment,
            default=[],
            metavar="policy.KEY=VALUE",
            help="change a policy setting for the live part (repeatable)",
        )
        parser.add_argument("--root-model", default=None, help="sim, openai or openai:MODEL")
        parser.add_argument("--worker-model", default=None, help="sim, openai or openai:MODEL")
        parser.add_argument(
            "--base-url", default=None, help="OpenAI-compatible endpoint URL for the live part"
        )
        parser.add_argument("--model", default=None, help="model name at --base-url")
        parser.add_argument(
            "--json", action="store_true", help="print the result as one JSON object"
        )
        parser.add_argument(
            "--timeout",
            type=number(0, above=True),
            default=3600,
            help="seconds to wait for the answer (default 3600)",
        )
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="print the new run's id and return (with --json, the queued run as JSON)",
        )

    def handle(self, *args, run_id: str, **o: Any) -> None:
        # Imported here, not with the module: `--help` and a bad flag answer at once.
        from runs.cli import format_summary, launch, refuse_unless_ready, summarise, watch
        from runs.engine.policy import PolicyError, parse_assignments
        from runs.models import Run
        from runs.services import RunInputError, run_replay
        from workers.backends import command_models

        try:
            source = Run.objects.get(id=run_id)
        except Run.DoesNotExist:
            raise CommandError(
                f"no run {run_id!r}; `python manage.py frlm_runs` lists them"
            ) from None
        refuse_unless_ready()
        try:
            changes = parse_assignments(o["set"], "--set")
            root, worker = command_models(
                o["root_model"] or None,
                o["worker_model"] or None,
                base_url=o["base_url"],
                model=o["model"],
            )
            run = run_replay(
                source,
                from_turn=o["from_turn"],
                policy_changes=changes,
                root_model=root,
                worker_model=worker,
            )
        except RunInputError as exc:
            # Each problem under the option that sets it (the service's field names meant
            # nothing on the command line; a review).
            options = {"from_turn": "--from-turn", "policy": "--set"}
            raise CommandError(
                "\n".join(
                    f"{options[key]}: {message}" if key in options else message
                    for key, message in exc.errors.items()
                )
            ) from exc
        except (ValueError, PolicyError) as exc:
            raise CommandError(str(exc)) from exc
        launch(run)
        if o["no_wait"]:
            # With --json, the run as it stands (queued): a script reads one JSON object
            # either way (a bare id is not JSON; a review).
            self.stdout.write(json.dumps(summarise(run)) if o["json"] else run.id)
            return
        run = watch(run, o["timeout"], show=not o["json"])
        summary = summarise(run)
        self.stdout.write(json.dumps(summary) if o["json"] else format_summary(summary))
        if run.status != Run.Status.SUCCEEDED:
            sys.exit(1)
