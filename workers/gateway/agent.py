"""The gateway's worker side: a worker on another machine that knows only the server's URL,
its enrolment token and its own key.

register (HTTP, workers/client.py) -> open the gateway's WebSocket and sign the server's
challenge -> run each job it is sent in a pool of `slots` threads (up to the welcome's
`buffer` more wait their turn, each said when it starts), reporting its span
events and signed result (results that finish together go in one message, `Outbox`) ->
heartbeat with its figures -> on a dropped connection, connect again -> on SIGTERM or
SIGINT: say it is draining (the server sends nothing new), finish what it holds, send its
results, deregister. Its model endpoint is its own: an OpenAI-compatible server it
was given (--base-url), or the simulated model running in this process."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import websockets
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.sync.client import ClientConnection, connect

from frlm_web import collector
from frlm_web.redis_client import within
from traces.emitter import Emitter, Event, Span
from workers import keys, signing
from workers.backends import ModelError, ModelSpec, chat
from workers.client import LEAVE_S, HttpControl, Registered
from workers.execution import ok_result, reply_fields, served, signed
from workers.gateway.protocol import (
    MAX_MESSAGE_BYTES,
    MAX_RESULTS,
    PATH,
    VERSION,
    batches,
    decode,
    encode,
    hello_claim,
    speaks_batches,
    takes_returns,
)
from workers.jobs import Job, Result
from workers.services import Registration
from workers.sim.device import on_device
from workers.slots import Tally

log = logging.getLogger(__name__)

RECONNECT_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # waits between attempts, the last repeated
BACK_OFF_POLL_S = 0.1  # how soon a signal ends a wait between attempts
RECV_WAIT_S = 0.5  # how often the receive loop looks up from the socket
# The server pings every heartbeat: this many heartbeats (and at least SILENT_MIN_S) with
# nothing from it is a dead path whose TCP is still up (a NAT that lost its mapping), and
# the worker connects again rather than wait on it for the kernel's minutes.
SILENT_BEATS = 5
SILENT_MIN_S = 5.0
# How long a finished result waits for others to go with it, while other jobs still run:
# jobs handed over together finish together, and one message for all of them costs the
# server one WebSocket message, one decode and one Redis round trip instead of one each.
LINGER_S = 0.002


class GatewayRefused(Exception):
    """The server refused this worker (its error and what to do); connecting again will
    not help."""


class GatewayThrottled(Exception):
    """The server refused its address for a while (too many failures from it: another
    process behind the same address, say): connecting again after `wait_s` may help. The
    worker left for good on it, and every worker behind that address with it (a review)."""

    def __init__(self, message: str, wait_s: float) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class Relay(Emitter):
    """An emitter whose events go over the gateway with the next message, not to Redis."""

    def __init__(self, run_id: str, *, venue: str, worker_id: str) -> None:
        super().__init__(None, run_id, venue=venue, worker_id=worker_id)  # type: ignore[arg-type]
        self.outbox: list[Event] = []

    def send(self, events: list[Event], pipe: Any = None) -> None:
        if self.enabled:
            self.outbox.extend(events)

    def take(self) -> list[Event]:
        events, self.outbox = self.outbox, []
        return events


class Outbox:
    """Results on their way to the server, sent by one thread: each with whatever others are
    ready by then, waiting up to LINGER_S for more while `busy()` (other jobs run)."""

    def __init__(
        self, send: Callable[[list[dict[str, Any]]], None], busy: Callable[[], bool]
    ) -> None:
        self.send = send
        self.busy = busy
        self.items: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.pending = 0  # put and not yet sent
        threading.Thread(target=self._run, name="frlm-outbox", daemon=True).start()

    def put(self, item: dict[str, Any]) -> None:
        with self.lock:
            self.pending += 1
        self.items.put(item)

    def empty(self) -> bool:
        with self.lock:
            return self.pending == 0

    def _run(self) -> None:
        while True:
            batch = [self.items.get()]
            deadline = time.monotonic() + LINGER_S
            while len(batch) < MAX_RESULTS:
                wait = deadline - time.monotonic() if self.busy() else 0.0
                try:
                    batch.append(
                        self.items.get(timeout=wait) if wait > 0 else self.items.get_nowait()
                    )
                except queue.Empty:
                    break
            try:
                self.send(batch)
            except Exception:
                log.exception("could not send %d result(s)", len(batch))
            with self.lock:
                self.pending -= len(batch)


def ws_url(server: str) -> str:
    base = server.rstrip("/")
    scheme, _, rest = base.partition("://")
    return ("wss" if scheme == "https" else "ws") + "://" + rest + PATH


@dataclass
class GatewayAgent:
    """One worker on the gateway. `run()` blocks until the worker stops."""

    server: str
    control: HttpControl
    registration: Registration
    key: Ed25519PrivateKey
    registered: Registered | None = None
    tally: Tally = field(default_factory=Tally)
    draining: bool = False
    stopped: threading.Event = field(default_factory=threading.Event)
    sessions: int = 0
    _ws: ClientConnection | None = None
    _session_token: object | None = None  # the live session; a dropped one's jobs are not run
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    _batched: bool = False  # the server speaks protocol version 2 (`results`)
    _outbox: Outbox | None = None
    # Jobs in its buffer the server took back (`cancel`): skipped when their turn comes.
    _cancelled: set[tuple[str, str]] = field(default_factory=set)
    # Jobs not answered yet, by the session that gave them: those of a session that
    # dropped are given back on the next (protocol.py, version 4).
    _given: dict[tuple[str, str], object] = field(default_factory=dict)
    _grants: dict[tuple[str, str], str] = field(default_factory=dict)  # each given job's
    _given_lock: threading.Lock = field(default_factory=threading.Lock)
    _returns: bool = False  # the server takes `returned`

    @property
    def worker_id(self) -> str:
        assert self.registered is not None
        return self.registered["worker_id"]

    @property
    def venue(self) -> str:
        assert self.registered is not None
        return self.registered["venue"]

    def run(self) -> None:
        """1. register, 2. serve the gateway's jobs, connecting again after a drop, until a
        signal, 3. finish what it holds and deregister."""
        self.registered = self.control.register(self.registration)
        signing.use_process_key(self.key)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        slots = int(self.registration["concurrency"])
        collector.settle()  # what it loaded to start is never walked again
        self._outbox = Outbox(self._send_results, lambda: self.tally.inflight > 0)
        log.warning(
            "worker %s registered as %s in venue %s; joining the gateway at %s with %d slots",
            self.worker_id,
            self.registration["name"],
            self.venue,
            ws_url(self.server),
            slots,
        )
        with ThreadPoolExecutor(slots, thread_name_prefix="frlm-job") as pool:
            attempt = 0
            while not self.stopped.is_set():
                sessions = self.sessions
                try:
                    self._session(pool, slots)
                    attempt = 0
                    if self.draining:
                        break
                except GatewayThrottled as exc:
                    log.warning("%s; connecting again in %g s", exc, exc.wait_s)
                    self._back_off(exc.wait_s)
                except GatewayRefused:
                    self.stopped.set()
                    raise
                except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
                    if self.draining:
                        break
                    if self.sessions != sessions:
                        attempt = 0  # it was welcomed: a new drop starts the back-off again
                    wait = RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)]
                    attempt += 1
                    log.warning("gateway connection lost (%s); connecting again in %g s", exc, wait)
                    self._back_off(wait)
        self.leave()

    def _back_off(self, wait: float) -> None:
        """Wait before connecting again, cut short by a signal: with the server gone, a
        SIGTERM waited out the back-off (5 s) before the worker left. Polled, since the
        handler may only set a flag (an Event's lock may be held under it)."""
        until = time.monotonic() + wait
        while not self.draining and not self.stopped.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            self.stopped.wait(min(left, BACK_OFF_POLL_S))

    def _on_signal(self, signum: int, _frame: Any) -> None:
        log.warning("signal %d: finishing what this worker holds, then leaving", signum)
        self.draining = True

    # --- one connection -----------------------------------------------------------------
    def _session(self, pool: ThreadPoolExecutor, slots: int) -> None:
        with connect(
            ws_url(self.server),
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=10,
            close_timeout=2,
            compression=None,
            # The gateway pings each heartbeat; the library's own pings are not needed.
            ping_interval=None,
        ) as ws:
            challenge = self._expect(ws, "challenge")
            sig = keys.sign(self.key, hello_claim(self.worker_id, str(challenge["nonce"])))
            ws.send(
                encode(
                    {
                        "type": "hello",
                        "worker_id": self.worker_id,
                        "nonce": challenge["nonce"],
                        "sig": sig,
                        "slots": slots,
                        "version": VERSION,
                    }
                )
            )
            self._batched = speaks_batches(challenge.get("version"))
            self._returns = takes_returns(challenge.get("version"))
            welcome = self._expect(ws, "welcome")
            self._ws = ws
            self.sessions += 1
            session = self._session_token = object()
            try:
                self._give_back(session)
                self._converse(ws, pool, float(welcome.get("heartbeat_s") or 1.0), session)
            finally:
                # Its jobs not started yet are the server's to give again, not this
                # worker's to run late beside the next session's (_execute drops them).
                self._session_token = None

    def _give_back(self, session: object) -> None:
        """Every job of a dropped session not answered on it, given back: the server now
        connected never gave them and would refuse their results, and without a word the
        conductor waits out their timeout (a web server killed and started again before
        this worker's presence lapsed). To an older server, nothing is said."""
        with self._given_lock:
            stale = [key for key, given in self._given.items() if given is not session]
            grants = [self._grants.pop(key, "") for key in stale]
            for key in stale:
                del self._given[key]
        if not stale or not self._returns:
            return
        jobs = [
            {"run_id": run_id, "sq_id": sq_id, "grant": grant}
            for (run_id, sq_id), grant in zip(stale, grants, strict=True)
            if grant
        ][:MAX_RESULTS]
        if not jobs:
            return
        self._send({"type": "returned", "jobs": jobs})
        log.warning("gave back %d job(s) of the session that dropped", len(jobs))

    def _converse(
        self, ws: ClientConnection, pool: ThreadPoolExecutor, every: float, session: object
    ) -> None:
        """One session's receive loop, until it drains, drops, or hears nothing from the
        server for SILENT_BEATS heartbeats (TimeoutError: the caller connects again)."""
        silent_s = max(SILENT_BEATS * every, SILENT_MIN_S)
        self._beat()
        next_beat = time.monotonic() + every
        heard = time.monotonic()
        announced_drain = False
        while True:
            if self.draining and not announced_drain:
                self._beat()
                announced_drain = True
            if self.draining and self.tally.inflight == 0 and self._sent_all():
                return
            if time.monotonic() >= next_beat:
                self._beat()
                next_beat = time.monotonic() + every
            try:
                raw = ws.recv(timeout=RECV_WAIT_S)
            except TimeoutError:
                if time.monotonic() - heard > silent_s:
                    raise TimeoutError(
                        f"nothing from the server for {silent_s:g} s (it pings every {every:g} s)"
                    ) from None
                continue
            heard = time.monotonic()
            self._on_message(decode(raw), pool, session)

    def _on_message(
        self, message: dict[str, Any], pool: ThreadPoolExecutor, session: object
    ) -> None:
        kind = message["type"]
        if kind in ("job", "jobs"):
            for job in message["jobs"] if kind == "jobs" else [message["job"]]:
                self.tally.begin(_tally_key(job))
                with self._given_lock:
                    self._given[(job["run_id"], job["sq_id"])] = session
                    if isinstance(job.get("grant"), str):
                        self._grants[(job["run_id"], job["sq_id"])] = job["grant"]
                pool.submit(self._execute, job, session)
        elif kind == "cancel":
            for item in message.get("jobs") or []:
                if isinstance(item, dict):
                    self._cancelled.add((str(item.get("run_id")), str(item.get("sq_id"))))
        elif kind == "refused":
            for item in message.get("results") or []:
                log.warning(
                    "the server refused the result of %s: %s (%s)",
                    item.get("sq_id"),
                    item.get("error"),
                    message.get("fix"),
                )
        elif kind == "ping":
            self._send({"type": "pong", "t": message.get("t")})
        elif kind == "error":
            raise GatewayRefused(f"{message.get('error')}. What to do: {message.get('fix')}")

    def _expect(self, ws: ClientConnection, kind: str) -> dict[str, Any]:
        message = decode(ws.recv(timeout=10))
        retry = message.get("retry_after")
        if message["type"] == "error" and isinstance(retry, int | float) and retry > 0:
            wait_s = min(float(retry), 3600.0)  # a long window still ends: it tries again
            raise GatewayThrottled(f"the server refused for now: {message.get('error')}", wait_s)
        if message["type"] == "error":
            raise GatewayRefused(f"{message.get('error')}. What to do: {message.get('fix')}")
        if message["type"] != kind:
            raise GatewayRefused(f"the server sent {message['type']!r} where {kind!r} was due")
        return message

    def _send(self, message: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            return
        with self._send_lock:
            try:
                ws.send(encode(message))
            except (OSError, websockets.exceptions.WebSocketException) as exc:
                # The receive loop sees the drop too and connects again; the server has
                # already given this job to another worker.
                log.warning("could not send %s: %s", message.get("type"), exc)

    def _send_results(self, items: list[dict[str, Any]]) -> None:
        """Results in `results` messages to a server of version 2 (each encoded once), one
        `done` a message to an older one; only those of jobs the live session gave (a
        dropped one's were given back), and a job is answered once its result is sent."""
        items, answered = self._of_this_session(items)
        if not items:
            return
        if not self._batched:
            for item in items:
                self._send({"type": "done", **item})
        else:
            ws = self._ws
            if ws is None:
                return
            for text in batches([encode(item) for item in items], '"type":"results","results":'):
                with self._send_lock:
                    try:
                        ws.send(text)
                    except (OSError, websockets.exceptions.WebSocketException) as exc:
                        log.warning("could not send %d result(s): %s", len(items), exc)
                        return
        with self._given_lock:
            for key in answered:
                self._given.pop(key, None)
                self._grants.pop(key, None)

    def _of_this_session(
        self, items: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """The items of jobs the live session gave, and the keys of those that answer one."""
        session = self._session_token
        keep: list[dict[str, Any]] = []
        answered: list[tuple[str, str]] = []
        with self._given_lock:
            for item in items:
                run_id = item.get("run_id") or (item.get("result") or {}).get("run_id")
                key = (str(run_id), str(item.get("sq_id")))
                if session is None or self._given.get(key) is not session:
                    continue
                keep.append(item)
                if "result" in item:
                    answered.append(key)
        return keep, answered

    def _sent_all(self) -> bool:
        return self._outbox is None or self._outbox.empty()

    def _beat(self) -> None:
        self._send({"type": "beat", "figures": self.tally.figures(draining=self.draining)})

    # --- one job ------------------------------------------------------------------------
    def _execute(self, job: Job, session: object | None = None) -> None:
        key = (job["run_id"], job["sq_id"])
        if session is not None and session is not self._session_token:
            # Given over a connection that has dropped, and not started before it did: the
            # server has given it to another worker; run late, it would hold up this
            # session's jobs for a result the server refuses.
            self.tally.end(_tally_key(job), record=False)
            return
        if key in self._cancelled:
            # Taken back while it waited in the buffer: nobody wants it; not a word of it.
            self._cancelled.discard(key)
            with self._given_lock:
                self._given.pop(key, None)
                self._grants.pop(key, None)
            self.tally.end(_tally_key(job))
            return
        sent: dict[str, Any] = job  # type: ignore[assignment]  (the gateway's fields too)
        if sent.get("queued") and self._outbox is not None:
            # It waited in this worker's buffer (protocol.py, version 3): the server opens
            # its Execute span and tells the conductor it started when it hears this,
            # most often in the message with the result of the job before it in this slot.
            self._outbox.put({"sq_id": job["sq_id"], "run_id": job["run_id"], "started": True})
        done = None
        try:
            done = self._work(job)
        except Exception:
            log.exception("sub-query %s failed in this worker", job.get("sq_id"))
        finally:
            self.tally.end(_tally_key(job))
            self._cancelled.discard(key)  # a cancel that came once it had started
        if done is not None:
            result, events = done
            item = {"sq_id": job["sq_id"], "result": result, "events": events}
            if self._outbox is not None:
                self._outbox.put(item)
            else:
                self._send({"type": "done", **item})

    def _work(self, job: Job) -> tuple[Result, list[Event]]:
        """Fragments noted, the model asked, the Execute span (opened by the server) ended:
        the signed result and the span's events, to go in one message."""
        relay = Relay(job["run_id"], venue=self.venue, worker_id=self.worker_id)
        base: Result = {
            "run_id": job["run_id"],
            "sq_id": job["sq_id"],
            "venue": self.venue,
            "worker_id": self.worker_id,
        }
        try:
            spec = on_device(served(ModelSpec.from_dict(job["model"])), attempt=job["attempt"])
        except ModelError as exc:
            return signed({**base, "status": "error", "error": str(exc)}), []
        extra: dict[str, Any] = job  # type: ignore[assignment]
        # The server opened the Execute span as it sent the job; this worker ends it.
        span = Span(
            relay,
            "SubQuery.Execute",
            str(extra["execute_span"]),
            job["submit_span"],
            job["depth"],
            time.time_ns(),
        )
        error = extra.get("error")
        if not error:
            with relay.batch():
                for item in extra.get("loaded") or []:
                    relay.instant(
                        "Env.LoadFragment", parent=span.span_id, depth=job["depth"], **item
                    )
            try:
                reply = chat(
                    spec,
                    [{"role": "user", "content": extra.get("text", job["prompt"])}],
                    timeout=job["timeout_s"],
                    retries=1,
                )
                result = ok_result(job, base, self.worker_id, reply)
            except ModelError as exc:
                error = str(exc)
            except ValueError as exc:
                error = f"cannot attest: {exc}"
        if error:
            span.end("error", error=error, model=spec.label)
            return signed({**base, "status": "error", "error": error}), relay.take()
        span.end("ok", model=spec.label, **reply_fields(reply))
        return signed(result), relay.take()

    # --- leaving ------------------------------------------------------------------------
    def leave(self) -> None:
        """Close the session and deregister, within LEAVE_S: a server that does not answer
        (another host gone dark) cannot hold the exit."""
        if self._ws is not None:
            self._ws.close()
        if not within(LEAVE_S, self._deregister, "frlm-leave"):
            log.error(
                "could not deregister within %g s (the server is not answering); leaving "
                "without: the gateway drops a worker whose beats stop",
                LEAVE_S,
            )

    def _deregister(self) -> None:
        try:
            self.control.deregister(self.worker_id)
            log.warning("worker %s deregistered", self.worker_id)
        except Exception as exc:  # noqa: BLE001 - leaving must not fail the exit
            log.error("could not deregister: %s (the gateway dropped it when it left)", exc)


def _tally_key(job: Job) -> str:
    # Two runs' sub-queries may share an sq_id.
    return f"{job['run_id']}/{job['sq_id']}"


def own_simulated_model() -> str:
    """Start the simulated model in this process, on loopback, and make it this worker's
    endpoint: a worker on another machine has no other (the server's is not reachable,
    and a job never names one). Returns its base URL."""
    from workers.sim.server import base_url, make_server  # noqa: PLC0415 - only when needed

    server = make_server("127.0.0.1", 0)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True, name="frlm-sim"
    ).start()
    url = base_url(server)
    os.environ["FRLM_WORKER_BACKEND"] = json.dumps({"kind": "sim", "model": "", "base_url": url})
    return url
