"""No run outlives its conductor silently (ARCHITECTURE.md §3).

A conductor holds a lease on each run it conducts: the run's entry in the sorted set
`frlm:run:leases`, scored by when it lapses, renewed every FRLM_RUN_LEASE_RENEW_S by a
thread of its own (`LeaseKeeper`), which the run's work (REPL cells, model calls, the
fan-out loop) never blocks. Its open spans are kept beside it in `frlm:run:<id>:open`
(traces/emitter.py keeps that hash as it emits).

A watcher (`LeaseWatch`: a thread in the web server and in every conductor) takes each
lapsed entry out of the set; the one whose ZREM removed it, and only that one, fails the
run with the reason, ends its open spans as `abandoned` and records `Run.Done`. Failing,
not resuming: a run's REPL state (variables the root model's code built) lives only in
the dead conductor's sandbox, so another conductor could only replay the root's turns
from the trace, re-running their cells and sub-queries, at the cost of a second run
which the user can start from the run page (`frlm_replay`) knowing that it is one.

A conductor that is alive after all (starved past the TTL) finds its entry gone and the
watcher's mark at the next renewal, asks its run to stop, and records nothing over the
failure; an entry gone without the mark (a Redis restarted without its data) it takes again."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from frlm_web.redis_client import get_redis
from runs.engine.progress import request_cancel
from runs.models import Run
from runs.salvage import spend_salvage
from traces.emitter import Emitter

log = logging.getLogger(__name__)

LEASES_KEY = "frlm:run:leases"
HOLDERS_KEY = "frlm:run:leases:holder"
WATCH_EVERY_S = 1.0
REAPED_TTL_S = 86400


def open_spans_key(run_id: str) -> str:
    return f"frlm:run:{run_id}:open"


def reaped_key(run_id: str) -> str:
    """Set by the watcher that failed the run: a holder whose entry is gone tells a lease
    taken away from one lost with a Redis that kept no data (then it takes it again)."""
    return f"frlm:run:{run_id}:reaped"


def lapsed_message(conductor: str) -> str:
    return (
        f"its conductor {conductor or '(unknown)'} stopped while running it (its lease on the "
        f"run lapsed: it died, or was cut off for more than {settings.FRLM_RUN_LEASE_TTL_S:g} "
        "s); the trace up to that point is kept; run it again, or `frlm_replay` it from a turn"
    )


# --- the holder's side ----------------------------------------------------------------
def lease_take(client: redis.Redis, run_id: str, holder: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.zadd(LEASES_KEY, {run_id: time.time() + settings.FRLM_RUN_LEASE_TTL_S})
    pipe.hset(HOLDERS_KEY, run_id, holder)
    pipe.execute()


def lease_drop(client: redis.Redis, run_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.zrem(LEASES_KEY, run_id)
    pipe.hdel(HOLDERS_KEY, run_id)
    pipe.delete(open_spans_key(run_id))
    pipe.execute()


class LeaseKeeper:
    """This process's leases, renewed by one daemon thread: `hold` as a run is claimed,
    `release` as it ends. A lease found taken away (a watcher judged it lapsed) makes its
    run stop: `lost(run_id)` says so."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.client = client or get_redis()
        self.lock = threading.Lock()
        self.held: set[str] = set()
        self.taken: set[str] = set()
        self.thread: threading.Thread | None = None

    def hold(self, run_id: str, holder: str) -> None:
        lease_take(self.client, run_id, holder)
        with self.lock:
            self.held.add(run_id)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="frlm-lease", daemon=True)
                self.thread.start()

    def release(self, run_id: str) -> None:
        with self.lock:
            self.held.discard(run_id)
            taken = run_id in self.taken
            self.taken.discard(run_id)
        if not taken:
            try:
                lease_drop(self.client, run_id)
            except redis.RedisError:
                log.exception("could not drop the lease of run %s (it lapses by itself)", run_id)

    def lost(self, run_id: str) -> bool:
        """Whether a watcher took the run's lease away: seen by the renewal, or asked of
        Redis now. A run that stops at once on the cancel the watcher set (a cell is told
        within a quarter of a second) could end before the next renewal saw the lease
        gone, and record its outcome over the failure."""
        with self.lock:
            if run_id in self.taken:
                return True
        try:
            return bool(self.client.exists(reaped_key(run_id)))
        except redis.RedisError:
            return False  # Redis away: its outcome is recorded, as before this check

    def renew(self) -> None:
        """One renewal of every held lease, in one round trip; XX: a lease a watcher has
        taken away is not put back."""
        with self.lock:
            runs = sorted(self.held - self.taken)
        if not runs:
            return
        expires = time.time() + settings.FRLM_RUN_LEASE_TTL_S
        pipe = self.client.pipeline(transaction=False)
        for run_id in runs:
            pipe.zadd(LEASES_KEY, {run_id: expires}, xx=True, ch=True)
        for run_id, renewed in zip(runs, pipe.execute(), strict=True):
            if renewed:
                continue
            if not self.client.exists(reaped_key(run_id)):
                log.warning("run %s: its lease was lost with Redis's data; taking it again", run_id)
                self.client.zadd(LEASES_KEY, {run_id: expires})
                continue
            log.error("run %s: its lease was taken away as lapsed; stopping it", run_id)
            with self.lock:
                self.taken.add(run_id)
            request_cancel(self.client, run_id)

    def _loop(self) -> None:
        while True:
            with self.lock:
                if not self.held:
                    self.thread = None
                    return
            try:
                self.renew()
            except redis.RedisError as exc:
                log.warning("lease renewal failed: %s (retrying)", exc)
            time.sleep(settings.FRLM_RUN_LEASE_RENEW_S)


