from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from frlm_web import presence
from frlm_web.redis_client import get_redis, redis_available
from runs.management.commands.frlm_conductor import CONDUCTOR_GROUP
from runs.models import Run
from runs.policy import PolicyError, parse_assignments
from runs.progress import read_progress
from runs.services import ContextSpec, RunInputError, run_cancel, run_create, run_launch
from runs.taskgen import TASKS
from workers.backends import model_spec


class Command(BaseCommand):
    help = (
        "Run an FRLM run and wait for its answer: a generated task (--task sniah --tokens N "
        "--seed S) or your own question over a file or folder (--question ... --context PATH)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--task", choices=sorted(TASKS), help="a generated benchmark task")
        parser.add_argument(
            "--tokens", type=int, default=100_000, help="size of the generated task"
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the generated task")
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
            default=[],
            metavar="KEY=VALUE",
            help="a policy setting, e.g. --policy quorum=0.9 (repeatable)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the result as one JSON object"
        )
        parser.add_argument(
            "--timeout", type=float, default=3600, help="seconds to wait for the answer"
        )
        parser.add_argument("--no-wait", action="store_true", help="print the run id and return")

    def handle(self, *args, **o: Any) -> None:
        run = self.create(o)
        if o["no_wait"]:
            self.stdout.write(run.id)
            return
        try:
            run = self.wait(run, o["timeout"], show=not o["json"])
        except KeyboardInterrupt:
            run_cancel(run)
            raise CommandError(f"cancelled run {run.id}") from None
        summary = summarise(run)
        if o["json"]:
            self.stdout.write(json.dumps(summary, indent=None))
        else:
            self.stdout.write(format_summary(summary))
        if run.status != Run.Status.SUCCEEDED:
            sys.exit(1)

    def create(self, o: dict[str, Any]) -> Run:
        if not redis_available():
            raise CommandError("Redis is not reachable at FRLM_REDIS_URL; start it with `make up`")
        if not presence.alive(get_redis(), CONDUCTOR_GROUP):
            raise CommandError(
                "no conductor is running; start everything with `make up` (or "
                "`python manage.py frlm_conductor`)"
            )
        if o["task"] and o["context"]:
            raise CommandError("give either --task or --context, not both")
        if not o["task"] and not o["context"]:
            raise CommandError("give a context: --context PATH (a file or folder) or --task sniah")
        try:
            root = model_spec(
                o["root_model"], role="root", base_url=o["base_url"], model=o["model"]
            )
            worker = model_spec(
                o["worker_model"], role="worker", base_url=o["base_url"], model=o["model"]
            )
            policy = parse_assignments(o["policy"])
        except (ValueError, PolicyError) as exc:
            raise CommandError(str(exc)) from exc
        if o["task"]:
            context = ContextSpec(task=o["task"], tokens=o["tokens"], seed=o["seed"])
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
            )
        except RunInputError as exc:
            raise CommandError("\n".join(f"--{k}: {v}" for k, v in exc.errors.items())) from exc
        run_launch(run)
        return run

    def wait(self, run: Run, timeout: float, *, show: bool) -> Run:
        client = get_redis()
        bar = ProgressBar(sys.stderr) if show else None
        deadline = time.monotonic() + timeout
        while True:
            run.refresh_from_db()
            if run.done:
                if bar:
                    bar.close(read_progress(client, run.id), run.status)
                return run
            if time.monotonic() > deadline:
                run_cancel(run)
                raise CommandError(
                    f"run {run.id} gave no answer within {timeout:.0f} s; cancelled it"
                )
            if bar:
                bar.draw(read_progress(client, run.id), run.status)
            time.sleep(0.2)


class ProgressBar:
    """One line, redrawn in place on a terminal; a line every few seconds elsewhere."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last_line = 0.0

    def render(self, progress: dict[str, str], status: str) -> str:
        total = int(progress.get("subqueries", 0))
        done = int(progress.get("settled", 0))
        width = 24
        filled = int(width * done / total) if total else 0
        bar = "#" * filled + "-" * (width - filled)
        phase = progress.get("phase", status)
        return (
            f"[{bar}] {done}/{total} sub-queries  {phase:<10}  "
            f"{int(progress.get('tokens', 0)):>9} tok  ${float(progress.get('cost', 0)):.4f}  "
            f"{time.monotonic() - self.started:6.1f}s"
        )

    def draw(self, progress: dict[str, str], status: str) -> None:
        line = self.render(progress, status)
        if self.tty:
            self.stream.write("\r" + line)
            self.stream.flush()
        elif time.monotonic() - self.last_line > 5:
            self.stream.write(line + "\n")
            self.last_line = time.monotonic()

    def close(self, progress: dict[str, str], status: str) -> None:
        self.stream.write(("\r" if self.tty else "") + self.render(progress, status) + "\n")
        self.stream.flush()


def summarise(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "status": run.status,
        "question": run.question,
        "answer": run.answer,
        "expected_answer": run.expected_answer or None,
        "correct": run.correct,
        "error": run.error or None,
        "wall_s": round((run.wall_ms or 0) / 1000, 3),
        "turns": run.turns,
        "subqueries": run.subqueries,
        "subqueries_failed": run.subqueries_failed,
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
        "cost_usd": round(run.cost, 6),
        "venues": run.venues,
        "root_model": run.root_model.get("model"),
        "worker_model": run.worker_model.get("model"),
        "simulated": run.root_model.get("kind") == "sim" or run.worker_model.get("kind") == "sim",
        "isolation": run.isolation,
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"run        {s['run_id']}  ({s['status']})"]
    if s["error"]:
        lines.append(f"error      {s['error']}")
    lines.append(f"answer     {s['answer'] or '-'}")
    if s["expected_answer"] is not None:
        verdict = {True: "yes", False: "NO", None: "-"}[s["correct"]]
        lines.append(f"expected   {s['expected_answer']}   match: {verdict}")
    lines.append(
        f"wall       {s['wall_s']:.2f} s   turns {s['turns']}   sub-queries {s['subqueries']} "
        f"({s['subqueries_failed']} failed)"
    )
    lines.append(
        f"tokens     {s['tokens_in']} in / {s['tokens_out']} out   cost ${s['cost_usd']:.4f}"
        + ("  (simulated model: nominal prices)" if s["simulated"] else "")
    )
    lines.append(
        f"models     root {s['root_model']}, workers {s['worker_model']} "
        f"on {', '.join(s['venues'])}"
    )
    lines.append(f"sandbox    {s['isolation'] or '-'}")
    lines.append(f"trace      python manage.py frlm_trace {s['run_id']}")
    return "\n".join(lines)
