"""The recorder's loop: read the event stream through the consumer group, store each batch,
and only then acknowledge it."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis

from frlm_web import collector
from frlm_web.redis_client import OUTAGE_ERRORS, Outage
from traces import blobs, store
from traces.emitter import DEAD_LETTER_STREAM, EVENTS_STREAM
from traces.recorder import stream
from traces.recorder.columnar import _decode_batch
from traces.recorder.decode import _fields_of
from traces.recorder.lease import Lease
from traces.recorder.segments import _by_run, _commit, _stage_table
from traces.recorder.stream import GROUP, _id_text

log = logging.getLogger("traces.recorder")  # the name its log lines had before the split

# A trickle of events (a read of fewer than GATHER_BELOW) is gathered up to this long before
# it is stored (see Recorder._gather); a backlog is stored at once. A batch costs some 10 ms
# whatever its size (the parse's planning, a segment, an fsync): at 0.1 s the recorder was
# the largest part of tracing's cost in a fast fanout (bench/traces.py, 2,000 sub-queries
# of a 1 ms model: +0.16-0.21 ms of its CPU per sub-query), at 0.3 s +0.09-0.13, and at
# 200 ms sub-queries it still spent +0.5-0.7 ms per sub-query. The window ends early when
# a run ends (RUN_END in what came), so a finished run is in the store at once; while a
# run goes on, stored events lag the stream by up to the window (pages see it live from
# the forwarder, and a page that opens meanwhile fills the gap as the recorder stores it).
# A read of GATHER_BELOW entries or more is a backlog, stored at once. At 1,000 a fanout of
# a 1 ms model (~4,500 events/s) was stored in batches of ~1,000, each paying the batch's
# fixed cost: at 10,000 the recorder's share of tracing went from +0.150/+0.150 to
# +0.115/+0.110 ms of CPU per sub-query (bench/traces.py's 1 ms case, 2,000 sub-queries,
# the two settings alternated), and a run has fewer segments to read back.
GATHER_S = 1.0
GATHER_POLL_S = 0.1  # how often the window reads what came, to see a run's end
GATHER_BELOW = 10_000
RUN_END = b'"name":"Run.Init","phase":"end"'  # a run's span ends: as the emitter writes it
# A run whose root span has ended is folded into its cached span tree once no event of it
# has come for this long (see Recorder.fold): the attempts it gave up (a hedge's loser, a
# cut-off straggler) end their spans within a second or two of it.
FOLD_QUIET_S = 2.0


class Recorder:
    def __init__(
        self,
        client: redis.Redis,
        *,
        consumer: str = "recorder",
        batch_max: int = 20000,
        block_ms: int = 50,
        gather_s: float = GATHER_S,
        poll_s: float = GATHER_POLL_S,
    ) -> None:
        self.client = client
        # The same connections, without redis-py's reply parsing of XREADGROUP: a dict
        # per entry is a quarter of the cost of storing it.
        self.raw = redis.Redis(connection_pool=client.connection_pool)
        self.raw.response_callbacks.pop("XREADGROUP", None)
        self.consumer = consumer
        self.batch_max = batch_max
        self.block_ms = block_ms
        self.gather_s = gather_s
        self.poll_s = poll_s
        self.blobs = blobs.PackWriter()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="frlm-recorder-read")
        self._next: Future[list[Any]] | None = None
        self.lease = Lease(client)
        self.stored = 0
        # Called with each batch once it is durable, before it is acknowledged (the OTLP
        # stream, traces.otlp_stream); it must return at once and never raise.
        self.on_stored: Callable[[pa.Table], None] | None = None
        # Runs to fold into their cached span tree, with when (store.fold_tree): the
        # first `frlm_diff` of a run then reads one file instead of its segments.
        self.fold_due: dict[str, float] = {}
        self.fold_quiet_s = FOLD_QUIET_S

    # --- lifecycle -------------------------------------------------------------------
    def acquire(self, ttl_s: int = 10) -> None:
        """Take the single-writer lock (Lease.acquire); a second recorder refuses to start."""
        self.lease.acquire(ttl_s)

    def refresh(self, ttl_s: int = 10) -> None:
        self.lease.refresh(ttl_s)

    def release(self) -> None:
        self.lease.release()

    def ensure_group(self) -> None:
        stream.ensure_group(self.client)

    def run(self, stop: threading.Event) -> None:
        """1. take the lock, 2. store what an earlier life read but did not acknowledge,
        3. store new entries as they come until told to stop."""
        self.acquire()
        quiet_collector()
        try:
            self.ensure_group()
            self.refresh()
            self.blobs.open()
            self.recover()
            self._loop(stop)
            self.drain()
        finally:
            self.blobs.close()
            self.release()
            # Frozen objects are not collected at exit either: DuckDB's bindings would
            # report its live objects as leaks.
            gc.unfreeze()

    def _loop(self, stop: threading.Event) -> None:
        """Store batches until told to stop, riding out Redis going away (a restart, a
        network blip): each attempt waits longer (Outage), and once Redis answers again
        the group, the lease and what this consumer read but had not acknowledged are
        taken up again (_resume): a batch stored whose acknowledgement failed is read
        again and its events, already in a segment, are skipped."""
        outage = Outage(log, "recorder")
        last_refresh = time.monotonic()
        while not stop.is_set():
            try:
                if outage.away:
                    self._resume()
                    outage.back()
                if not self.step():
                    self.fold(time.monotonic())
                if time.monotonic() - last_refresh > 2:
                    self.refresh()
                    last_refresh = time.monotonic()
            except OUTAGE_ERRORS as exc:
                self._drop_read_ahead()
                stop.wait(outage.lost(exc))

    def _drop_read_ahead(self) -> None:
        """Forget a batch read ahead: what it delivered is pending for this consumer and
        _resume reads it again. Waited for first, so that no read still under way
        delivers entries after _resume has looked."""
        if self._next is not None:
            future, self._next = self._next, None
            try:
                future.result()
            except OUTAGE_ERRORS as exc:  # its entries, if any, are pending
                log.debug("recorder: the read ahead failed too: %s", exc)

    def _resume(self) -> None:
        """After an outage: the group again (a Redis without persistence lost it), the
        lease, then everything delivered to this consumer and not yet acknowledged."""
        self.ensure_group()
        self.refresh()
        self.recover()

    # --- work ------------------------------------------------------------------------
    def recover(self) -> int:
        total = 0
        while True:
            entries = self._read("0")
            if not entries:
                return total
            total += self.store_entries(entries, recovering=True)

    def step(self) -> int:
        """Store the next batch. While a full batch is stored, the next one is read in the
        background (the read is mostly Redis building its reply, and DuckDB and Parquet
        release the GIL): under load the two overlap."""
        if self._next is not None:
            entries, self._next = self._next.result(), None
        else:
            entries = self._gather()
        if not entries:
            return 0
        if len(entries) >= self.batch_max:
            self._next = self._reader.submit(self._read, ">")
        return self.store_entries(entries)

    def _gather(self) -> list[Any]:
        """What the stream holds, or the first entries to come, then what else comes within
        gather_s: a batch costs a parse, a segment and an fsync whatever its size, and
        events trickling in during a run would otherwise be stored a few at a time (pages
        see them live from the forwarder meanwhile). The window is read every poll_s, not
        at each arrival (a blocking read per arrival woke the recorder for every few events
        of a fanout, which cost some 40% of its CPU), and ends once a run has ended or a
        backlog has built up."""
        entries = self._read(">", block_ms=self.block_ms)
        if not entries or len(entries) >= GATHER_BELOW:
            return entries
        new = entries
        end = time.monotonic() + self.gather_s
        while not _ends_a_run(new) and len(entries) < GATHER_BELOW:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.poll_s, left))
            new = self._read(">")
            entries += new
        return entries

    def drain(self) -> None:
        """Store a batch read ahead, so that stopping leaves nothing read but unstored."""
        if self._next is not None:
            entries, self._next = self._next.result(), None
            if entries:
                self.store_entries(entries)

    def _read(self, start: str, *, block_ms: int | None = None) -> list[Any]:
        """Entries of the stream as [id, [b"seq", seq, b"e", json]] lists."""
        args: list[Any] = ["GROUP", GROUP, self.consumer, "COUNT", self.batch_max]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        reply = self.raw.execute_command("XREADGROUP", *args, "STREAMS", EVENTS_STREAM, start)
        if not reply:
            return []
        # A map of stream to entries (RESP3, or hiredis), or a list of [stream, entries].
        return next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]

    def store_entries(self, entries: list[Any], *, recovering: bool = False) -> int:
        """Store one batch; returns how many events were newly stored.

        1. parse and check the whole batch at once (columnar, in DuckDB), 2. stage each
        run's events as a segment and their payloads in the blob pack, 3. make it all
        durable, 4. acknowledge, dead-letter what did not fit, and trim what every reader
        of the stream is done with."""
        ids = [entry[0] for entry in entries]
        table, dead = _decode_batch(*_fields_of(entries))
        self.blobs.notice_prune()
        staged: list[tuple[Path, Path]] = []
        stored = 0
        first_id = _id_text(ids[0]) if ids else "0-0"
        for run_id, events in _by_run(table):
            if recovering:
                known = store.stored_event_ids(run_id, events.column("event_id").to_pylist())
                if known:
                    keep = pc.invert(pc.is_in(events.column("event_id"), pa.array(list(known))))
                    events = events.filter(keep)
            if events.num_rows:
                staged.append(_stage_table(run_id, events, self.blobs, first_id=first_id))
                stored += events.num_rows
                self._fold_later(run_id, events)
        self.blobs.sync()
        if staged:
            _commit(staged)
        if self.on_stored is not None:
            self.on_stored(table)

        pipe = self.client.pipeline()
        for index, reason, raw in dead:
            pipe.xadd(
                DEAD_LETTER_STREAM, {"reason": reason, "event": raw, "id": _id_text(ids[index])}
            )
        pipe.xack(EVENTS_STREAM, GROUP, *ids)
        pipe.execute()
        self.trim()
        if dead:
            log.warning("recorder: %d event(s) dead-lettered, first: %s", len(dead), dead[0][1])
        self.stored += stored
        return stored

    def _fold_later(self, run_id: str, events: pa.Table) -> None:
        """Put off the run's fold while its events come: the run ended in this batch, or
        it was already waiting, or it has a cached tree these events make stale."""
        ended = pc.any(
            pc.and_(pc.equal(events.column("phase"), "end"), events.column("parent_id").is_null())
        ).as_py()
        if ended or run_id in self.fold_due or (store.run_dir(run_id) / store.TREE_CACHE).exists():
            self.fold_due[run_id] = time.monotonic() + self.fold_quiet_s

    def fold(self, now: float) -> None:
        """Fold one run that has been quiet long enough into its cached span tree, while
        the stream has nothing to store (a fold of 1,000 sub-queries takes ~0.15 s)."""
        due = [run_id for run_id, at in self.fold_due.items() if at <= now]
        if not due:
            return
        run_id = min(due, key=self.fold_due.__getitem__)
        del self.fold_due[run_id]
        try:
            store.fold_tree(run_id)  # writes the cache once every span has ended
        except Exception:  # a cache is only a shortcut: readers fold the tree themselves
            log.exception("recorder: could not fold the span tree of run %s", run_id)

    def trim(self) -> None:
        """Delete what every reader of the stream is done with (stream.trim)."""
        stream.trim(self.client)


def _ends_a_run(entries: list[Any]) -> bool:
    """Whether a run's span ends among these entries (read off the event's text)."""
    _seqs, raws = _fields_of(entries)
    return any(isinstance(raw, bytes) and RUN_END in raw for raw in raws)


def quiet_collector() -> None:
    """Tune the cycle collector for a process whose work is the recorder's loop. A batch's
    stream reply is some 100,000 short-lived lists and tuples: at the default threshold
    (700) the collector ran a hundred times a batch, and each full collection walked all of
    Django and the libraries again (a quarter of the recorder's time, measured). What the
    process loaded to start is frozen, as in every long-running process
    (frlm_web/collector.py), and a collection waits until 50,000 more objects are alive
    than were freed; a batch's objects are freed by then."""
    collector.settle(threshold=50_000)
