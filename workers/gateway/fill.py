"""The jobs the gateway sends (workers/gateway/server.py): checked for what it reads of
them, and filled with their fragments' text, read here by byte range and checked by sha256
(workers/fragments.py), from the run's own context file or the context store only, since
a worker on another host has no disk of ours."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from workers import fragments
from workers.jobs import Job

RunContext = Callable[[str], "str | None"]  # a run's context file, or None


def check_job(job: Any) -> None:
    """A queue's job has what the pump reads of it (ValueError: what it lacks)."""
    if not isinstance(job, dict):
        raise ValueError("a job is not an object")
    for field, kind in JOB_FIELDS:
        if not isinstance(job.get(field), kind) or isinstance(job.get(field), bool):
            raise ValueError(f"job field {field!r} is missing or not of type {kind}")


JOB_FIELDS = (
    ("run_id", str), ("sq_id", str), ("submit_span", str), ("depth", int), ("model", dict),
    ("prompt", str), ("deadline", (int, float)),
)  # fmt: skip


def all_filled(jobs: list[Job], run_context: RunContext) -> list[dict[str, Any]]:
    return [
        filled(job, run_context) if fragments.MARKER_OPEN in job["prompt"] else dict(job)
        for job in jobs
    ]


def filled(job: Job, run_context: RunContext) -> dict[str, Any]:
    """The job with its fragments' text in `text` (the prompt stays as the conductor wrote
    it: that is what an attestation covers), or the reason they cannot be read in `error`.
    Only fragments of context files are read: the run's own, or the context store's."""
    try:
        for ref in fragments.refs(job["prompt"]):
            check_context_path(job["run_id"], ref["path"], run_context)
        text, loaded = fragments.fill(job["prompt"])
    except fragments.FragmentError as exc:
        return {**job, "error": str(exc)}
    return {**job, "text": text, "loaded": loaded}


def check_context_path(run_id: str, raw: str, run_context: RunContext) -> None:
    path = Path(os.path.realpath(raw))
    store = Path(os.path.realpath(settings.FRLM_CONTEXT_DIR))
    if path.is_relative_to(store):
        return
    own = run_context(run_id)
    if own and path == Path(os.path.realpath(own)):
        return
    raise fragments.FragmentError(
        f"the fragment's file {raw[:200]} is not a context of run {run_id}; the gateway "
        "serves only the run's context and the context store"
    )