_keeper: LeaseKeeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> LeaseKeeper:
    """This process's LeaseKeeper."""
    global _keeper
    with _keeper_lock:
        if _keeper is None:
            _keeper = LeaseKeeper()
        return _keeper


# --- the watcher's side ----------------------------------------------------------------
def leases_reap(client: redis.Redis, *, by: str) -> list[str]:
    """Fail every run whose lease has lapsed; the runs this caller failed."""
    failed = []
    for raw in client.zrangebyscore(LEASES_KEY, "-inf", time.time()):
        run_id = raw.decode() if isinstance(raw, bytes) else raw
        # Several watchers may see the same lapse: the one whose ZREM took it acts.
        if not client.zrem(LEASES_KEY, run_id):
            continue
        holder = client.hget(HOLDERS_KEY, run_id)
        holder = holder.decode() if isinstance(holder, bytes) else (holder or "")
        try:
            if run_abandon(client, run_id, lapsed_message(holder), by=by):
                failed.append(run_id)
        except Exception:
            # The database or Redis failed it half-way (SQLite locked under load): the
            # lapse goes back in the set for the next round, this watcher's or another's.
            # Taken out for good, it left the run `running` with its conductor dead.
            log.exception("run %s: its lapsed lease could not be acted on; next round", run_id)
            client.zadd(LEASES_KEY, {run_id: 0}, nx=True)
            continue
        client.hdel(HOLDERS_KEY, run_id)
    return failed


def run_abandon(client: redis.Redis, run_id: str, reason: str, *, by: str) -> bool:
    """1. fail the run if it is still running (conditional: a run that finished keeps its
    outcome), 2. tell any of its work still queued to stop, 3. end its open spans as
    `abandoned` and record Run.Done with the reason. False when the run was not running."""
    client.set(reaped_key(run_id), by, ex=REAPED_TTL_S)
    failed = Run.objects.filter(id=run_id, status=Run.Status.RUNNING).update(
        status=Run.Status.FAILED, error=reason, finished=timezone.now()
    )
    if not failed:
        client.delete(open_spans_key(run_id))
        return False
    request_cancel(client, run_id)
    # What it spent, from its trace: its conductor took its totals and receipts' summary
    # with it (runs/salvage.py).
    spent = spend_salvage(client, run_id)
    spans_abandon(client, run_id, reason, by=by, spent=spent)
    log.warning("run %s failed: %s", run_id, reason)
    return True


def spans_abandon(
    client: redis.Redis, run_id: str, reason: str, *, by: str, spent: dict | None = None
) -> int:
    """End every span the run's conductor left open as `abandoned`, innermost first, with
    Run.Done under the run's span (with what the run spent, `spent`, as its row has it);
    how many were ended."""
    totals = {k: (spent or {}).get(k) for k in ("tokens_in", "tokens_out", "cost")}
    key = open_spans_key(run_id)
    pipe = client.pipeline(transaction=True)
    pipe.hgetall(key)
    pipe.delete(key)
    found, _ = pipe.execute()
    spans = [(_text(span_id), json.loads(raw)) for span_id, raw in found.items()]
    spans.sort(key=lambda item: (-int(item[1].get("depth") or 0), -int(item[1].get("ts") or 0)))
    emitter = Emitter(client, run_id)
    now = time.time_ns()
    with emitter.batch():
        for span_id, span in spans:
            if span.get("name") == "Run.Init":
                emitter.instant(
                    "Run.Done", parent=span_id, status="error", payload=reason, error=reason,
                    abandoned_by=by, **{k: v for k, v in totals.items() if v is not None},
                )  # fmt: skip
            emitter.emit(
                span.get("name") or "Run.Init",
                "end",
                span_id=span_id,
                parent=span.get("parent_id"),
                depth=int(span.get("depth") or 0),
                status="abandoned",
                venue=span.get("venue"),
                worker_id=span.get("worker_id"),
                ms=(now - int(span.get("ts") or now)) / 1e6,
                error=reason,
                abandoned_by=by,
            )
    return len(spans)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LeaseWatch(threading.Thread):
    """Fails runs whose lease lapsed, every WATCH_EVERY_S, for as long as its process
    lives. Started by the web server and by each conductor, so one dead conductor's runs are
    failed by whoever is still up."""

    def __init__(self, name: str) -> None:
        super().__init__(name="frlm-lease-watch", daemon=True)
        self.by = name

    def run(self) -> None:
        while True:
            try:
                leases_reap(get_redis(), by=self.by)
            except Exception:
                # Redis or the database away for a moment: the next round tries again.
                log.exception("the lease watch failed a round")
            finally:
                close_old_connections()
            time.sleep(WATCH_EVERY_S)


_watch: LeaseWatch | None = None


def watch_start(name: str) -> None:
    """Start this process's lease watch (once)."""
    global _watch
    with _keeper_lock:
        if _watch is None:
            _watch = LeaseWatch(f"{name}@{socket.gethostname()}:{os.getpid()}")
            _watch.start()
