"""What old runs leave besides their traces: the copies of their contexts FRLM wrote.

A generated task's text, an upload, a context given as text and a folder made one file
are written to FRLM_CONTEXT_DIR as `<run id>.txt` (runs/engine/context.py), with an offset
index beside them. Nothing removed them: a 15,000,000-token run left 60 MB (a review).
`frlm_prune` removes them with the runs' events, except a copy another run still reads (a
replay reads its source's)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runs.engine import context as ctx
from runs.models import Run


@dataclass
class Copies:
    paths: list[Path]
    bytes: int


def context_copies(run_ids: Iterable[str]) -> Copies:
    """The context copies of these runs that no other run reads."""
    ids = set(run_ids)
    directory = ctx.context_dir()
    found = {str(directory / f"{run_id}.txt"): directory / f"{run_id}.txt" for run_id in ids}
    found = {text: path for text, path in found.items() if path.is_file()}
    still_read = set(
        Run.objects.exclude(id__in=ids)
        .filter(context_path__in=list(found))
        .values_list("context_path", flat=True)
    )
    paths = [path for text, path in sorted(found.items()) if text not in still_read]
    return Copies(paths, sum(path.stat().st_size for path in paths))


def remove(copies: Copies) -> None:
    """Each copy and its offset index."""
    for path in copies.paths:
        ctx.index_file(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
