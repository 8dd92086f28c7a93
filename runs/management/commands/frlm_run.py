from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, assignment, number, whole
from runs.program_templates import PROGRAM_TEMPLATES
from runs.taskgen import DEFAULT_SEED, DEFAULT_TOKENS, MAX_TOKENS, MIN_TOKENS, TASKS

if TYPE_CHECKING:
    from runs.models import Run

# What a run needs (Redis, the services, the models' clients) is imported in `handle`:
# `--help` and a refused argument answer without loading it
# (tests/frlm_web/test_command_startup.py).


class Command(FrlmCommand):
    help = (
        "Run an FRLM run and wait for its answer: a generated task (--task sniah --tokens N "
        "--seed S) or your own question over a file or folder (--question ... --context PATH)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--task", choices=sorted(TASKS), help="a generated benchmark task")
        parser.add_argument(
            "--tokens",
            type=whole(MIN_TOKENS, MAX_TOKENS),
            default=None,
            help=f"size of the generated task in tokens (default {DEFAULT_TOKENS})",
        )
        parser.add_argument(
            "--seed",
            type=whole(0),
            default=None,
            help=f"seed of the generated task (default {DEFAULT_SEED})",
        )
        parser.add_argument("--question", default="", help="your question")
        parser.add_argument("--context", default=None, help="a text file or a folder of them")
        parser.add_argument("--venues", default="local", help="comma-separated venue names")
        parser.add_argument("--root-model", default="sim", help="sim, openai or openai:MODEL")
        parser.add_argument("--worker-model", default="sim", help="sim, openai or openai:MODEL")
        parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint URL")
        parser.add_argument("--model", default=None, help="model name at --base-url")
        parser.add_argument(
            "--policy",
            action="append",
            type=assignment,
            default=[],
            metavar="KEY=VALUE",
            help="a policy setting, e.g. --policy quorum=0.9 (repeatable)",
        )
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
            help="print the run id and return (with --json, the queued run as JSON)",
        )
        parser.add_argument(
            "--program",
            default="",
            choices=["", *PROGRAM_TEMPLATES],
            metavar="{" + ",".join(PROGRAM_TEMPLATES) + "}",
            help="run the question with a program template (a program pattern); none by default",
        )

    def handle(self, *args, **o: Any) -> None:
        from runs.cli import format_summary, summarise, watch
        from runs.models import Run

        run = self.create(o)
        if o["no_wait"]:
            # With --json, the run as it stands (queued): a script reads one JSON object
            # either way (a bare id is not JSON; a review).
            self.stdout.write(json.dumps(summarise(run)) if o["json"] else run.id)
            return
        run = watch(run, o["timeout"], show=not o["json"])
        summary = summarise(run)
        if o["json"]:
            self.stdout.write(json.dumps(summary, indent=None))
        else:
            self.stdout.write(format_summary(summary))
        if run.status != Run.Status.SUCCEEDED:
            sys.exit(1)

    def create(self, o: dict[str, Any]) -> Run:
        from runs.cli import launch, refuse_unless_ready
        from runs.engine.policy import PolicyError, parse_assignments
        from runs.services import ContextSpec, RunInputError, launch_notes, run_create
        from workers.backends import command_models

        refuse_unless_ready()
        if o["task"] and o["context"]:
            raise CommandError("give either --task or --context, not both")
        if not o["task"] and not o["context"]:
            raise CommandError(
                "give a context: --context PATH (a file or folder) or --task "
                + "|".join(sorted(TASKS))
            )
        if o["context"] and (o["tokens"] is not None or o["seed"] is not None):
            raise CommandError(
                "--tokens and --seed shape a generated --task; a --context is read as it is: "
                "drop them"
            )
        try:
            root, worker = command_models(
                o["root_model"], o["worker_model"], base_url=o["base_url"], model=o["model"]
            )
            policy = parse_assignments(o["policy"])
        except (ValueError, PolicyError) as exc:
            raise CommandError(str(exc)) from exc
        if o["task"]:
            tokens = DEFAULT_TOKENS if o["tokens"] is None else o["tokens"]
            seed = DEFAULT_SEED if o["seed"] is None else o["seed"]
            context = ContextSpec(task=o["task"], tokens=tokens, seed=seed)
        else:
            context = ContextSpec(path=o["context"])
        venues = [v.strip() for v in o["venues"].split(",") if v.strip()]
        try:
            run = run_create(
                question=o["question"],
                context=context,
                policy=policy,
                root_model=root,
                worker_model=worker,
                venues=venues,
                program=o["program"],
            )
        except RunInputError as exc:
            raise CommandError("\n".join(f"--{k}: {v}" for k, v in exc.errors.items())) from exc
        launch(run)
        for note in launch_notes(run):
            self.stderr.write(f"note: {note}")  # stdout may be --json's
        return run
