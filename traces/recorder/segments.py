"""Writing a batch to the store: each run's events staged as a temporary Parquet segment,
their payloads handed to the blob pack, and the segments made durable and visible at once
(fsync, rename)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces import blobs, store
from traces.recorder.decode import _STAGED_SCHEMA, _row
from traces.schema import Event


def _by_run(table: pa.Table) -> list[tuple[str, pa.Table]]:
    if not table.num_rows:
        return []
    runs = table.column("run_id")
    unique = pc.unique(runs).to_pylist()
    if len(unique) == 1:
        return [(unique[0], table)]
    return [(run_id, table.filter(pc.equal(runs, run_id))) for run_id in unique]


def _stage_table(
    run_id: str, events: pa.Table, writer: blobs.PackWriter, *, first_id: str
) -> tuple[Path, Path]:
    """Write a run's batch as a temporary segment, and hand its payloads to the blob pack;
    nothing is durable until the pack's sync and _commit."""
    payloads = events.column("payload")
    if payloads.null_count < len(payloads):
        carried = pc.is_valid(payloads)
        refs = pc.filter(events.column("payload_ref"), carried).to_pylist()
        for ref, text in zip(refs, pc.filter(payloads, carried).to_pylist(), strict=True):
            if ref:
                writer.add(ref, text)
    table = events.drop_columns(["payload"])
    directory = store.run_dir(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    first_event = events.column("event_id")[0].as_py()
    final = directory / f"seg-{first_id}-{first_event}.parquet"
    tmp = directory / f".{final.name}.tmp"
    pq.write_table(table, tmp, compression="zstd", use_dictionary=_FEW_VALUES)
    return tmp, final


# Columns with few distinct values: a dictionary pays there. Ids, times and attrs are
# nearly all distinct, and a dictionary tried on them was a sixth of the write.
_FEW_VALUES = ["run_id", "name", "phase", "status", "venue", "worker_id", "depth"]


def _commit(staged: list[tuple[Path, Path]]) -> None:
    """Make a batch's segments durable (each file synced: os.sync would flush every dirty
    page of the machine, other programs' too), then make each appear by rename, and the
    renames durable too."""
    for tmp, _ in staged:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for tmp, final in staged:
        os.replace(tmp, final)
    for directory in {final.parent for _, final in staged}:
        blobs.fsync_dir(directory)


def _write_segment(run_id: str, events: list[Event], *, first_id: str) -> Path:
    """Store events given as dicts (tests, tools): the recorder's path, without a stream."""
    writer = blobs.PackWriter()
    table = pa.Table.from_pylist([_row(e) for e in events], schema=_STAGED_SCHEMA)
    tmp, final = _stage_table(run_id, table, writer, first_id=first_id)
    writer.sync()
    writer.close()
    _commit([(tmp, final)])
    return final
