"""Retention: remove old runs' events and the blobs nothing references any more."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from traces import blobs, store

# A blob younger than this may belong to a batch the recorder is writing right now.
BLOB_GRACE_S = 3600


@dataclass
class Pruned:
    runs: list[str]
    blobs: int
    bytes: int


def prune(run_ids: Iterable[str], *, dry_run: bool = False) -> Pruned:
    """1. remove the given runs' event segments, 2. remove every blob that no remaining
    event references and that is older than the grace period."""
    removed: list[str] = []
    for run_id in run_ids:
        directory = store.run_dir(run_id)
        if directory.exists():
            removed.append(run_id)
            if not dry_run:
                shutil.rmtree(directory)
    kept = _referenced(exclude=set(removed) if dry_run else set())
    count = size = 0
    cutoff = time.time() - BLOB_GRACE_S
    for path in blobs.blob_dir().glob("*/*"):
        if path.name.startswith(".") or path.name in kept or path.stat().st_mtime > cutoff:
            continue
        count += 1
        size += path.stat().st_size
        if not dry_run:
            path.unlink(missing_ok=True)
    return Pruned(removed, count, size)


def _referenced(*, exclude: set[str]) -> set[str]:
    """Payload refs of every stored event, but those of runs in `exclude`."""
    files = sorted(
        str(p)
        for p in store.events_dir().glob("run_id=*/*.parquet")
        if p.parent.name.removeprefix("run_id=") not in exclude
    )
    if not files:
        return set()
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT DISTINCT payload_ref FROM read_parquet(?) WHERE payload_ref IS NOT NULL",
            [files],
        ).fetchall()
    finally:
        con.close()
    return {row[0] for row in rows}
