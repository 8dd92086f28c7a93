from __future__ import annotations

import signal
import threading
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.core.management.base import CommandError

from frlm_web import collector
from frlm_web.commands import FrlmCommand, number, port, rate, whole
from workers.sim import LABEL
from workers.sim.profile import Profile, ProfileError, parse_profile
from workers.sim.server import SimServer, base_url, make_server

_PROFILE_FLAGS = (
    "latency_ms",
    "spread",
    "straggler_rate",
    "straggler_factor",
    "failure_rate",
    "lie_rate",
    "seed",
)


class Command(FrlmCommand):
    help = (
        f"Serve the {LABEL} over the OpenAI-compatible HTTP API (/v1/models, "
        "/v1/chat/completions) until SIGTERM or SIGINT. The flags set the default latency "
        "and failure profile; a request's `sim` field overrides them."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
        parser.add_argument("--port", type=port, default=8765, help="0 picks a free port")
        parser.add_argument("--latency-ms", type=number(0), default=0.0, help="median latency")
        parser.add_argument("--spread", type=number(0), default=0.0, help="lognormal sigma")
        parser.add_argument(
            "--straggler-rate", type=rate, default=0.0, help="share of slow replies (0-1)"
        )
        parser.add_argument(
            "--straggler-factor", type=number(1), default=10.0, help="a straggler's slowdown"
        )
        parser.add_argument("--failure-rate", type=rate, default=0.0, help="share of HTTP 500s")
        parser.add_argument(
            "--lie-rate", type=rate, default=0.0, help="share of wrong worker replies (0-1)"
        )
        parser.add_argument("--seed", type=whole(0), default=0, help="seed of the random draws")
        parser.add_argument("--log-requests", action="store_true", help="log every request")

    def handle(self, *args: Any, **options: Any) -> None:
        """1. Build the default profile. 2. Bind. 3. Serve in a thread until a signal.
        4. Shut down: stop accepting, close the socket."""
        defaults = self._profile(options)
        server = self._bind(options["host"], options["port"], defaults, options["log_requests"])
        stop = threading.Event()
        previous = self._on_signals(stop)
        collector.settle()  # a pause of it is a pause of every sub-query it serves
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        thread.start()
        self.stdout.write(f"simulated model server ({LABEL}) listening on {base_url(server)}")
        self.stdout.flush()  # whoever started us waits for this line on a pipe
        try:
            # A timed wait, so the main thread wakes up to run the signal handler.
            while not stop.wait(0.5):
                pass
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.stdout.write("simulated model server stopped")

    def _profile(self, options: dict[str, Any]) -> Profile:
        try:
            return parse_profile({name: options[name] for name in _PROFILE_FLAGS})
        except ProfileError as exc:
            raise CommandError(str(exc).replace("sim field", "flag")) from exc

    def _bind(self, host: str, port: int, defaults: Profile, log_requests: bool) -> SimServer:
        try:
            return make_server(host, port, defaults, quiet=not log_requests)
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}") from exc

    def _on_signals(self, stop: threading.Event) -> dict[int, Any]:
        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        return {
            signum: signal.signal(signum, request_stop)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
