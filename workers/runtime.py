"""The worker runtime: a registered worker's life around its consumer (Celery's, or FRLM's
own with `--consumer frlm`, workers/consumer.py).

register -> consume `worker.<id>` and `venue.<name>` -> heartbeat every heartbeat_s with
load, memory, in-flight and recent latency -> on SIGTERM announce draining, finish what
is running, then deregister (which takes it out of presence at once, so the conductor
re-dispatches whatever it had prefetched but not started)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery.signals import (
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import close_old_connections

from frlm_web import collector
from frlm_web.redis_client import get_redis, within
from workers import keys, signing, slots
from workers.alive import ALIVE_ENV, AliveLine
from workers.client import LEAVE_S, Control, ControlError, Registered
from workers.jobs import Job
from workers.services import Registration
from workers.slots import Tally

log = logging.getLogger(__name__)


def default_key_file(venue: str, name: str) -> Path:
    return Path(settings.DATA_DIR) / "workers" / venue / f"{name}.key"


@dataclass
class WorkerRuntime:
    """One registered worker in this process. `run()` blocks until the worker stops."""

    control: Control
    registration: Registration
    key: Ed25519PrivateKey
    trusted_prefetch: int = 2
    # A worker on another machine may consume the broker only for a trusted venue; one of
    # an untrusted venue joins through the gateway (workers/gateway).
    require_trusted: bool = False
    # Whose loop takes its jobs: "frlm" (workers/consumer.py: only for free slots, several
    # at once, no prefetch) or "celery" (Celery's worker, its pool and remote control).
    consumer: str = "frlm"
    registered: Registered | None = None
    tally: Tally = field(default_factory=Tally)
    draining: bool = False
    stopping: threading.Event = field(default_factory=threading.Event)
    beats: int = 0
    _thread: threading.Thread | None = None
    _alive: AliveLine | None = None

    def run(self) -> None:
        """1. register, 2. make this process sign its results and name itself in them,
        3. run the Celery consumer on the worker's own queue and its venue's queue, with
        heartbeats from the moment it consumes until it has finished its work."""
        self.registered = reg = self.control.register(self.registration)
        if self.require_trusted and not reg["trusted"]:
            self.control.deregister(reg["worker_id"])
            raise ControlError(
                403,
                f"venue {reg['venue']} is not trusted: its workers take jobs through the "
                "gateway, never from the broker",
                "drop --connect broker (the worker then joins through the gateway), or have "
                "the operator mark the venue trusted",
            )
        log.warning(
            "worker %s registered as %s in venue %s; consuming %s and %s",
            reg["worker_id"],
            self.registration["name"],
            reg["venue"],
            reg["queue"],
            reg["venue_queue"],
        )
        signing.use_process_key(self.key)
        # Its jobs hold these slots however they came (one per message or in bundles).
        self.tally = slots.configure(self.registration["concurrency"]).tally
        os.environ["FRLM_VENUE"] = reg["venue"]
        os.environ["FRLM_WORKER_ID"] = reg["worker_id"]
        # Up before it takes any job: its jobs' "started" say it can be watched this way.
        if settings.FRLM_WORKER_ALIVE_LINE:
            self._open_alive_line(reg["worker_id"])
        from workers.backends import preload

        preload()  # the model client, before the first job
        if self.consumer in ("frlm", "frlm-threads"):
            self._consume(reg)
            return
        self._connect()

        from frlm_web.celery import run_worker

        run_worker(
            queue=f"{reg['queue']},{reg['venue_queue']}",
            concurrency=self.registration["concurrency"],
            name=f"{self.registration['name']}-{reg['worker_id']}",
            group=None,
            info={},
            at_most_once=True,
            # An untrusted worker holds no more than it runs: what it holds is work the
            # conductor must wait on and re-dispatch if the worker vanishes.
            prefetch=self.trusted_prefetch if reg["trusted"] else 1,
        )

    def _consume(self, reg: Registered) -> None:
        """FRLM's own consumer on the worker's queues (workers/consumer.py) until SIGTERM or
        SIGINT, which drain it as Celery's warm shutdown does: nothing more is taken, what
        runs finishes, then the worker leaves."""
        from workers.aslots import LoopSlots
        from workers.consumer import QueueConsumer
        from workers.delivery import Delivery
        from workers.jobrun import open_jobs

        def on_signal(signum: int, _frame: Any) -> None:
            # Flags only: the handler runs between two bytecodes of the main thread, which
            # may hold a lock it would need.
            self._shutting_down()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._ready()
        collector.settle()  # what it loaded to start is never walked again
        client = get_redis()
        deliver = Delivery(client)

        on_loop = self.consumer == "frlm"

        def opener(jobs: list[Job]) -> list[Callable[[], bool | Awaitable[bool]] | None]:
            opened = open_jobs(client, jobs, deliver, deliver.round_trip)
            return [
                None if o is None else functools.partial(o.awork if on_loop else o.work, deliver)
                for o in opened
            ]

        try:
            QueueConsumer(
                get_redis(ride_out=False),
                [reg["queue"], reg["venue_queue"]],
                slots.current(),
                opener,
                runner=LoopSlots(slots.current()) if on_loop else None,
            ).run(lambda: self.draining)
        finally:
            log.warning("worker: draining")
            # What the slots handed over goes out before the worker leaves.
            if not deliver.close(LEAVE_S):
                log.error("worker: results still undelivered after %g s; leaving", LEAVE_S)
            self._shutdown()

    def _open_alive_line(self, worker_id: str) -> None:
        """Subscribe this process's alive line; where Redis refuses it (a role without the
        channel, from an older ACL file), its death is known from presence alone."""
        try:
            self._alive = AliveLine(get_redis(), worker_id)
        except redis.RedisError as exc:
            log.warning("no alive line (%s): a kill is noticed when presence lapses", exc)
            return
        self._alive.start()
        os.environ[ALIVE_ENV] = "1"

    # --- Celery's signals ---------------------------------------------------------------
    def _connect(self) -> None:
        worker_ready.connect(self._ready, weak=False)
        worker_shutting_down.connect(self._shutting_down, weak=False)
        worker_shutdown.connect(self._shutdown, weak=False)

    def _ready(self, **_: Any) -> None:
        self.beat()  # in presence the moment it consumes, not a beat later
        self._thread = threading.Thread(target=self._beat_loop, name="frlm-heartbeat", daemon=True)
        self._thread.start()

    def _shutting_down(self, **_: Any) -> None:
        # Runs in the signal handler: only flags; the heartbeat thread says it. Jobs that
        # have no slot yet (a bundle's) are left, as Celery leaves what it prefetched.
        self.draining = True
        slots.current().draining = True

    def _shutdown(self, **_: Any) -> None:
        """The pool has finished its work: stop beating, then leave, within LEAVE_S."""
        self.stopping.set()
        if self._thread is not None:
            # A beat waiting out a Redis outage (get_redis rides one out for a minute)
            # is given up: the thread is a daemon, and a beat after the deregistration is
            # refused (the worker is barred from presence).
            self._thread.join(timeout=LEAVE_S / 2)
        if not within(LEAVE_S, self.leave, "frlm-leave"):
            log.error(
                "could not deregister within %g s (Redis or the server is not answering); "
                "leaving without: the conductor sees this worker gone when its alive line "
                "or presence lapses",
                LEAVE_S,
            )
        if self._alive is not None:
            self._alive.stop()

    # --- heartbeats ---------------------------------------------------------------------
    def beat(self) -> bool:
        """One heartbeat; False when the server no longer knows this worker."""
        assert self.registered is not None
        try:
            self.control.heartbeat(
                self.registered["worker_id"], self.tally.figures(draining=self.draining)
            )
        except ControlError as exc:
            if exc.gone:
                log.error("the server dropped this worker: %s; stopping", exc)
                return False
            log.warning("heartbeat failed: %s", exc)
        except Exception:
            # A database or Redis hiccup must not end the heartbeats; the next one retries.
            log.exception("heartbeat failed")
        self.beats += 1
        return True

    def _beat_loop(self) -> None:
        assert self.registered is not None
        every = float(self.registered["heartbeat_s"])
        try:
            while not self.stopping.wait(every):
                if not self.beat():
                    # Deregistered under us (an operator, a superseding restart): stop
                    # consuming, finish what runs, exit.
                    self.stopping.set()
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
        finally:
            close_old_connections()

    def leave(self) -> None:
        assert self.registered is not None
        try:
            self.control.deregister(self.registered["worker_id"])
            log.warning("worker %s deregistered", self.registered["worker_id"])
        except ControlError as exc:
            if not exc.gone:
                log.error("could not deregister: %s (its presence expires by itself)", exc)
        except Exception:
            log.exception("could not deregister (its presence expires by itself)")


def load_key(path: Path) -> Ed25519PrivateKey:
    try:
        return keys.load_or_create(path)
    except keys.BadKey as exc:
        raise ValueError(f"the key file {path} is not an FRLM worker key: {exc}") from exc
    except OSError as exc:  # a folder, a path through a file, no such folder, no right
        raise ValueError(
            f"the key file {path} cannot be read or made ({exc.strerror}): give --key-file "
            "a file in a folder this user can write, or leave it out for the default"
        ) from exc
