"""A broker worker's round trips to Redis for its jobs, made by one thread: each slot hands
its finished job's span end and signed result over (workers/jobrun.py's `Deliver`) and is
free at once, and the consumer asks it to open the jobs it took (`round_trip`). Each round
trip carries everything handed over since the last one, first the results (one EVAL for
the events of every job in it, an XADD per result), then the opens.

A worker's slots end together (a wave of alike sub-queries): each paid a round trip of its
own for its result, and the job that took its slot another to open, one after another
under the interpreter lock, before the slot's next model call could start. A result is
always sent before the open of the job that took its slot (it was handed over before the
slot was free), so the run's result stream never shows a worker running more jobs than
its slots.

What is handed over but not yet sent when the process is killed is lost as what was still
running is: the conductor sends those jobs elsewhere when the worker's alive line drops.
On a drain (`close`) everything handed over is sent before the worker leaves."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import redis

from traces.emitter import append
from traces.schema import Event
from workers.jobs import Result, encode_result

log = logging.getLogger(__name__)

MOST = 64  # results in one round trip
_STOP = None


@dataclass(slots=True)
class _Result:
    """A slot's finished job, handed over: its events, its run's result stream, its result."""

    events: list[Event]
    stream: str
    result: Result


@dataclass(slots=True)
class _Open:
    """The consumer's ask: the commands `fill` queues, their replies set on `future`."""

    fill: Callable[[Any], None]
    future: Future[list[Any]]


class Delivery:
    """`deliver(events, stream, result)` and `round_trip(fill)` for many threads; a thread
    of its own sends them."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._items: queue.SimpleQueue[_Result | _Open | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="frlm-delivery", daemon=True)
        self._thread.start()

    def __call__(self, events: list[Event], stream: str, result: Result) -> None:
        self._items.put(_Result(events, stream, result))

    def round_trip(self, fill: Callable[[Any], None]) -> list[Any]:
        """The replies to the commands `fill` queues on a pipeline, sent after the results
        handed over before it (a RoundTrip, workers/jobrun.py); raises what Redis raised."""
        future: Future[list[Any]] = Future()
        self._items.put(_Open(fill, future))
        return future.result()

    def close(self, timeout: float | None = None) -> bool:
        """Send what was handed over, then stop; whether it finished within `timeout`."""
        self._items.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._items.get()
            batch: list[_Result | _Open] = []
            while item is not _STOP:
                batch.append(item)
                if len(batch) >= MOST:
                    break
                try:
                    item = self._items.get_nowait()
                except queue.Empty:
                    break
            stopping = item is _STOP
            if not batch:
                continue
            try:
                self._send(batch)
            except Exception as exc:  # a bug: said, and no caller is left waiting on it
                log.exception("worker: a round trip failed")
                for item in batch:
                    if isinstance(item, _Open) and not item.future.done():
                        item.future.set_exception(exc)

    def _send(self, batch: list[_Result | _Open]) -> None:
        results = [item for item in batch if isinstance(item, _Result)]
        opens = [item for item in batch if isinstance(item, _Open)]
        pipe = self.client.pipeline(transaction=False)
        append([event for item in results for event in item.events], pipe)
        for item in results:
            pipe.xadd(item.stream, encode_result(item.result))  # type: ignore[arg-type]
        spans = []
        for ask in opens:
            begin = len(pipe)
            ask.fill(pipe)
            spans.append((begin, len(pipe)))
        try:
            replies = pipe.execute()
        except redis.RedisError as exc:
            # The client rode the outage out as long as it does (frlm_web/redis_client.py):
            # these results are lost, and their conductors try the jobs again at their
            # timeouts, as for a worker that died; the jobs being opened are not started.
            if results:
                log.error("worker: %d result(s) could not be delivered: %s", len(results), exc)
            for ask in opens:
                ask.future.set_exception(exc)
            return
        for ask, (begin, end) in zip(opens, spans, strict=True):
            ask.future.set_result(replies[begin:end])
