"""Generated benchmark tasks: a context of any size, a question and its expected answer,
all from (task name, tokens, seed), so a benchmark run needs no data download.

| task | what | score |
| --- | --- | --- |
| sniah | one needle among distractors (RULER S-NIAH) | 1 if the number is given |
| mniah | one key with several values (RULER multi-value) | share of the values given |
| oolong | aggregation over labelled records (OOLONG trec_coarse) | label 1/0, number 0.75^err |
| pairs | pairs of users meeting a condition (OOLONG-Pairs style) | F1 over the pairs |
| repoqa | a question about Python standard library modules, answered by `ast` | 1 if exact |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from runs.taskgen.mniah import make_mniah, score_mniah
from runs.taskgen.oolong import make_oolong, make_pairs, score_oolong, score_pairs
from runs.taskgen.repoqa import make_repoqa, score_repoqa
from runs.taskgen.sniah import GeneratedTask, answer_matches, make_sniah, score_answer

MIN_TOKENS = 100
MAX_TOKENS = 50_000_000
# A generated task's size and seed when none is given: the launcher's and frlm_run's, so
# both make the same task (the launcher's seed was 1, frlm_run's 0).
DEFAULT_TOKENS = 100_000
DEFAULT_SEED = 0
MAX_SEED = 2**63 - 1  # what a command's --seed takes (a signed 64-bit integer)


class Task(Protocol):
    name: str
    question: str
    expected_answer: str
    context_chars: int

    def write_context(self, path: Any) -> None: ...


TaskFactory = Callable[[int, int], Task]

TASKS: dict[str, TaskFactory] = {
    "sniah": make_sniah,
    "mniah": make_mniah,
    "oolong": make_oolong,
    "pairs": make_pairs,
    "repoqa": make_repoqa,
}

SCORERS: dict[str, Callable[[str, str], float]] = {
    "sniah": lambda expected, answer: 1.0 if answer_matches(expected, answer) else 0.0,
    "mniah": score_mniah,
    "oolong": score_oolong,
    "pairs": score_pairs,
    "repoqa": score_repoqa,
}

__all__ = [
    "MAX_TOKENS",
    "MIN_TOKENS",
    "task_problems",
    "TASKS",
    "GeneratedTask",
    "Task",
    "answer_matches",
    "answer_score",
    "answer_correct",
    "make_task",
    "score_answer",
]


def make_task(name: str, tokens: int, seed: int) -> Task:
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    problems = task_problems(tokens, seed)
    if problems:
        raise ValueError("; ".join(problems))  # both at once (runs.forms.place_errors)
    return factory(tokens, seed)


def task_problems(tokens: int | None, seed: int | None) -> list[str]:
    """What is out of range in a generated task's size and seed (None: not given, not
    checked), each problem naming its field first ("tokens ...", "seed ...")."""
    problems = []
    if tokens is not None and not MIN_TOKENS <= tokens <= MAX_TOKENS:
        problems.append(f"tokens must be between {MIN_TOKENS:,} and {MAX_TOKENS:,}, not {tokens:,}")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        # The launcher took 10**26, which `frlm_run --seed` then refused: a run it could
        # not make again from the command line (a review).
        problems.append(f"seed must be from 0 to {MAX_SEED}, not {seed}")
    return problems


def answer_score(task: dict[str, Any] | None, expected: str, answer: str) -> float:
    """The task's official-style score of an answer, from 0 to 1 (sniah when unnamed)."""
    name = (task or {}).get("name") or "sniah"
    return SCORERS.get(name, SCORERS["sniah"])(expected, answer or "")


def answer_correct(task: dict[str, Any] | None, expected: str, answer: str) -> bool:
    return answer_score(task, expected, answer) >= 1.0
