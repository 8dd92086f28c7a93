"""A broker worker's slots as tasks of one asyncio event loop, in a thread of its own.

FRLM's own consumer (workers/consumer.py) takes and opens jobs on its thread; each opened
job then holds its slot (workers/slots.py) while its model call runs here, through the
SDK's AsyncOpenAI over one kept-alive connection per task at a time
(workers/http_transport.py's AsyncKeptAliveTransport). Sixteen slot threads, each with its
own connection and client call, spent a third more CPU per call than sixteen tasks of one
loop (bench/modelcall.py), and handed the interpreter lock around on every reply; a job
here is a task, started with the others taken with it in one wake of the loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

from workers.slots import Slots

log = logging.getLogger(__name__)

AsyncWork = Callable[[], Awaitable[bool]]  # a job's work: whether it called its model
STOP_S = 5.0  # for the loop's thread to end once its jobs have


class LoopSlots:
    """Runs jobs that already hold their slots (tokens) on the loop; `shutdown` waits for
    the ones running."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._serve, name="frlm-slots", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self, jobs: list[tuple[str, AsyncWork]]) -> None:
        """Start these jobs (each with its slot's token) on the loop, in one wake of it."""
        self.loop.call_soon_threadsafe(self._spawn, jobs)

    def _spawn(self, jobs: list[tuple[str, AsyncWork]]) -> None:
        for token, work in jobs:
            task = self.loop.create_task(self._run(token, work))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, token: str, work: AsyncWork) -> None:
        ran = False
        try:
            ran = await work()
        except Exception as exc:
            # Said in the log, as a slot thread's error is; its conductor learns of the
            # job at its timeout.
            log.error("worker: a job failed: %r", exc)
        finally:
            self.slots.leave(token, ran=ran)

    def shutdown(self) -> None:
        """Wait for the jobs started, then stop the loop."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._drain(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_S)

    async def _drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
