"""Agreement between two replies to the same prompt: whether they are the same answer
under a rule. exact (whitespace and case folded), numeric (the one number in a short
answer, within a tolerance), or text similarity (token-set Jaccard over a threshold).

Both sides need it: the conductor's redundant tier (runs.trust.verify) compares replicas
with it, and a validator worker (workers.tasks) decides the verdict it attests with it,
so it lives here, where the worker can import it without importing runs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

Mode = Literal["exact", "numeric", "similar"]
MODES: tuple[Mode, ...] = ("exact", "numeric", "similar")


_SPACE = re.compile(r"\s+")
# A decimal number as people write one in a short answer: a sign, thousands separated by
# commas or not, a fraction, an exponent. "1,234.5", "-3", "2e-3", ".5".
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])"
)
_WORD = re.compile(r"\w+")


def normalise_exact(text: str) -> str:
    """The form two replies must share to agree exactly: surrounding space dropped, inner
    runs of whitespace made one space, case folded ("Paris\\n" and "paris" agree)."""
    return _SPACE.sub(" ", text.strip()).casefold()


def parse_number(text: str) -> float | None:
    """The number a short answer states, or None when it states none or several different
    ones ("between 3 and 5" names no single answer, and guessing one is what the redundant
    tier must never do). "The total is 1,234." gives 1234.0; "42 (forty-two)" gives 42.0."""
    found: set[float] = set()
    for match in _NUMBER.finditer(text):
        token = match.group(0)
        if not any(ch.isdigit() for ch in token):
            continue
        try:
            value = float(token.replace(",", ""))
        except ValueError:
            continue
        if math.isfinite(value):
            found.add(value)
    return found.pop() if len(found) == 1 else None


def similarity(a: str, b: str) -> float:
    """Token-set Jaccard similarity of two texts, from 0 (no word shared) to 1 (the same
    words). Chosen over difflib's ratio because it is linear in the text (SequenceMatcher
    is quadratic in the worst case, and replies can be long), symmetric (ratio depends on
    which text comes first), ignores word order (two summaries saying the same things in
    another order agree) and 1 - Jaccard is a metric, so a threshold behaves predictably.
    Two empty texts are the same (1.0)."""
    words_a = set(_WORD.findall(a.casefold()))
    words_b = set(_WORD.findall(b.casefold()))
    if not words_a and not words_b:
        return 1.0
    return len(words_a & words_b) / len(words_a | words_b)


@dataclass(frozen=True)
class AgreementRule:
    """When two replies count as the same answer.

    mode "exact": equal after normalise_exact; "numeric": each states one number and they
    are close (math.isclose with rel_tol and abs_tol); "similar": similarity() >= threshold.
    """

    mode: Mode = "exact"
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    threshold: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (self.rel_tol >= 0 and self.abs_tol >= 0):
            problems.append("rel_tol and abs_tol must be 0 or more")
        if not 0.0 < self.threshold <= 1.0:
            problems.append(f"threshold must be in (0, 1], got {self.threshold}")
        if problems:
            raise ValueError("agreement rule: " + "; ".join(problems))


def agree(a: str, b: str, rule: AgreementRule) -> bool:
    """Whether two reply texts are the same answer under `rule`. In numeric mode a reply
    that states no single number agrees with nothing, not even another such reply."""
    if rule.mode == "exact":
        return normalise_exact(a) == normalise_exact(b)
    if rule.mode == "numeric":
        x, y = parse_number(a), parse_number(b)
        if x is None or y is None:
            return False
        return math.isclose(x, y, rel_tol=rule.rel_tol, abs_tol=rule.abs_tol)
    return similarity(a, b) >= rule.threshold
