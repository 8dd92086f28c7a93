"""The text an RLM's REPL reads: the run's context, prepared once, or a child RLM's own piece
(a fragment of the run's context, or text the REPL passed to rlm_query) in a file of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs.engine.context import (
    ContextError,
    PreparedContext,
    check_path,
    context_prepare,
    context_roots,
)
from runs.engine.finish import RunAbort
from runs.models import Run
from runs.sandbox import SandboxCallError
from workers import fragments


@dataclass(frozen=True)
class RlmContext:
    """What one RLM's REPL reads: a UTF-8 file, its length, its offset index if known."""

    path: Path
    chars: int
    index_path: Path | None = None
    sha256: str = ""


def run_context(run: Run) -> tuple[PreparedContext, RlmContext]:
    """The context as one UTF-8 file with its offset index (runs.engine.context), read in one
    streaming pass at most: the conductor never holds the text. Its place is checked again
    here, as it is opened: the path may have changed since the run was created."""
    roots = context_roots(written_here=run.context_source != Run.Source.PATH)
    try:
        prepared = context_prepare(run.id, check_path(run.context_path, roots), roots)
    except ContextError as exc:
        raise RunAbort(f"context: {exc}") from exc
    except OSError as exc:
        raise RunAbort(f"context: {run.context_path} cannot be read: {exc}") from exc
    if prepared.chars == 0:
        raise RunAbort("context: it holds no text")
    Run.objects.filter(id=run.id).update(context_chars=prepared.chars)
    return prepared, RlmContext(prepared.path, prepared.chars, prepared.index_path, prepared.sha256)


@dataclass(frozen=True)
class ChildContext:
    """What rlm_query(context=...) asked for: a fragment of this run's context files, a
    text, or nothing (the child reads its parent's context)."""

    fragment: Any = None  # the fragment as the REPL gave it
    ref: fragments.FragmentRef | None = None  # the same, parsed and checked
    text: str | None = None

    def inline(self, prompt: str) -> str:
        """The prompt with this context appended, for a child answered as a plain sub-query."""
        if self.fragment is not None:
            return f"{prompt}\n\n{fragments.MARKER_TEXT.format(json.dumps(self.fragment))}"
        return prompt if self.text is None else f"{prompt}\n\n{self.text}"

    def file(self, parent: RlmContext, target: Path) -> RlmContext:
        """The child's context: written to ``target`` unless it is the parent's."""
        if self.ref is not None:
            return _fragment_file(self.ref, target)
        if self.text is not None:
            target.write_text(self.text, encoding="utf-8")
            return RlmContext(target, len(self.text))
        return parent


def child_context(value: Any, fragment_paths: set[str]) -> ChildContext:
    """rlm_query's context= argument, checked: a fragment must name one of this run's files,
    anything else but None is read as text."""
    fragment = value.get("fragment") if isinstance(value, dict) else None
    if fragment is not None:
        try:
            ref = fragments.parse_ref(json.dumps(fragment))
        except fragments.FragmentError as exc:
            raise SandboxCallError(f"rlm_query(context=...): {exc}") from exc
        if ref["path"] not in fragment_paths:
            raise SandboxCallError("rlm_query(context=...) names a file outside this run")
        return ChildContext(fragment=fragment, ref=ref)
    if value is not None and not isinstance(value, str):
        value = str(value)
    return ChildContext(text=value)


def _fragment_file(ref: fragments.FragmentRef, target: Path) -> RlmContext:
    """A child RLM's context made of one fragment: its bytes copied a chunk at a time
    (checked against the sha256), so the child's REPL reads a file of its own."""
    try:
        chars = fragments.copy(ref, target)
    except fragments.FragmentError as exc:
        raise SandboxCallError(f"rlm_query(context=...): {exc}") from exc
    return RlmContext(target, chars)
