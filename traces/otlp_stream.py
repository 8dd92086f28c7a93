"""Streaming every finished run to an OpenTelemetry collector (FRLM_OTLP_ENDPOINT).

The recorder calls `Streamer.stored` with each batch it has made durable, before it
acknowledges it. The streamer notes the runs whose root ended (Run.Init's end) in a
small state file, then pushes them from its own thread: reading the run back from the
store (Parquet segments, readable by any thread or process), exporting it as OTLP
(`traces/otlp.py`) and POSTing it (`traces/otlp_push.py`). A push that fails is retried
with a doubling delay, RETRIES times at most; storing never waits for any of it.

What it guarantees: every run whose root end the recorder stores while the setting is on is
pushed at least once, if the collector answers within the retry window (about 14 minutes),
across recorder restarts (a run queued but not yet pushed is pushed by the next life; a
batch stored but not acknowledged when the recorder died is read again and its runs
queued again). A run is pushed twice only if the recorder dies between the collector's
answer and the line that records it (collectors receive the same trace and span ids).
Runs that finished while the setting was off are not pushed: `frlm_export --otlp-endpoint`
sends those."""

from __future__ import annotations

import heapq
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traces import store
from traces.blobs import blob_get
from traces.otlp import to_otlp
from traces.otlp_push import HEADERS_ENV, PushError, parse_headers, push, traces_url

log = logging.getLogger("traces.otlp_stream")

ENDPOINT_ENV = "FRLM_OTLP_ENDPOINT"
HEADERS_OWN_ENV = "FRLM_OTLP_HEADERS"
PAYLOADS_ENV = "FRLM_OTLP_PAYLOADS"  # "0": prompts and replies by reference only
STATE_NAME = "otlp_stream.jsonl"  # in FRLM_TRACE_DIR
RETRIES = 10  # attempts after the first
BACKOFF_S = 1.0  # the first retry's delay; doubled each time, up to BACKOFF_MAX_S
BACKOFF_MAX_S = 300.0
PUSH_TIMEOUT_S = 30.0
KEEP_PUSHED = 10_000  # pushed runs remembered across a compaction of the state file


class StreamConfigError(ValueError):
    """The streaming settings cannot be used; the message says which and what to do."""


def from_environ(environ: Mapping[str, str], state_dir: Path) -> Streamer | None:
    """The streamer the settings ask for, or None when FRLM_OTLP_ENDPOINT is not set.
    The OpenTelemetry SDKs' OTEL_EXPORTER_OTLP_ENDPOINT does not turn streaming on: set for
    another service, it would send every prompt to that service's collector unasked."""
    endpoint = (environ.get(ENDPOINT_ENV) or "").strip()
    if not endpoint:
        return None
    try:
        traces_url(endpoint)
        own = environ.get(HEADERS_OWN_ENV)
        headers = parse_headers([], own if own is not None else environ.get(HEADERS_ENV))
    except PushError as exc:
        raise StreamConfigError(f"{ENDPOINT_ENV}/{HEADERS_OWN_ENV}: {exc}") from exc
    payloads = (environ.get(PAYLOADS_ENV) or "1").strip()
    if payloads not in ("0", "1"):
        raise StreamConfigError(f"{PAYLOADS_ENV} must be 0 or 1, got {payloads!r}")
    return Streamer(
        endpoint, headers=headers, state_path=state_dir / STATE_NAME, payloads=payloads == "1"
    )


def finished_runs(table: pa.Table) -> list[str]:
    """The runs whose root span (Run.Init) ended in a batch of the store's columns."""
    if not table.num_rows:
        return []
    ends = pc.and_(
        pc.equal(table.column("name"), "Run.Init"), pc.equal(table.column("phase"), "end")
    )
    runs = table.column("run_id").filter(pc.fill_null(ends, False))
    return sorted(set(runs.to_pylist()))


