from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, port
from frlm_web.env import envstr
from frlm_web.stack import Stack, StackError, VenueSpec, running_from_pidfiles

# A trusted local worker and an edge swarm of simulated devices (a quarter of them three
# times slower, a few stragglers and failures), so the scheduler has real choices to make.
DEMO_VENUES = [
    VenueSpec(
        "local", concurrency=16, sim={"latency_ms": 60, "spread": 0.3}, worker_name="local-1"
    ),
    VenueSpec("edge", swarm="edge", workers=4),
]


class Command(FrlmCommand):
    help = (
        "Bring FRLM web up on this machine: redis (unless one answers at FRLM_REDIS_URL), the "
        "simulated model server, the recorder, the live forwarder, a conductor, venue workers "
        "(local, edge) and the "
        "web server. With --demo, also create the demo user and run a demo FRLM run."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--demo",
            action="store_true",
            help="also create the demo user and run a demo FRLM run",
        )
        parser.add_argument(
            "--web-port",
            type=port,
            default=int(envstr("FRLM_WEB_PORT", "8000")),
            help="the web server's port (default FRLM_WEB_PORT or 8000)",
        )

    def handle(self, *args, demo: bool, web_port: int, **options) -> None:
        state = settings.DATA_DIR / "stack"
        already = running_from_pidfiles(state)
        if already:
            self.stdout.write(
                f"FRLM web is already up ({', '.join(sorted(already))}); `make down` stops it"
            )
        else:
            stack = Stack(state_dir=state, venues=DEMO_VENUES, web_port=web_port)
            self.stdout.write("starting FRLM web: " + ", ".join(p.name for p in stack.plan()))
            try:
                stack.start()
            except StackError as exc:
                stack.stop()
                raise CommandError(f"could not start FRLM web: {exc}") from exc
            self.stdout.write(
                f"up: web console on http://127.0.0.1:{web_port}/ (sign in as demo), "
                f"simulated model at {settings.FRLM_SIM_URL}, logs in {state / 'logs'}"
            )
        if demo:
            self.demo_user()
            self.stdout.write(
                "\ndemo run: a 1,000,000-token needle-in-a-haystack task over venues "
                "local and edge (simulated model)\n"
            )
            self.stdout.flush()
            try:
                call_command(
                    "frlm_run", task="sniah", tokens=1_000_000, seed=7, venues="local,edge"
                )
            except SystemExit as exc:
                if exc.code:
                    raise CommandError("the demo run did not succeed; see above") from exc
        self.stdout.write("\nstop everything with `make down` (python manage.py frlm_down)")

    def demo_user(self) -> None:
        password = envstr("FRLM_DEMO_PASSWORD", "") or secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username="demo")
        user.is_staff = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"demo user: demo / {password}  (set FRLM_DEMO_PASSWORD to choose it)")
