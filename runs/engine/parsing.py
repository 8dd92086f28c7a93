"""Reading a root model's reply: its code blocks and a final answer given in prose."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BLOCK = re.compile(r"```(?:repl|python)[ \t]*\r?\n(.*?)```", re.S)
# FINAL(...) / FINAL_VAR(...) at the start of a line, outside code blocks, as the original
# RLM reads them; the answer may span lines up to the last closing parenthesis.
_FINAL = re.compile(
    r"^\s*FINAL_VAR\((?P<var>.*?)\)\s*$|^\s*FINAL\((?P<answer>.*)\)\s*$", re.S | re.M
)


@dataclass(frozen=True)
class FinalInText:
    answer: str | None = None  # FINAL(answer)
    variable: str | None = None  # FINAL_VAR(name)


def code_blocks(reply: str) -> list[str]:
    return [block.replace("\r\n", "\n").strip("\n") for block in _BLOCK.findall(reply)]


def final_in_text(reply: str) -> FinalInText | None:
    prose = _BLOCK.sub("", reply)
    for line_start in _line_starts(prose):
        rest = prose[line_start:]
        if not rest.lstrip().startswith("FINAL"):
            continue
        match = _FINAL.match(rest)
        if match is None:
            continue
        if match.group("var") is not None:
            return FinalInText(variable=match.group("var").strip().strip("'\""))
        return FinalInText(answer=_unquote(match.group("answer").strip()))
    return None


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer(r"\n", text)]


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text