class Streamer:
    def __init__(
        self,
        endpoint: str,
        *,
        headers: dict[str, str],
        state_path: Path,
        payloads: bool = True,
        retries: int = RETRIES,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.state_path = state_path
        self.payloads = payloads
        self.retries = retries
        self.backoff_s = backoff_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due: list[tuple[float, int, str]] = []  # (when, attempt, run id), a heap
        self._known: set[str] = set()  # queued or pushed or given up: never queued again
        self._loaded = False
        self._state = None
        self._failing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pushed = 0

    # --- lifecycle -------------------------------------------------------------------
    def start(self, ready: Callable[[], bool] = lambda: True) -> None:
        """Push from a thread of this process once `ready()` (the recorder holds the store's
        lock): a recorder that refuses to start must not push the other one's runs."""
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="frlm-otlp-stream", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop pushing; what is not pushed yet stays queued in the state file."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            if self._state is not None:
                self._state.close()
                self._state = None

    # --- the recorder's hook ---------------------------------------------------------
    def stored(self, table: pa.Table) -> None:
        """Called by the recorder with a batch it has made durable, before acknowledging
        it: queues the runs that finished in it. Never raises (storing goes on)."""
        try:
            runs = finished_runs(table)
            if not runs:
                return
            with self._wake:
                self._load()
                fresh = [r for r in runs if r not in self._known]
                for run_id in fresh:
                    self._known.add(run_id)
                    self._note(run_id, "queued")
                    heapq.heappush(self._due, (time.monotonic(), 0, run_id))
                if fresh:
                    self._flush()
                    self._wake.notify_all()
        except Exception:  # noqa: BLE001 (the recorder must go on storing whatever this does)
            log.exception("otlp stream: could not queue finished runs")

    # --- the pushing thread ----------------------------------------------------------
    def _run(self, ready: Callable[[], bool]) -> None:
        while not self._stop.is_set() and not _holds(ready):
            self._stop.wait(0.2)
        with self._lock:
            self._load()
        while not self._stop.is_set():
            with self._wake:
                while not self._stop.is_set():
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(wait)
                if self._stop.is_set():
                    return
                _, attempt, run_id = heapq.heappop(self._due)
            self._attempt(run_id, attempt)

    def _attempt(self, run_id: str, attempt: int) -> None:
        try:
            spans, rejected = self._push(run_id)
        except PushError as exc:
            self._failed(run_id, attempt, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 (a run that cannot be exported: logged, kept)
            log.exception("otlp stream: cannot export run %s", run_id)
            self._failed(run_id, attempt, f"cannot export: {type(exc).__name__}")
            return
        with self._lock:
            self._note(run_id, "pushed")
            self._flush()
            self.pushed += 1
            if self._failing:
                log.warning("otlp stream: pushing to %s works again", self.endpoint)
                self._failing.clear()
        if rejected:
            log.warning(
                "otlp stream: the collector rejected %d of %d spans of run %s",
                rejected,
                spans,
                run_id,
            )

    def _push(self, run_id: str) -> tuple[int, int]:
        events = store.read_events(run_id)
        document = to_otlp(run_id, events, payload_text=blob_get if self.payloads else None)
        spans = len(document["resourceSpans"][0]["scopeSpans"][0]["spans"])
        return spans, push(document, self.endpoint, headers=self.headers, timeout=PUSH_TIMEOUT_S)

    def _failed(self, run_id: str, attempt: int, reason: str) -> None:
        """Retry later, or give up after `retries`; each kind of failure is logged once
        until a push works again (a collector down for an hour is one line, not hundreds)."""
        kind = reason.split(":", 1)[0] if reason.startswith("cannot reach") else reason[:120]
        with self._wake:
            if kind not in self._failing:
                self._failing.add(kind)
                log.warning("otlp stream: %s (retrying later)", reason)
            if attempt >= self.retries:
                self._note(run_id, "gave_up")
                self._flush()
                log.warning(
                    "otlp stream: gave up on run %s after %d attempts; push it with "
                    "`manage.py frlm_export %s --otlp-endpoint URL`",
                    run_id,
                    attempt + 1,
                    run_id,
                )
                return
            delay = min(self.backoff_s * 2**attempt, BACKOFF_MAX_S)
            heapq.heappush(self._due, (time.monotonic() + delay, attempt + 1, run_id))

    # --- the state file --------------------------------------------------------------
    def _load(self) -> None:
        """Read the state file once (under the lock): queue again what an earlier life
        queued and did not finish, and rewrite the file with only what is still needed."""
        if self._loaded:
            return
        self._loaded = True
        states: dict[str, str] = {}
        order: list[str] = []
        try:
            lines = self.state_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                run_id, state = str(entry["run"]), str(entry["state"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
            if run_id not in states:
                order.append(run_id)
            states[run_id] = state
        now = time.monotonic()
        pending = [r for r in order if states[r] == "queued"]
        done = [r for r in order if states[r] != "queued"][-KEEP_PUSHED:]
        for run_id in pending:
            heapq.heappush(self._due, (now, 0, run_id))
        self._known = set(pending) | set(done)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for run_id in done:
                fh.write(json.dumps({"run": run_id, "state": states[run_id]}) + "\n")
            for run_id in pending:
                fh.write(json.dumps({"run": run_id, "state": "queued"}) + "\n")
        os.replace(tmp, self.state_path)
        self._state = open(self.state_path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        if pending:
            log.info("otlp stream: %d finished run(s) from before a restart to push", len(pending))

    def _note(self, run_id: str, state: str) -> None:
        if self._state is not None:
            self._state.write(json.dumps({"run": run_id, "state": state}) + "\n")

    def _flush(self) -> None:
        """Into the operating system's hands: a recorder that dies keeps what it wrote."""
        if self._state is not None:
            self._state.flush()


def _holds(ready: Callable[[], bool]) -> bool:
    """ready(), with Redis out of reach (it asks Redis for the lease) as not yet."""
    try:
        return bool(ready())
    except Exception:  # noqa: BLE001 (a Redis error of any kind: asked again shortly)
        return False
