"""The simulated worker reading source code: what a repository-QA excerpt (modules under
"##### file: PATH (module NAME) #####" header lines, as runs/taskgen/repoqa.py writes them)
says about two kinds of question, read from the excerpt alone:

- "Which module ... defines the function or class `X`": the module whose header is the
  nearest above a top-level `def X` / `class X` line;
- "the value of the constant `C` in module M": the literal of a top-level `C = ...` line.

A question counting calls across a module needs the whole module, which a fragment rarely
holds: the simulated worker does not try (it answers as for any question), so only a real
model can get those right.
"""

from __future__ import annotations

import ast
import re

_HEADER = re.compile(r"^##### file: \S+ \(module (?P<module>[\w.]+)\) #####$", re.MULTILINE)
_DEFINES = re.compile(r"defines the function or class `(?P<name>\w+)`")
_CONSTANT = re.compile(r"value of the constant `(?P<name>\w+)` in module (?P<module>[\w.]+)")


def source_answer(question: str, excerpt: str) -> str | None:
    """The answer from the excerpt, "" when the excerpt does not hold it, None when the
    question is not one of these."""
    if m := _DEFINES.search(question):
        return _defining_module(m["name"], excerpt)
    if m := _CONSTANT.search(question):
        return _constant_value(m["name"], excerpt)
    return None


def _defining_module(name: str, excerpt: str) -> str:
    found = re.search(rf"^(?:async def|def|class) {re.escape(name)}\b", excerpt, re.MULTILINE)
    if found is None:
        return ""
    headers = [h for h in _HEADER.finditer(excerpt) if h.start() < found.start()]
    return headers[-1]["module"] if headers else ""


def _constant_value(name: str, excerpt: str) -> str:
    found = re.search(rf"^{re.escape(name)} = (?P<value>.+)$", excerpt, re.MULTILINE)
    if found is None:
        return ""
    try:
        return str(ast.literal_eval(found["value"].split("#")[0].strip()))
    except (ValueError, SyntaxError):
        return ""
