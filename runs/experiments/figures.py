"""The report's four figures as Plotly figures, drawn from the stored traces. Every label
that a worker or a model chose (worker names, answers) is HTML-escaped first: Plotly reads
a few tags in its text."""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from runs.experiments import stats
from runs.experiments.measures import (
    GRID,
    RAIL,
    RunTrace,
    budget_curve,
    dishonest_workers,
    rail_ms,
    routing_decisions,
    worker_names,
)
from runs.experiments.tables import by_baseline
from traces.diff import TraceDiffError, run_diff, top_deltas

LAYOUT = {"template": "plotly_dark", "height": 420, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}


def rail_figure(rows: list[dict[str, Any]], traces: dict[str, RunTrace]) -> go.Figure:
    """Figure 1: mean wall clock per baseline, cut into root turns, workers' model calls,
    jobs waiting for their worker, verification copies and the rest."""
    means: dict[str, dict[str, float]] = {}
    for baseline, group in by_baseline(rows).items():
        rails = [r for r in (rail_ms(traces[row["run_id"]]) for row in group) if r]
        if rails:
            means[baseline] = {k: stats.mean([r[k] for r in rails]) / 1000 for k in RAIL}
    fig = go.Figure()
    for part in RAIL:
        fig.add_bar(
            name=part,
            y=list(means),
            x=[means[b][part] for b in means],
            orientation="h",
        )
    fig.update_layout(
        title="Figure 1. Latency breakdown (mean seconds per run)",
        barmode="stack",
        xaxis_title="seconds",
        **LAYOUT,
    )
    return fig


def budget_figure(rows: list[dict[str, Any]], traces: dict[str, RunTrace]) -> go.Figure:
    """Figure 2: the share of its budget a run had spent through its wall clock, the mean
    over each baseline's runs (of the cap when the policy set one, else of the run's
    final spending)."""
    fig = go.Figure()
    xs = [i / (GRID - 1) for i in range(GRID)]
    for baseline, group in by_baseline(rows).items():
        curves = []
        for row in group:
            cap = (row.get("policy") or {}).get("budget_usd")
            curve = budget_curve(traces[row["run_id"]], float(cap) if cap else None)
            if curve:
                curves.append(curve)
        if curves:
            ys = [stats.mean([c[i] for c in curves]) for i in range(GRID)]
            fig.add_scatter(name=baseline, x=xs, y=ys, mode="lines")
    fig.update_layout(
        title="Figure 2. Budget utilisation over the run",
        xaxis_title="share of the run's wall clock",
        yaxis_title="share of budget spent",
        **LAYOUT,
    )
    return fig


def routing_figure(
    rows: list[dict[str, Any]], traces: dict[str, RunTrace], suite: dict[str, Any], base: Any
) -> go.Figure:
    """Figure 3: over the whole suite, the reputation the router saw for each worker at
    each dispatch (lines), and each worker's share of the dispatches per tenth of the
    suite's time (bars): how routing moves away from workers caught lying."""
    decisions = routing_decisions(traces[r["run_id"]] for r in rows if r["run_id"] in traces)
    fig = go.Figure()
    if not decisions:
        fig.update_layout(title="Figure 3. Reputation and routing (no dispatches)", **LAYOUT)
        return fig
    names = worker_names(d["worker"] for d in decisions)
    dishonest = dishonest_workers(suite, base)
    t0, t1 = decisions[0]["ts"], decisions[-1]["ts"]
    span = max(t1 - t0, 1)

    def label(worker: str) -> str:
        name = names.get(worker, worker)
        kind = dishonest.get(name)
        return html.escape(f"{name} ({kind})" if kind else name)

    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    bins: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for d in decisions:
        by_worker[d["worker"]].append(d)
        bins[min(9, int(10 * (d["ts"] - t0) / span))][d["worker"]] += 1
    for worker, seen in sorted(by_worker.items(), key=lambda kv: label(kv[0])):
        rep = [d for d in seen if d["reputation"] is not None]
        if rep:
            fig.add_scatter(
                name=f"reputation {label(worker)}",
                x=[(d["ts"] - t0) / 1e9 for d in rep],
                y=[float(d["reputation"]) for d in rep],
                mode="lines+markers",
                yaxis="y",
            )
        fig.add_bar(
            name=f"share {label(worker)}",
            x=[(b + 0.5) * span / 10 / 1e9 for b in sorted(bins)],
            y=[bins[b].get(worker, 0) / sum(bins[b].values()) for b in sorted(bins)],
            yaxis="y2",
            opacity=0.45,
        )
    fig.update_layout(
        title="Figure 3. Reputation evolution and routing shift",
        xaxis_title="seconds since the suite's first dispatch",
        yaxis={"title": "reputation", "range": [0, 1.05]},
        yaxis2={"title": "share of dispatches", "overlaying": "y", "side": "right"},
        barmode="stack",
        **LAYOUT,
    )
    return fig


def diff_pair(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two runs of one task to compare: the reference baseline against the first baseline
    that verifies (or any other), on the first task both ran; else two seeds of one."""
    by_task: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_task[row["task_id"]].setdefault(row["baseline"], row)
    wanted = ["fed_redundancy", "fed_validator", "fed_best_effort", "fed_premium", "local_only"]
    for task in by_task.values():
        first = task.get("rlm_sequential") or task.get("local_only")
        for other in wanted:
            if first and other in task and task[other] is not first:
                return first, task[other]
    for task in by_task.values():
        if len(task) >= 2:
            a, b = list(task.values())[:2]
            return a, b
    return None


def diff_figure(rows: list[dict[str, Any]]) -> tuple[go.Figure, dict[str, Any] | None]:
    """Figure 4: the trace diff of two runs of one task (traces.diff): the nodes whose
    time differs most, side by side, the first divergence marked; and the diff's summary
    for the text beside it."""
    fig = go.Figure()
    pair = diff_pair(rows)
    if pair is None:
        fig.update_layout(title="Figure 4. Trace diff (no two runs of one task)", **LAYOUT)
        return fig, None
    a, b = pair
    try:
        diff = run_diff(a["run_id"], b["run_id"])
    except TraceDiffError as exc:
        fig.update_layout(title="Figure 4. Trace diff", **LAYOUT)
        return fig, {"a": a, "b": b, "error": str(exc)}
    nodes = top_deltas(diff, 12)
    where = (diff["first_divergence"] or {}).get("path") or []
    names = [html.escape(" / ".join(n["path"][-2:])) for n in nodes]
    colours = ["#ff5c5c" if n["path"] == where else "#7aa2f7" for n in nodes]
    fig.add_bar(
        name=html.escape(f"A: {a['baseline']}"),
        y=names,
        x=[n["ms_total"]["a"] for n in nodes],
        orientation="h",
        marker_color="#9ece6a",
    )
    fig.add_bar(
        name=html.escape(f"B: {b['baseline']}"),
        y=names,
        x=[n["ms_total"]["b"] for n in nodes],
        orientation="h",
        marker_color=colours,
    )
    fig.update_layout(
        title=html.escape(
            f"Figure 4. Trace diff of {a['task_id']}: {a['baseline']} vs {b['baseline']}"
        ),
        barmode="group",
        xaxis_title="total ms in the node (red: where the runs first diverge)",
        **{**LAYOUT, "height": 520},
    )
    return fig, {"a": a, "b": b, "diff": diff}
