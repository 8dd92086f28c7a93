"""The recorder: the one writer of the trace store (ARCHITECTURE.md §7).

It reads the event stream through a consumer group, writes each batch per run as an
immutable Parquet segment (temporary name, fsync, rename), and only then acknowledges and
deletes the entries. Killed at any moment, it loses nothing: unacknowledged entries are read
again on restart, and those already in a segment are recognised by event id and skipped.

The modules: `consumer` (the loop, Recorder.store_entries: where an event is stored),
`lease` (the single-writer lock and heartbeat), `stream` (the consumer group and trimming),
`columnar` (the batch parse in DuckDB and Arrow), `decode` (the event-by-event parse it
falls back to), `segments` (staging and committing segments)."""

from __future__ import annotations

from traces.recorder.columnar import COLUMNAR_MIN, _decode_batch
from traces.recorder.consumer import GATHER_BELOW, GATHER_S, Recorder, quiet_collector
from traces.recorder.decode import _decode, _decode_slowly
from traces.recorder.lease import HEARTBEAT_KEY, LOCK_KEY, RecorderBusy
from traces.recorder.segments import _write_segment
from traces.recorder.stream import GROUP, LIVE_GROUP, LIVE_HEARTBEAT_KEY, LIVE_LAG_MAX

__all__ = [
    "COLUMNAR_MIN",
    "GATHER_BELOW",
    "GATHER_S",
    "GROUP",
    "HEARTBEAT_KEY",
    "LIVE_GROUP",
    "LIVE_HEARTBEAT_KEY",
    "LIVE_LAG_MAX",
    "LOCK_KEY",
    "Recorder",
    "RecorderBusy",
    "_decode",
    "_decode_batch",
    "_decode_slowly",
    "_write_segment",
    "quiet_collector",
]
