"""What the simulated root model reads of the conversation the conductor writes, and of
the REPL outputs in it.

What it understands of the conversation (anything else is ignored, so the conductor's
wording can change freely):
- in the system message, `Context: str of N characters` and
  `Limits: max_batch=B, max_subqueries=S, ...`;
- the first user message starting `Question:` (else the first user message);
- every later user message is a REPL result; its text is what sits between the first
  and the last ``` fence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from workers.sim import ChatMessage

DEFAULT_MAX_BATCH = 16
NO_ANSWER = "No answer could be determined from the REPL outputs."


@dataclass(frozen=True)
class Limits:
    context_chars: int | None
    max_batch: int
    max_subqueries: int | None


@dataclass(frozen=True)
class Conversation:
    limits: Limits
    question: str
    turn: int  # assistant messages so far + 1
    replies: tuple[str, ...]  # the root's earlier replies
    outputs: tuple[str, ...]  # REPL outputs, oldest first
    asks_for_final: bool


@dataclass(frozen=True)
class Summary:
    """The line a generated program prints last: `... ; answer: X`."""

    answer: str | None


def parse_conversation(messages: Sequence[ChatMessage]) -> Conversation:
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    asked = [i for i in users if messages[i]["content"].lstrip().startswith("Question:")]
    question_at = (asked or users or [len(messages)])[0]
    question = ""
    if question_at < len(messages):
        question = messages[question_at]["content"].strip()
        question = question.removeprefix("Question:").strip()
    later = messages[question_at + 1 :]
    last = messages[-1] if messages else None
    asks_for_final = bool(
        last is not None
        and last["role"] == "user"
        and len(messages) - 1 != question_at
        and _asks_final(_outside_fence(last["content"]))
    )
    return Conversation(
        limits=parse_limits(system),
        question=question,
        turn=1 + sum(1 for m in messages if m["role"] == "assistant") + _folded_turns(messages),
        replies=tuple(m["content"] for m in messages if m["role"] == "assistant"),
        # Only REPL results count as outputs; a nudge from the conductor is not one.
        outputs=tuple(
            repl_text(m["content"])
            for m in later
            if m["role"] == "user" and m["content"].lstrip().startswith("REPL output")
        ),
        asks_for_final=asks_for_final,
    )


# "do not provide a final answer yet" (the official RLM library's first turn) asks for none.
_NOT_YET = re.compile(r"\b(?:do not|don't|not)\b[^.\n]{0,40}?final answer", re.IGNORECASE)


def _asks_final(text: str) -> bool:
    """Whether a message asks for the final answer now (the conductor's last nudge)."""
    return "final answer" in _NOT_YET.sub("", text).lower()


_FOLDED = re.compile(r"^Earlier turns, folded \((\d+) root turns?", re.MULTILINE)


def _folded_turns(messages: Sequence[ChatMessage]) -> int:
    """Turns the conductor folded into a summary message still count as taken."""
    return sum(
        int(found[1])
        for m in messages
        if m["role"] == "user"
        for found in _FOLDED.finditer(m["content"])
    )


def parse_limits(system: str) -> Limits:
    context = re.search(r"Context:\s*str of\s*([\d,_]+)\s*characters", system)
    batch = re.search(r"max_batch\s*=\s*(\d+)", system)
    subqueries = re.search(r"max_subqueries\s*=\s*(\d+)", system)
    return Limits(
        context_chars=int(re.sub(r"[,_]", "", context[1])) if context else None,
        max_batch=max(1, int(batch[1])) if batch else DEFAULT_MAX_BATCH,
        max_subqueries=int(subqueries[1]) if subqueries else None,
    )


def repl_text(content: str) -> str:
    """The output inside a `REPL output (cell K):` message (first to last fence)."""
    opening = content.find("```")
    if opening == -1:
        return re.sub(r"\A\s*REPL output[^\n]*\n?", "", content).strip("\n")
    newline = content.find("\n", opening)
    start = len(content) if newline == -1 else newline + 1
    closing = content.rfind("```")
    end = closing if closing >= start else len(content)
    return content[start:end].strip("\n")


def _outside_fence(content: str) -> str:
    opening = content.find("```")
    closing = content.rfind("```")
    if opening == -1 or closing == opening:
        return content
    return content[:opening] + content[closing + 3 :]


def scripted_blocks(question: str) -> list[str]:
    blocks = re.findall(r"```repl[ \t]*\r?\n(.*?)```", question, re.DOTALL)
    return [b.replace("\r\n", "\n").rstrip("\n") for b in blocks]


_SUMMARY = re.compile(r"^\d+ of \d+ \w+ [^\n]*?; answer: (?P<answer>[^\n]*)$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b:?.*$", re.MULTILINE)


def parse_summary(output: str) -> Summary | None:
    found = list(_SUMMARY.finditer(output))
    if not found:
        return None
    answer = found[-1]["answer"].strip()
    return Summary(answer=None if answer in ("", "None") else answer)


def error_line(output: str) -> str | None:
    """The last line naming an exception, if the output shows one."""
    errors = _ERROR_LINE.findall(output)
    if errors:
        return errors[-1].strip()
    if "Traceback (most recent call last)" in output:
        return last_line([output]) or "a traceback"
    return None


def last_line(outputs: Sequence[str]) -> str:
    for output in reversed(outputs):
        for line in reversed(output.splitlines()):
            if line.strip():
                return line.strip()
    return ""


def best_guess(outputs: Sequence[str], empty_answer: str) -> str:
    for output in reversed(outputs):
        summary = parse_summary(output)
        if summary is not None:
            return summary.answer or empty_answer
    line = last_line(outputs)
    if not line or error_line(line):
        return NO_ANSWER
    return line
