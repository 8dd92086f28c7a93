"""The experiment runner: repository-QA answers computed from real code, suite files checked
with one-line errors, and the small suite run end to end on the real stack, each of its runs
an ordinary run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.experiments.suite import BASELINES, SuiteError, load_suite
from runs.taskgen import answer_score, make_task
from runs.taskgen.repoqa import load_module, make_repoqa, score_repoqa, stdlib_root

# colorsys.py, read by hand: its seven functions, and who calls what. rgb_to_hls and
# rgb_to_hsv call max() and min(); hls_to_rgb calls _v three times (one function: 1);
# hsv_to_rgb calls int(). Its constants are ONE_THIRD = 1.0/3.0 and the like: not
# literals, so no constant question can be asked of it.
COLORSYS_FUNCTIONS = {
    "rgb_to_yiq",
    "yiq_to_rgb",
    "rgb_to_hls",
    "hls_to_rgb",
    "_v",
    "rgb_to_hsv",
    "hsv_to_rgb",
}
COLORSYS_CALLS = {"max": 2, "min": 2, "_v": 1, "int": 1}

RECORD_KEYS = {
    "run_id",
    "task_id",
    "family",
    "size_tokens",
    "baseline",
    "seed",
    "tune_step",
    "policy",
    "status",
    "answer",
    "expected",
    "correct",
    "score",
    "wall_s",
    "cost_usd",
    "tokens_in",
    "tokens_out",
    "sub_queries",
    "failed_sub_queries",
}


def test_it_reads_colorsys_as_a_person_would():
    module = load_module(str(stdlib_root()), "colorsys.py")
    assert module.defined == COLORSYS_FUNCTIONS
    assert dict(module.calls) == COLORSYS_CALLS
    assert module.constants == ()


def test_it_reads_a_hex_constant_as_its_value():
    # wave.py: `WAVE_FORMAT_PCM = 0x0001`, assigned once at the top level.
    module = load_module(str(stdlib_root()), "wave.py")
    assert dict(module.constants)["WAVE_FORMAT_PCM"] == "1"


def test_it_asks_about_colorsys_with_answers_from_the_code(tmp_path: Path):
    shutil.copy(stdlib_root() / "colorsys.py", tmp_path / "colorsys.py")
    kinds = set()
    for seed in range(12):
        task = make_repoqa(2000, seed, root=tmp_path)
        kinds.add(task.kind)
        assert task.files == ("colorsys.py",)
        if task.kind == "defines":
            name = task.question.split("`")[1]
            assert name in COLORSYS_FUNCTIONS and task.expected_answer == "colorsys"
        else:
            assert task.kind == "calls"
            name = task.question.split("`")[1]
            assert task.expected_answer == str(COLORSYS_CALLS[name])
    assert kinds == {"defines", "calls"}
    written = tmp_path / "context.txt"
    task.write_context(written)
    text = written.read_text()
    assert text.startswith("##### file: colorsys.py (module colorsys) #####\n")
    assert (stdlib_root() / "colorsys.py").read_text() in text
    assert len(text) == task.context_chars


def test_it_draws_the_same_task_for_the_same_seed():
    first, again = make_task("repoqa", 8000, 3), make_task("repoqa", 8000, 3)
    assert (first.files, first.question, first.expected_answer) == (
        again.files,
        again.question,
        again.expected_answer,
    )
    assert first.context_chars <= 8000 * 4
    assert make_task("repoqa", 8000, 4).files != first.files


@pytest.mark.parametrize(
    ("expected", "answer", "score"),
    [
        ("colorsys", "`colorsys.py`", 1.0),
        ("json.decoder", "json/decoder.py", 1.0),
        ("colorsys", "wave", 0.0),
        ("2", "There are 2 functions.", 1.0),
        ("2", "3", 0.0),
        ("1", "0x0001", 1.0),
        ("utf-8", "'utf-8'", 1.0),
        ("utf-8", "latin-1", 0.0),
    ],
)
def test_it_scores_repoqa_answers_exactly(expected: str, answer: str, score: float):
    assert score_repoqa(expected, answer) == score
    assert answer_score({"name": "repoqa"}, expected, answer) == score


def _suite_file(tmp_path: Path, **changes) -> Path:
    data = {
        "tasks": [{"family": "sniah", "tokens": 2000, "count": 1}],
        "baselines": ["local_only"],
        "seeds": [0],
        "federation": {"local": "xp-a", "venues": [{"name": "xp-a", "profile": "edge"}]},
        **changes,
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"baselines": ["fastest"]}, "unknown baseline 'fastest' (known: rlm_sequential"),
        ({"tasks": [{"family": "novel", "tokens": 2000}]}, "tasks[0].family must be one of"),
        ({"tasks": [{"family": "sniah", "tokens": 5}]}, "tasks[0].tokens must be between"),
        ({"seeds": [-1]}, "seeds must be whole numbers 0 or more"),
        ({"seeds": []}, "seeds must be a non-empty list"),
        ({"policy": {"quorum": 7}}, "policy.quorum must be between"),
        ({"baselines": ["fed_premium"]}, "fed_premium needs federation.premium"),
        ({"colour": "blue"}, "unknown key 'colour'"),
        (
            {"federation": {"venues": [{"name": "xp-a", "profile": "nowhere"}]}},
            "no swarm profile 'nowhere'",
        ),
        (
            {"federation": {"venues": [{"name": "xp-a", "profile": {"faults": {"lie_rate": 2}}}]}},
            "[faults] lie_rate must be between 0 and 1, got 2",
        ),
        (
            {"federation": {"venues": [{"name": "xp-a", "profile": {"faults": {"lies": 1}}}]}},
            "[faults] has no setting 'lies'",
        ),
        ({"federation": {"venues": [{"name": "Bad Name"}]}}, "must be a venue name"),
        ({"endpoint": "ftp://x"}, "endpoint must be an http(s) URL"),
    ],
)
def test_it_refuses_a_bad_suite_file_in_one_line(tmp_path: Path, changes: dict, says: str):
    with pytest.raises(SuiteError) as refused:
        load_suite(_suite_file(tmp_path, **changes))
    message = str(refused.value)
    assert says in message and "\n" not in message


def test_it_refuses_a_suite_file_that_is_not_json(tmp_path: Path):
    path = tmp_path / "suite.json"
    path.write_text("{tasks: ")
    with pytest.raises(SuiteError, match="is not valid JSON"):
        load_suite(path)
    with pytest.raises(SuiteError, match="give small, default, or the path"):
        load_suite(tmp_path / "missing.json")


def test_the_command_says_what_is_wrong_with_the_suite(tmp_path: Path):
    path = _suite_file(tmp_path, baselines=["fastest"])
    with pytest.raises(CommandError, match="unknown baseline 'fastest'"):
        call_command("frlm_experiment", "--suite", str(path), "--output", str(tmp_path / "o"))
    with pytest.raises(CommandError, match=r"--tune quorum=3: policy.quorum must be between"):
        call_command("frlm_experiment", "--output", str(tmp_path / "o"), "--tune", "quorum=0.5,3")


def test_a_suite_file_reads_back_as_written(tmp_path: Path):
    small = load_suite("small")
    path = tmp_path / "again.json"
    path.write_text(json.dumps(small.to_dict()))
    assert load_suite(path) == small
    assert set(small.baselines) == set(BASELINES)


# 24 runs and five device processes: minutes on a busy two-core machine.
@pytest.mark.timeout(1500)
def test_it_runs_the_small_suite_as_ordinary_runs(venues, tmp_path: Path):
    from runs.experiments.runner import run_suite
    from runs.models import Run
    from tests.helpers import wait_until
    from traces import store

    seen: list[dict] = []
    suite = load_suite("small")
    out = run_suite(suite, tmp_path / "small", progress=seen.append)

    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(records) == suite.runs_count() == len(seen) == 24
    assert [p["done"] for p in seen] == list(range(1, 25)) and seen[-1]["total"] == 24
    for record in records:
        assert RECORD_KEYS <= set(record), RECORD_KEYS - set(record)
        assert record["status"] == "succeeded", record
        assert isinstance(record["correct"], bool) and record["wall_s"] > 0
        assert record["cost_usd"] == str(record["cost_usd"]) and float(record["cost_usd"]) >= 0
    by_baseline = {b: [r for r in records if r["baseline"] == b] for b in suite.baselines}
    assert all(len(rs) == 4 for rs in by_baseline.values())
    # On the honest local venue the needle is always found, one sub-query at a time or not.
    local = by_baseline["rlm_sequential"] + by_baseline["local_only"]
    assert all(r["correct"] for r in local if r["family"] == "sniah")

    runs = {r.id: r for r in Run.objects.filter(id__in=[r["run_id"] for r in records])}
    assert len(runs) == 24
    for record in records:
        run = runs[record["run_id"]]
        assert run.answer == record["answer"] and run.expected_answer == record["expected"]
        assert run.policy == record["policy"]
    wait_until(lambda: all(store.event_count(rid) for rid in runs), timeout=60, what="the traces")
    _check_sequential(by_baseline["rlm_sequential"], store)
    _check_premium_lane(by_baseline, suite.premium, store)

    assert json.loads((out / "suite.json").read_text())["name"] == "small"
    machine = json.loads((out / "machine.json").read_text())
    assert machine["cpu_count"] >= 1 and machine["git_commit"]

    # The report of the small suite: every table has rows, and every cell is a number.
    from runs.experiments.report import build_report

    assert build_report(out) == out / "report.html"
    tables = {t["key"]: t for t in json.loads((out / "report.json").read_text())["tables"]}
    assert list(tables) == ["latency", "cost", "success", "detection"]
    for name, table in tables.items():
        assert table["rows"], f"{name} has no rows: {table['note']}"
        for row in table["rows"]:
            assert list(row["values"]) == table["columns"]
            assert all(math.isfinite(v) for v in row["values"].values()), (name, row)
    judged = {r["label"]["baseline"] for r in tables["detection"]["rows"]}
    assert {"fed_redundancy", "fed_validator"} <= judged, tables["detection"]["note"]


def _spans(events: list[dict], name: str) -> list[tuple[int, int, str]]:
    starts = {e["span_id"]: e for e in events if e["name"] == name and e["phase"] == "start"}
    ends = {e["span_id"]: e for e in events if e["name"] == name and e["phase"] == "end"}
    return [(s["ts"], ends[sid]["ts"], s["venue"]) for sid, s in starts.items() if sid in ends]


def _check_sequential(records: list[dict], store) -> None:
    """rlm_sequential: no two sub-queries of a run execute at once."""
    for record in records:
        spans = sorted(_spans(store.read_events(record["run_id"]), "SubQuery.Execute"))
        assert len(spans) >= 2, record["run_id"]
        for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"run {record['run_id']} had two sub-queries at once"


def _check_premium_lane(by_baseline: dict[str, list[dict]], premium: str, store) -> None:
    """Only fed_premium sends work to the premium venue, and only its single-prompt calls
    (the merge of partial answers) and retries."""
    for baseline, records in by_baseline.items():
        for record in records:
            events = store.read_events(record["run_id"])
            on_premium = [e for e in events if e["venue"] == premium]
            if baseline != "fed_premium":
                assert not on_premium, f"{baseline} used the premium lane"
    merged = []
    for record in by_baseline["fed_premium"]:
        if record["family"] != "repoqa":
            continue
        spans = _spans(store.read_events(record["run_id"]), "SubQuery.Execute")
        merged += [venue for *_, venue in spans if venue == premium]
    assert merged, "no merge call ran on the premium lane"


def test_it_parses_tune_items_and_names_a_bad_one():
    from runs.experiments.tune import parse_tune

    assert parse_tune(["hedge=p90,p99", "policy.replicas=3"]) == {
        "hedge": ["p90", "p99"],
        "replicas": ["3"],
    }
    with pytest.raises(ValueError, match="--tune hedge=p42: policy.hedge must be one of"):
        parse_tune(["hedge=p90,p42"])
    with pytest.raises(ValueError, match="names no values"):
        parse_tune(["hedge="])
    # It named --policy, which frlm_experiment does not have (found by a review).
    with pytest.raises(ValueError, match="^--tune takes KEY=VALUE, got 'hedge'"):
        parse_tune(["hedge"])


def test_the_experiments_page_names_the_line_not_a_command_option(client, django_user_model):
    """The web form said "--tune takes KEY=VALUE", a flag of the command (a review)."""
    from runs.models import Experiment

    client.force_login(
        django_user_model.objects.create_user("tuner", password="x" * 12, is_staff=True)
    )
    answer = client.post("/experiments/", {"suite": "small", "tune": "hedge=p90\ngarbage"})
    assert answer.status_code == 400
    (said,) = answer.context["form"].errors["tune"]
    assert said == "the line takes KEY=VALUE, got 'garbage'"
    assert "--tune" not in answer.content.decode()
    assert not Experiment.objects.exists()


def _records(walls: list[float], correct: bool = True) -> list[dict]:
    return [
        {"task_id": f"t{i % 3}", "seed": i // 3, "wall_s": w, "correct": correct}
        for i, w in enumerate(walls)
    ]


def test_a_change_that_is_faster_on_every_task_has_an_interval_below_zero():
    from runs.experiments.tune import compare

    before = _records([2.0, 2.5, 3.0, 2.2, 2.8, 3.1])
    after = _records([1.0, 1.4, 2.1, 1.1, 1.9, 2.0])
    step = compare(before, after, "hedge", "p90", 1)
    assert step["delta"] < 0 and step["ci_high"] < 0 and step["ci_low"] <= step["delta"]
    assert step["objective"] == pytest.approx(1.65) and step["accuracy"] == 1.0


def test_a_change_within_the_noise_has_an_interval_across_zero():
    from runs.experiments.tune import compare

    before = _records([2.0, 2.5, 3.0, 2.2, 2.8, 3.1])
    after = _records([2.4, 2.1, 3.3, 1.9, 2.9, 2.7])
    step = compare(before, after, "explore", "0.1", 1)
    assert step["ci_low"] < 0 < step["ci_high"]


class _ScriptedRunner:
    """The loop's side of the runner, with wall times set by the policy: what the loop
    decides from them is under test here (the real runner is run by the small suite)."""

    def __init__(self, walls: dict[str, float]):
        self.walls, self.total, self.steps = walls, 0, []

    def run(self, item, *, policy, tune_step=None):
        self.steps.append(tune_step)
        wall = self.walls.get(policy.get("hedge"), 1.0) + 0.01 * item.task_seed
        return {"task_id": item.task_id, "seed": item.seed, "wall_s": wall, "correct": True}


def test_the_policy_loop_measures_its_start_warm_and_keeps_only_what_helps(tmp_path: Path):
    """The suite's own runs of the baseline ran on a cold federation (new workers probed and
    fully checked): measured against them, every change of a first round 'helped' (seen:
    seven of seven). The loop measures its start again, then compares."""
    from runs.experiments.runner import plan_runs
    from runs.experiments.tune import tune_policy

    suite = load_suite("small")
    cold = [
        {"task_id": p.task_id, "seed": p.seed, "wall_s": 2.0 + 0.01 * p.task_seed, "correct": True}
        for p in plan_runs(suite, (suite.tune_baseline,))
    ]
    runner = _ScriptedRunner({"p95": 1.0, "off": 0.8, "p99": 1.0})
    result = tune_policy(suite, tmp_path, {"hedge": ["off", "p99"]}, runner, cold)
    assert runner.steps[: len(cold)] == [0] * len(cold)  # the start, measured again
    assert result["start_objective"] < result["suite_objective"]
    by_value = {s["value"]: s for s in result["steps"]}
    assert by_value["off"]["kept"] and by_value["off"]["ci_high"] < 0
    assert not by_value["p99"]["kept"] and by_value["p99"]["delta"] == pytest.approx(0)
    assert result["changed"] == {"hedge": "off"}
