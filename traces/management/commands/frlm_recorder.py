from __future__ import annotations

import os
import signal
import threading

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, whole
from frlm_web.redis_client import get_redis
from traces import otlp_stream
from traces.recorder import LOCK_KEY, Recorder, RecorderBusy


class Command(FrlmCommand):
    help = "Run the recorder: the one writer of the trace store. Stops cleanly on SIGTERM."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--batch-max",
            type=whole(1),
            default=20000,
            help="events read and stored in one batch at most (default 20000)",
        )
        parser.add_argument(
            "--block-ms",
            type=whole(1),
            default=50,
            help="how long one read of the event stream waits for events (default 50 ms)",
        )
        parser.add_argument(
            "--nice", type=whole(0, 19), default=10, help="scheduling niceness to add (0-19)"
        )

    def handle(self, *args, batch_max: int, block_ms: int, nice: int, **options) -> None:
        # Storing can lag a little; dispatch and collection on the same machine cannot.
        os.nice(nice)
        _renice_autogroup(nice)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            streamer = otlp_stream.from_environ(os.environ, settings.FRLM_TRACE_DIR)
        except otlp_stream.StreamConfigError as exc:
            raise CommandError(str(exc)) from exc
        recorder = Recorder(get_redis(ride_out=False), batch_max=batch_max, block_ms=block_ms)
        if streamer is not None:
            recorder.on_stored = streamer.stored
            # The lease's token is read each time: after a Redis outage it may be a new one.
            streamer.start(
                lambda: (
                    recorder.client.get(LOCK_KEY)
                    in (recorder.lease.token, recorder.lease.token.encode())
                )
            )
            self.stdout.write(f"recorder: pushing every finished run to {streamer.endpoint}")
        self.stdout.write("recorder: storing trace events (Ctrl-C or SIGTERM stops it)")
        self.stdout.flush()
        try:
            recorder.run(stop)
        except RecorderBusy as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if streamer is not None:
                streamer.stop()
        self.stdout.write(f"recorder: stopped after storing {recorder.stored} events")


def _renice_autogroup(nice: int) -> None:
    """With autogroup scheduling (Linux's default for desktops and many servers), a process
    in its own session competes as a group, and plain nice has no effect across groups."""
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass  # no autogroup here: plain nice already applies
