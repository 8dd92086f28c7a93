"""The report built from real small runs: every cell of every table is a number computed
from the stored runs, the figures hold data, and what a model wrote is escaped."""

from __future__ import annotations

import json
import math

import pytest

from runs.experiments.report import ReportInputError, build_report
from tests.experiments.conftest import BASELINES, HOSTILE

pytestmark = pytest.mark.timeout(900)


def _numbers(table: dict) -> list:
    return [v for row in table["rows"] for v in row["values"].values()]


def test_it_fills_every_table_and_figure_from_the_stored_runs(experiment_dir):
    path = build_report(experiment_dir)
    report = json.loads((experiment_dir / "report.json").read_text())
    tables = {t["key"]: t for t in report["tables"]}
    assert list(tables) == ["latency", "cost", "success", "detection"]
    for table in tables.values():
        assert table["rows"], f"{table['key']} has no rows: {table['note']}"
        for row in table["rows"]:
            assert list(row["values"]) == table["columns"]
        for value in _numbers(table):
            assert isinstance(value, int | float) and not isinstance(value, bool)
            assert math.isfinite(value)
    rows = [json.loads(line) for line in (experiment_dir / "runs.jsonl").read_text().splitlines()]
    # Numbers computed from the runs, checked against the rows themselves.
    latency = {r["label"]["baseline"]: r["values"] for r in tables["latency"]["rows"]}
    assert set(latency) == set(BASELINES)
    seq = sorted(r["wall_s"] for r in rows if r["baseline"] == "rlm_sequential")
    assert latency["rlm_sequential"]["p50_s"] == pytest.approx(sum(seq) / len(seq))
    assert latency["rlm_sequential"]["p50_ratio"] == pytest.approx(1.0)
    success = {r["label"]["baseline"]: r["values"] for r in tables["success"]["rows"]}
    for baseline, values in success.items():
        mine = [r for r in rows if r["baseline"] == baseline]
        assert values["solved"] == sum(r["correct"] for r in mine)
        assert values["ci_low"] <= values["success_rate"] <= values["ci_high"]
    # The redundant tier outvotes the lying half of the swarm: detected, honest ones kept.
    detection = {
        (r["label"]["baseline"], r["label"]["workers"]): r["values"]
        for r in tables["detection"]["rows"]
    }
    redundant = detection[("fed_redundancy", "lying")]
    assert redundant["judged"] > 0 and redundant["detection_rate"] > 0.5
    assert redundant["false_positive_rate"] < 0.5
    for key in ("rail", "budget", "routing", "diff"):
        assert report["figures"][key]["data"], f"figure {key} is empty"
    rail = {t["name"]: t for t in report["figures"]["rail"]["data"]}
    assert set(rail) == {"root", "model", "queue", "verify", "other"}
    text = path.read_text()
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in text
    assert "Plotly.newPlot" in text and "frlm_experiment" in text
    assert 'src="http' not in text  # self-contained: nothing loaded from the network


def test_it_names_a_missing_file_in_one_line(tmp_path):
    with pytest.raises(ReportInputError, match="suite.json is missing: run frlm_experiment"):
        build_report(tmp_path)
