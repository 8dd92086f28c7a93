"""Generated benchmark tasks: sizes, determinism, one needle, scoring."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from runs.taskgen import TASKS, make_task, score_answer

NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")


def _key(question: str) -> str:
    match = re.fullmatch(
        r"What is the special magic number for ([a-z]+-[a-z]+) mentioned in the provided text\?",
        question,
    )
    assert match, question
    return match[1]


def test_it_registers_the_generated_tasks() -> None:
    assert sorted(TASKS) == ["mniah", "oolong", "pairs", "repoqa", "sniah"]


def test_it_gives_the_same_bytes_for_the_same_tokens_and_seed() -> None:
    first, second = make_task("sniah", 20_000, 5), make_task("sniah", 20_000, 5)
    assert first.context_text() == second.context_text()
    assert (first.question, first.expected_answer) == (second.question, second.expected_answer)
    other = make_task("sniah", 20_000, 6)
    assert other.context_text() != first.context_text()


@pytest.mark.parametrize("tokens", [1_000, 50_000, 300_000])
def test_it_sizes_the_context_within_5_percent(tokens: int) -> None:
    task = make_task("sniah", tokens, 1)
    text = task.context_text()
    assert len(text) == task.context_chars
    assert abs(len(text) - tokens * 4) <= 0.05 * tokens * 4


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_it_states_the_needle_exactly_once_among_three_distractors(seed: int) -> None:
    task = make_task("sniah", 30_000, seed)
    text = task.context_text()
    needles = NEEDLE.findall(text)
    assert len(needles) == 4
    key = _key(task.question)
    assert [value for k, value in needles if k == key] == [task.expected_answer]
    assert text.count(key) == 1
    assert text.count(task.expected_answer) == 1
    assert len({k for k, _ in needles}) == 4


def test_it_places_the_needle_at_a_depth_chosen_by_the_seed() -> None:
    depths = set()
    for seed in range(6):
        task = make_task("sniah", 30_000, seed)
        text = task.context_text()
        depths.add(round(text.index(task.expected_answer) / len(text), 2))
    assert len(depths) > 3


def test_it_writes_the_same_text_to_a_file(tmp_path: Path) -> None:
    task = make_task("sniah", 250_000, 9)
    path = tmp_path / "context.txt"
    task.write_context(path)
    assert path.read_text(encoding="utf-8") == task.context_text()


def test_it_generates_a_million_tokens_quickly() -> None:
    started = time.perf_counter()
    text = make_task("sniah", 1_000_000, 2).context_text()
    assert time.perf_counter() - started < 1.0
    assert len(text) > 3_800_000


def test_it_scores_the_expected_number_wherever_it_appears() -> None:
    task = make_task("sniah", 1_000, 4)
    value = task.expected_answer
    assert score_answer(task, value)
    assert score_answer(task, f"The special magic number is {value}.")
    assert score_answer(task, f"{int(value):,}")
    assert not score_answer(task, "NONE")
    assert not score_answer(task, "9" + value)
    assert not score_answer(task, value[:-1])


def test_it_rejects_an_unknown_task() -> None:
    with pytest.raises(
        ValueError, match="^unknown task 'x'; known tasks: mniah, oolong, pairs, repoqa, sniah$"
    ):
        make_task("x", 1_000, 0)


@pytest.mark.parametrize("tokens", [99, 50_000_001])
def test_it_rejects_sizes_out_of_range(tokens: int) -> None:
    with pytest.raises(ValueError, match="tokens must be between"):
        make_task("sniah", tokens, 0)


def test_a_seed_past_what_frlm_run_takes_is_refused_where_it_is_given(db) -> None:
    """The launcher took a seed of 10**26 that `frlm_run --seed` refuses, so its run could
    not be made again from the command line (a review)."""
    from runs.forms import RunForm
    from runs.taskgen import MAX_SEED, task_problems

    assert task_problems(None, MAX_SEED) == []
    assert task_problems(None, MAX_SEED + 1) == [
        f"seed must be from 0 to {MAX_SEED}, not {MAX_SEED + 1}"
    ]
    form = RunForm({"context_source": "task", "task_name": "sniah", "task_seed": str(10**26)})
    form.is_valid()
    form.check_task()  # as the launcher's view does
    assert f"seed must be from 0 to {MAX_SEED}" in str(form.errors["task_seed"])
