"""Program templates the run launcher offers: a question wrapped in a short REPL program
that calls one of the program patterns (runs/sandbox/patterns.py). The root model is asked
to run it (the simulated root runs a question's ```repl blocks as given); a user can start
from one and edit it."""

from __future__ import annotations

import json
from typing import TypedDict


class ProgramTemplate(TypedDict):
    label: str
    code: str  # runs with `question` bound to the run's question


PROGRAM_TEMPLATES: dict[str, ProgramTemplate] = {
    "map_reduce": {
        "label": "Map-reduce over fragments",
        "code": "FINAL(map_reduce(question, chunk_size=50_000))",
    },
    "select": {
        "label": "BM25 fragment selection, then map-reduce",
        "code": "FINAL(map_reduce(question, select_fragments(question, 8)))",
    },
    "decompose": {
        "label": "Recursive decomposition (depth 2)",
        "code": "FINAL(decompose(question, depth=2, split=4, leaf_chars=50_000))",
    },
    "refine": {
        "label": "Iterative refinement with early exit",
        "code": "FINAL(refine(question, rounds=3, chunk_size=50_000))",
    },
    "tree_search": {
        "label": "Tree search with scoring and pruning",
        "code": "FINAL(tree_search(question, beam=3, branch=8, leaf_chars=20_000))",
    },
}


def program_question(name: str, question: str) -> str:
    """The question with the template's program attached; ValueError for an unknown name."""
    template = PROGRAM_TEMPLATES.get(name)
    if template is None:
        known = ", ".join(PROGRAM_TEMPLATES)
        raise ValueError(f"unknown program template {name!r}; known: {known}")
    # json.dumps writes a valid Python string literal: the question stays data, never code.
    return (
        f"{question}\n\nRun this program.\n```repl\nquestion = "
        f"{json.dumps(question, ensure_ascii=False)}\n{template['code']}\n```"
    )
