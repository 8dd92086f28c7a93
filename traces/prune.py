"""Retention: remove old runs' events and the blobs nothing references any more."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass

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
    event references and that is older than the grace period: files of the one-file-per-blob
    layout, and blobs in packs (traces.blobs), whose packs are rewritten without them."""
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
    for path in blobs.blob_dir().glob("[0-9a-f][0-9a-f]/*"):
        if path.name.startswith(".") or path.name in kept or path.stat().st_mtime > cutoff:
            continue
        count += 1
        size += path.stat().st_size
        if not dry_run:
            path.unlink(missing_ok=True)
    packed, packed_bytes = _prune_packs(kept, cutoff, dry_run=dry_run)
    return Pruned(removed, count + packed, size + packed_bytes)


def _prune_packs(kept: set[str], cutoff: float, *, dry_run: bool) -> tuple[int, int]:
    """Rewrite each pack that holds unreferenced blobs with only the referenced ones (a new
    name, so readers holding the old one's offsets look again), or delete it when nothing
    in it is referenced. The newest pack is the recorder's, which it appends to: never
    touched; nor is a pack written to within the grace period."""
    stems = blobs.pack_stems()
    count = size = 0
    directory = blobs.pack_dir()
    for stem in stems[:-1]:
        idx, pack = directory / f"{stem}.idx", directory / f"{stem}.pack"
        if idx.stat().st_mtime > cutoff:
            continue
        records, _ = blobs.read_records(idx)
        keep = [r for r in records if r[0].hex() in kept]
        if len(keep) == len(records):
            continue
        count += len(records) - len(keep)
        size += sum(length for _, _, length in records) - sum(length for _, _, length in keep)
        if dry_run:
            continue
        if keep:
            blobs.pack_rewrite(stem, keep)
        idx.unlink(missing_ok=True)  # the index first: a reader never finds a missing pack
        pack.unlink(missing_ok=True)
    return count, size


def _referenced(*, exclude: set[str]) -> set[str]:
    """Payload refs of every stored event, but those of runs in `exclude`."""
    files = sorted(
        str(p)
        for p in store.events_dir().glob("run_id=*/*.parquet")
        if p.parent.name.removeprefix("run_id=") not in exclude
    )
    if not files:
        return set()
    import duckdb  # only a prune that finds segments pays for it

    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT DISTINCT payload_ref FROM read_parquet(?) WHERE payload_ref IS NOT NULL",
            [files],
        ).fetchall()
    finally:
        con.close()
    return {row[0] for row in rows}
