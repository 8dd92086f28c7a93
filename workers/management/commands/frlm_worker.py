from __future__ import annotations

import json
import os
import socket

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from workers.models import Venue, venue_name_validator, venue_queue
from workers.venues import presence_group


class Command(BaseCommand):
    help = (
        "Run a venue worker: a Celery worker on the queue venue.<name> that answers "
        "sub-queries with its model backend. Stops cleanly on SIGTERM."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--venue", required=True, help="venue name, e.g. local or edge")
        parser.add_argument("--kind", choices=[k for k, _ in Venue.Kind.choices], default=None)
        parser.add_argument("--concurrency", type=int, default=16, help="sub-queries at once")
        parser.add_argument("--name", default=None, help="worker name (default: venue-host-pid)")
        sim = parser.add_argument_group("simulated model profile (when the worker model is sim)")
        sim.add_argument("--sim-latency-ms", type=float, default=None)
        sim.add_argument("--sim-spread", type=float, default=None)
        sim.add_argument("--sim-straggler-rate", type=float, default=None)
        sim.add_argument("--sim-failure-rate", type=float, default=None)
        sim.add_argument("--sim-seed", type=int, default=None)

    def handle(
        self,
        *args,
        venue: str,
        kind: str | None,
        concurrency: int,
        name: str | None,
        **options,
    ) -> None:
        try:
            venue_name_validator(venue)
        except ValidationError as exc:
            raise CommandError(f"--venue {venue!r}: {exc.messages[0]}") from exc
        if not 1 <= concurrency <= 1024:
            raise CommandError("--concurrency must be between 1 and 1024")
        kinds = {k for k, _ in Venue.Kind.choices}
        Venue.objects.get_or_create(
            name=venue, defaults={"kind": kind or (venue if venue in kinds else "local")}
        )
        profile = {
            key: options[f"sim_{key}"]
            for key in ("latency_ms", "spread", "straggler_rate", "failure_rate", "seed")
            if options.get(f"sim_{key}") is not None
        }
        if profile:
            os.environ["FRLM_SIM_PROFILE"] = json.dumps(profile)
        os.environ["FRLM_VENUE"] = venue

        from frlm_web.celery import run_worker

        run_worker(
            queue=venue_queue(venue),
            concurrency=concurrency,
            name=name or f"{venue}-{socket.gethostname()}-{os.getpid()}",
            group=presence_group(venue),
            info={"venue": venue},
            at_most_once=True,
            # The conductor keeps queues short (credit-based dispatch), so a second
            # message held per slot cannot hoard work; it saves the refill round trip.
            prefetch=settings.FRLM_WORKER_PREFETCH,
        )
