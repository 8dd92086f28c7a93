from __future__ import annotations

import signal
import threading

from frlm_web import collector
from frlm_web.commands import FrlmCommand, whole
from frlm_web.redis_client import get_redis
from traces.forwarder import Forwarder


class Command(FrlmCommand):
    help = (
        "Run the live forwarder: trace events to the run pages as they are emitted, "
        "apart from the recorder that stores them. Stops cleanly on SIGTERM."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--block-ms",
            type=whole(1),
            default=200,
            help="how long one read of the event stream waits for events (default 200 ms)",
        )

    def handle(self, *args, block_ms: int, **options) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        forwarder = Forwarder(get_redis(ride_out=False), block_ms=block_ms)
        self.stdout.write("forwarder: sending live trace events to run pages")
        self.stdout.flush()
        collector.settle()  # what it loaded to start is never walked again
        forwarder.run(stop)
        self.stdout.write(f"forwarder: stopped after forwarding {forwarder.forwarded} events")
