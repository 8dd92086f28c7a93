"""Context folding: when the conversation the root model would see grows past
policy.fold_tokens, its older turns are summarised through sub-queries and replaced by one
message holding the summaries; their full text stays in the REPL (the list `folded`).

This module decides what to fold and writes the messages; the conductor sends the
summarising sub-queries through the fanout and records the Context.Fold span.
"""

from __future__ import annotations

import re
from typing import TypedDict

CHARS_PER_TOKEN = 4
PART_CHARS = 16_000  # one summarising sub-query reads at most this much
HEAD = 2  # the system prompt and the question are never folded
TAIL = 2  # nor the last reply and its REPL output
FOLD_HEADER = (
    "Summarise the text below, earlier turns of a REPL session: keep every number, name, "
    "result and error it reports. Reply with the summary only.\n\nTEXT:\n"
)
FOLDED_INTRO = "Earlier turns, folded"
_FOLDED_TURNS = re.compile(rf"^{FOLDED_INTRO} \((\d+) root turns?", re.MULTILINE)


class Message(TypedDict):
    role: str
    content: str


def tokens_of(messages: list[Message]) -> int:
    """What the root model would read, in tokens (4 characters each, as the prompts say)."""
    return sum(len(m["content"]) + 8 for m in messages) // CHARS_PER_TOKEN


def foldable(messages: list[Message]) -> tuple[int, int] | None:
    """[start, end) of the messages to fold: everything between the question and the last
    exchange, if that is at least one message."""
    start, end = HEAD, len(messages) - TAIL
    return (start, end) if end > start else None


def render(messages: list[Message]) -> str:
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def parts(text: str, size: int = PART_CHARS) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)] or [""]


def turns_in(messages: list[Message]) -> int:
    """Root turns in these messages, counting those already folded into one of them."""
    own = sum(1 for m in messages if m["role"] == "assistant")
    earlier = sum(
        int(match.group(1)) for m in messages for match in _FOLDED_TURNS.finditer(m["content"])
    )
    return own + earlier


def folded_message(summaries: list[str], turns: int, slot: int) -> Message:
    body = "\n".join("- " + " ".join(s.split()) for s in summaries if s.strip())
    content = (
        f"{FOLDED_INTRO} ({turns} root turns) to keep this conversation short; their full "
        f"text is in the REPL as folded[{slot}]. Summary:\n{body or '- (nothing to keep)'}"
    )
    return {"role": "user", "content": content}


def fallback_summary(text: str, keep: int = 600) -> str:
    """Without workers, the ends of the folded text are what stays."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]} [... {len(text) - 2 * keep} characters folded ...] {text[-keep:]}"
