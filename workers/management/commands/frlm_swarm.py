from __future__ import annotations

import signal
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, number, whole
from workers.management.arguments import venue_name
from workers.swarm import ProfileFileError, Swarm, profile_load, profile_names


class Command(FrlmCommand):
    help = (
        "Start a simulated swarm: N registered workers backed by the simulated model, each "
        "with its own device profile (latency, stragglers, failures, lies) drawn from a "
        "profile file, leaving and rejoining as its churn says. Stops on SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--workers", type=whole(1, 256), default=8, help="how many devices")
        parser.add_argument("--venue", default="edge", type=venue_name, help="the venue they join")
        parser.add_argument(
            "--profile",
            default="edge",
            help=f"a shipped profile ({', '.join(profile_names())}) or a .toml file's path",
        )
        parser.add_argument("--seed", type=whole(0), default=0, help="which devices are drawn")
        parser.add_argument(
            "--duration",
            type=number(0),
            default=0.0,
            help="stop after this many seconds (0: never)",
        )

    def handle(self, *args, workers: int, venue: str, profile: str, seed: int, **options) -> None:
        """1. check the arguments and the profile, 2. start the devices, 3. supervise them
        (churn, restarts) until told to stop, 4. stop them all cleanly."""
        try:
            loaded = profile_load(profile)
        except ProfileFileError as exc:
            raise CommandError(str(exc)) from exc
        swarm = Swarm(
            loaded,
            venue,
            workers,
            seed=seed,
            log_dir=Path(settings.DATA_DIR) / "swarm" / venue,
            say=self._say,
        )
        self._say(f"swarm {loaded.name} on venue {venue}: {loaded.description}")
        for member in swarm.members:
            self._say(f"  {member.device.describe()}")
        stop = {"now": False}

        def on_signal(*_: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        swarm.start()
        ends = time.monotonic() + options["duration"] if options["duration"] else float("inf")
        try:
            while not stop["now"] and time.monotonic() < ends:
                swarm.tick(time.monotonic())
                time.sleep(0.2)
        finally:
            self._say("stopping the swarm: each worker finishes its work and deregisters")
            swarm.stop()

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
