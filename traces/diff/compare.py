"""Comparing what two aligned nodes hold: measures as (a, b, delta) pairs, and payload texts
(prompts, code, replies) as those without an equal on the other side, with a short unified
diff."""

from __future__ import annotations

import difflib
import json
from itertools import islice
from typing import Any

from traces.diff.condense import Node, Texts
from traces.diff.types import Pair, TextChange

TEXT_CHARS = 2000  # how much of a text a diff shows and compares line by line
DIFF_LINES = 40


def pair(a: float, b: float, digits: int = 3) -> Pair:
    return {"a": round(a, digits), "b": round(b, digits), "delta": round(b - a, digits)}


def clip(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_CHARS:
        return text
    return text[:TEXT_CHARS] + f"… [{len(text) - TEXT_CHARS} more chars]"


def unified(a: str | None, b: str | None) -> list[str]:
    """A short unified diff of two texts, hunks only."""
    if a and b and "\n" not in a and "\n" not in b and a != b:
        # Most replies of a batch are one line; difflib's set-up costs more than they do.
        return ["@@ -1 +1 @@", f"-{a[:TEXT_CHARS]}", f"+{b[:TEXT_CHARS]}"]
    lines = difflib.unified_diff(
        (a or "")[:TEXT_CHARS].splitlines(), (b or "")[:TEXT_CHARS].splitlines(), n=1, lineterm=""
    )
    return [line for line in islice(lines, DIFF_LINES + 2) if not line.startswith(("---", "+++"))]


def dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def public(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if not k.startswith("_")}


def payload_change(texts: Texts, na: Node, nb: Node, which: str) -> TextChange | None:
    """Whether the two nodes hold different texts (prompts, code, replies). A condensed
    node holds many: a text differs when no member on the other side has it, so a batch
    that only ran more copies of the same prompt has not changed its text (its count
    has). Equal refs are equal texts, so only refs found on one side are resolved."""
    refs_a = [getattr(s, which) for s in na.spans]
    refs_b = [getattr(s, which) for s in nb.spans]
    # A span without a payload (cancelled, still open) has no text to compare.
    set_a, set_b = set(refs_a) - {None}, set(refs_b) - {None}
    if set_a == set_b:
        return None
    left_a, left_b = set_a - set_b, set_b - set_a
    texts_a = {texts.get(r) for r in left_a}
    texts_b = {texts.get(r) for r in left_b}
    only_a, only_b = texts_a - texts_b, texts_b - texts_a
    if (only_a or only_b) and set_a & set_b:
        # A caller's lookup need not be content addressed: a shared ref may hold the text.
        shared = {texts.get(r) for r in set_a & set_b}
        only_a, only_b = only_a - shared, only_b - shared
    if not only_a and not only_b:
        return None
    a_members = [texts.get(r) for r in refs_a if r in left_a]
    b_members = [texts.get(r) for r in refs_b if r in left_b]
    a_differing = [t for t in a_members if t in only_a]
    b_differing = [t for t in b_members if t in only_b]
    a = a_differing[0] if a_differing else None
    b = b_differing[0] if b_differing else None
    return {
        "differing": max(len(a_differing), len(b_differing)),
        "a": clip(a),
        "b": clip(b),
        "diff": unified(a, b),
    }
