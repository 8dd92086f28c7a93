from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, assignment
from frlm_web.stack import StackError
from runs.experiments.runner import run_suite
from runs.experiments.suite import BUILT_IN, SuiteError, load_suite
from runs.experiments.tune import parse_tune


class Command(FrlmCommand):
    help = (
        "Run an experiment suite (tasks x baselines x seeds) on the federation it describes, "
        "each run an ordinary run, and write its data and report.html to --output."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--suite",
            default="small",
            help=f"a built-in suite ({', '.join(BUILT_IN)}) or a .json/.toml suite file",
        )
        parser.add_argument("--output", required=True, help="the folder to write into")
        parser.add_argument(
            "--endpoint", default=None, help="an OpenAI-compatible URL: the real model"
        )
        parser.add_argument(
            "--tune",
            action="append",
            default=[],
            type=assignment,  # its form is argparse's to refuse: exit 2, as frlm_run's --policy
            metavar="KEY=v1,v2",
            help="a policy key and the values to try on the suite's tune_baseline (repeatable)",
        )
        parser.add_argument("--json", action="store_true", help="print the outcome as JSON")

    def handle(self, *args: Any, **o: Any) -> None:
        """1. load the suite and the tuning values, 2. run it with a progress line,
        3. build the report, 4. say where everything is."""
        try:
            suite = load_suite(o["suite"])
            tune = parse_tune(o["tune"])
        except (SuiteError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        out = Path(o["output"]).expanduser()
        if out.exists() and not out.is_dir():
            raise CommandError(f"--output {out} is a file; give a folder")
        show = not o["json"]
        # SIGTERM unwinds like Ctrl-C, so the venues (and stack) the suite started stop too.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            run_suite(
                suite,
                out,
                progress=self._progress if show else None,
                endpoint=o["endpoint"],
                tune=tune or None,
            )
        except (SuiteError, ValueError, StackError) as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt:
            raise CommandError(
                f"interrupted; the runs so far are in {out / 'runs.jsonl'}"
            ) from None
        if show:
            sys.stderr.write("\n")
        from runs.experiments.report import build_report

        report = build_report(out)
        outcome = {
            "suite": suite.name,
            "output": str(out),
            "report": str(report),
            "runs": sum(1 for _ in (out / "runs.jsonl").open()),
        }
        if o["json"]:
            self.print_json(outcome)
        else:
            self.stdout.write(f"{outcome['runs']} runs in {out}; report: {report}")

    def _progress(self, info: dict[str, Any]) -> None:
        mark = "ok " if info["correct"] else "bad"
        tune = f" tune step {info['tune_step']}" if info.get("tune_step") else ""
        line = (
            f"[{info['done']}/{info['total']}] {mark} {info['baseline']:<16} "
            f"{info['task_id']:<20} {info['wall_s']:6.2f}s {info['status']}{tune}"
        )
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
