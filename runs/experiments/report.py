"""An experiment's report: `build_report(output_dir)` reads the suite's output directory
(suite.json, machine.json, runs.jsonl, tune.json when the policy loop ran) and the runs'
stored traces, and writes `report.json` (the tables and figures as data) and
`report.html`, one self-contained file (Plotly's script inlined once; works offline) with
Tables 1-4, Figures 1-4, the suite, the machine, the code version and the command that
reruns it. Everything a model or worker wrote is escaped by the template."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from django.template.loader import render_to_string
from plotly.offline import get_plotlyjs

from runs.experiments import figures, tables
from runs.experiments.measures import RunTrace, load_traces

REQUIRED = (
    "run_id",
    "task_id",
    "family",
    "baseline",
    "status",
    "correct",
    "score",
    "wall_s",
    "cost_usd",
    "tokens_in",
    "tokens_out",
)


class ReportInputError(ValueError):
    """An output directory the report cannot be built from; the message says what to do."""


def _json(path: Path, *, required: bool = True) -> Any:
    if not path.exists():
        if required:
            raise ReportInputError(f"{path} is missing: run frlm_experiment --output {path.parent}")
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ReportInputError(f"{path} is not valid JSON ({exc}); rerun the suite") from exc


def read_runs(path: Path) -> list[dict[str, Any]]:
    """The run rows, each checked for the fields the tables use."""
    if not path.exists():
        raise ReportInputError(f"{path} is missing: run frlm_experiment --output {path.parent}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ReportInputError(f"{path}:{n} is not JSON ({exc})") from exc
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ReportInputError(f"{path}:{n} lacks {', '.join(missing)}")
        rows.append(row)
    if not rows:
        raise ReportInputError(f"{path} holds no runs; the suite ran nothing")
    return rows


def model_seconds(traces: dict[str, RunTrace]) -> dict[str, float]:
    """Per run, the seconds its models spent: root turns and workers' model calls."""
    out = {}
    for run_id, trace in traces.items():
        out[run_id] = (
            sum(
                float(e["ms"] or 0)
                for e in trace.events
                if e["phase"] == "end" and e["name"] in ("Run.Decode", "SubQuery.Execute")
            )
            / 1000
        )
    return out


def rerun_command(suite: dict[str, Any], output_dir: Path) -> str:
    """The command that runs this suite again: a built-in by name, any other from its
    resolved suite.json (load_suite reads it back), into a new folder beside this one."""
    name = str(suite.get("name") or "")
    source = name if name in ("small", "default") else str(output_dir / "suite.json")
    argv = ["python", "manage.py", "frlm_experiment", "--suite", source]
    return shlex.join([*argv, "--output", f"{output_dir}-rerun"])


def _cell(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e12:
        return f"{int(value):,}"
    if abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:,.3f}"


def _shown(table: tables.Table) -> dict[str, Any]:
    return {
        **table,
        "cells": [
            {
                "label": [row["label"].get(k, "") for k in table["labels"]],
                "values": [_cell(row["values"][c]) for c in table["columns"]],
            }
            for row in table["rows"]
        ],
    }


def compute(output_dir: Path) -> dict[str, Any]:
    """Read the output directory and the traces; the tables and figures as data."""
    suite = _json(output_dir / "suite.json")
    machine = _json(output_dir / "machine.json")
    tune = _json(output_dir / "tune.json", required=False)
    every = read_runs(output_dir / "runs.jsonl")
    rows = [r for r in every if r.get("tune_step") is None] or every
    traces = load_traces([r["run_id"] for r in every])
    base = output_dir
    report_tables = [
        tables.latency_table(rows),
        tables.cost_table(rows, model_seconds(traces)),
        tables.success_table(rows),
        tables.detection_table(rows, traces, suite, base),
    ]
    diff_fig, diff_info = figures.diff_figure(rows)
    figs = {
        "rail": figures.rail_figure(rows, traces),
        "budget": figures.budget_figure(rows, traces),
        "routing": figures.routing_figure(rows, traces, suite, base),
        "diff": diff_fig,
    }
    return {
        "suite": suite,
        "machine": machine,
        "tune": tune,
        "rows": every,
        "tables": report_tables,
        "figures": figs,
        "diff": diff_info,
        "rerun": rerun_command(suite, output_dir),
    }


def build_report(output_dir: str | Path) -> Path:
    """Write report.json and report.html into `output_dir`; returns the HTML's path."""
    output_dir = Path(output_dir)
    data = compute(output_dir)
    figs = {key: json.loads(fig.to_json()) for key, fig in data["figures"].items()}
    (output_dir / "report.json").write_text(
        json.dumps(
            {
                "suite": data["suite"].get("name"),
                "tables": data["tables"],
                "figures": figs,
                "machine": data["machine"],
                "tune": data["tune"],
            },
            indent=1,
        )
    )
    diff = data["diff"] or {}
    html = render_to_string(
        "experiments/report.html",
        {
            "suite": data["suite"],
            "suite_json": json.dumps(data["suite"], indent=2),
            "machine": data["machine"],
            "tune": data["tune"],
            "rows": data["rows"],
            "tables": [_shown(t) for t in data["tables"]],
            "figures": [
                {"id": f"fig-{key}", "script_id": f"fig-{key}-data", "data": fig}
                for key, fig in figs.items()
            ],
            "diff": diff,
            "divergence": (diff.get("diff") or {}).get("first_divergence"),
            "rerun": data["rerun"],
            "plotly_js": get_plotlyjs(),
        },
    )
    path = output_dir / "report.html"
    path.write_text(html)
    return path
