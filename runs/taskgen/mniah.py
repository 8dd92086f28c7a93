"""Multi-needle S-NIAH (RULER's multi-value variant): the filler prose of S-NIAH with one key
stated several times, each time with another value, among distractor needles for other
keys. The question asks for all the key's values; the score is the share of them the answer
gives, as RULER scores its multi-value task.
"""

from __future__ import annotations

import random
import re

from runs.taskgen.sniah import (
    CHARS_PER_TOKEN,
    DISTRACTORS,
    GeneratedTask,
    Plan,
    distinct_keys,
    distinct_values,
    needle_sentence,
    pick_filler,
)

VALUES = 4  # needles for the asked key


def make_mniah(tokens: int, seed: int) -> GeneratedTask:
    """A multi-value needle task of about `tokens` tokens; the same (tokens, seed) always
    gives the same task."""
    if tokens < 1:
        raise ValueError(f"tokens must be positive, not {tokens}")
    rng = random.Random(f"frlm-mniah:{tokens}:{seed}")
    keys = distinct_keys(rng, 1 + DISTRACTORS)
    values = distinct_values(rng, VALUES + DISTRACTORS)
    pairs = [(keys[0], v) for v in values[:VALUES]]
    pairs += list(zip(keys[1:], values[VALUES:], strict=True))
    needles = [needle_sentence(key, value) for key, value in pairs]
    needle_chars = sum(len(sentence) + 1 for sentence in needles)
    picks, filler_chars = pick_filler(rng, max(0, tokens * CHARS_PER_TOKEN - needle_chars))
    positions = [rng.randint(0, len(picks)) for _ in needles]
    placed = sorted(zip(positions, needles, strict=True), key=lambda item: item[0])
    # The expected values in the order they appear, as a reader would list them.
    order = [sentence for _position, sentence in placed]
    expected = [v for v in values[:VALUES]]
    expected.sort(key=lambda v: next(i for i, s in enumerate(order) if v in s))
    return GeneratedTask(
        name="mniah",
        question=(
            f"What are all the special magic numbers for {keys[0]} mentioned in the provided "
            "text? List every one of them."
        ),
        expected_answer=", ".join(expected),
        context_chars=filler_chars + needle_chars,
        _plan=Plan(picks=picks, needles=tuple(placed)),
    )


def score_mniah(expected: str, answer: str) -> float:
    """The share of the expected values that the answer gives (as whole numbers)."""
    wanted = [v.strip() for v in expected.split(",") if v.strip()]
    joined = re.sub(r"(?<=\d)[,_ \u00a0\u202f](?=\d{3}(?!\d))", "", answer or "")
    found = set(re.findall(r"\d+", joined))
    return sum(1 for v in wanted if v in found) / len(wanted) if wanted else 0.0
