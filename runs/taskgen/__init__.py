"""Generated benchmark tasks: a context of any size, a question and its expected answer,
all from (task name, tokens, seed), so a benchmark run needs no data download."""

from __future__ import annotations

from collections.abc import Callable

from runs.taskgen.sniah import GeneratedTask, answer_matches, make_sniah, score_answer

MIN_TOKENS = 100
MAX_TOKENS = 50_000_000

TaskFactory = Callable[[int, int], GeneratedTask]

TASKS: dict[str, TaskFactory] = {"sniah": make_sniah}

__all__ = [
    "MAX_TOKENS",
    "MIN_TOKENS",
    "TASKS",
    "GeneratedTask",
    "answer_matches",
    "make_task",
    "score_answer",
]


def make_task(name: str, tokens: int, seed: int) -> GeneratedTask:
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    if not MIN_TOKENS <= tokens <= MAX_TOKENS:
        raise ValueError(
            f"tokens must be between {MIN_TOKENS:,} and {MAX_TOKENS:,}, not {tokens:,}"
        )
    return factory(tokens, seed)
