from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, port
from frlm_web.env import envstr
from frlm_web.stack import Stack, StackError, VenueSpec, running_from_pidfiles
from frlm_web.supervisor import (
    LOG_FILE,
    PID_FILE,
    STOPPING_FILE,
    read_state,
    status_lines,
    write_state,
)

# A trusted local worker and an edge swarm of simulated devices (a quarter of them three
# times slower, a few stragglers and failures), so the scheduler has real choices to make.
DEMO_VENUES = [
    VenueSpec(
        "local", concurrency=16, sim={"latency_ms": 60, "spread": 0.3}, worker_name="local-1"
    ),
    VenueSpec("edge", swarm="edge", workers=4),
]
START_TIMEOUT_S = 180.0


class Command(FrlmCommand):
    help = (
        "Bring FRLM web up on this machine: redis (unless one answers at FRLM_REDIS_URL), the "
        "simulated model server, the recorder, the live forwarder, a conductor, venue workers "
        "(local, edge) and the web server, held by a supervisor process that starts again "
        "any of them that dies. With --demo, also create the demo user and run a demo FRLM run."
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
        parser.add_argument(
            "--foreground",
            action="store_true",
            help="be the supervisor: start the stack, keep it running until SIGTERM or "
            "Ctrl-C (what `frlm_up` runs in the background; for systemd and the like)",
        )

    def handle(self, *args, demo: bool, web_port: int, foreground: bool, **options) -> None:
        state = settings.DATA_DIR / "stack"
        if foreground:
            self.supervise(state, web_port)
            return
        already = running_from_pidfiles(state)
        if already:
            self.stdout.write(
                f"FRLM web is already up ({', '.join(sorted(already))}); `make down` stops it"
            )
            self.stdout.write("\n".join(status_lines(state, already)))
        else:
            self.start_supervisor(state, web_port)
            self.stdout.write(
                f"up: web console on http://{console_host()}:{web_port}/ (sign in as demo), "
                f"simulated model at {settings.FRLM_SIM_URL}, logs in {state / 'logs'}; "
                "`python manage.py frlm_status` shows what runs and what was restarted"
            )
        if demo:
            self.demo()
        else:
            self.sign_in()
        self.stdout.write("\nstop everything with `make down` (python manage.py frlm_down)")

    def sign_in(self) -> None:
        """How to sign in after `make up`: the demo user made, or its password set, when
        there is none yet or FRLM_DEMO_PASSWORD asks; else where its password came from
        (a review found no way to learn it short of a demo run)."""
        if envstr("FRLM_DEMO_PASSWORD", "") or not (
            get_user_model().objects.filter(username="demo").exists()
        ):
            self.demo_user()
        else:
            self.stdout.write(
                "demo user: demo, with the password `make demo` printed; "
                "`FRLM_DEMO_PASSWORD=... make up` sets a new one"
            )

    def start_supervisor(self, state: Path, web_port: int) -> None:
        """1. start `frlm_up --foreground` in a session of its own (it outlives this
        command and holds the stack), 2. wait until it says the stack is ready, or why not."""
        (state / "logs").mkdir(parents=True, exist_ok=True)
        (state / STOPPING_FILE).unlink(missing_ok=True)
        write_state(state, {"starting": True})
        argv = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "frlm_up"]
        with open(state / "logs" / LOG_FILE, "ab") as log:
            proc = subprocess.Popen(
                [*argv, "--foreground", "--web-port", str(web_port)],
                cwd=settings.BASE_DIR,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (state / PID_FILE).write_text(str(proc.pid))
        self.stdout.write(f"starting FRLM web (its supervisor is pid {proc.pid})")
        self.stdout.flush()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            now = read_state(state)
            if now.get("ready"):
                return
            if now.get("error") or proc.poll() is not None:
                proc.wait(timeout=30)
                raise CommandError(f"could not start FRLM web: {now.get('error') or 'see log'}")
            time.sleep(0.2)
        raise CommandError(
            f"FRLM web was not up within {START_TIMEOUT_S:.0f} s; see {state / 'logs'}, "
            "and `make down` to stop what started"
        )

    def supervise(self, state: Path, web_port: int) -> None:
        """The supervisor process: start the stack, watch it, stop it on SIGTERM/SIGINT."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stack = Stack(state_dir=state, venues=DEMO_VENUES, web_port=web_port)
        self.stdout.write("supervisor: starting " + ", ".join(p.name for p in stack.plan()))
        self.stdout.flush()
        try:
            stack.start(supervise=True)
        except StackError as exc:
            stack.stop()
            write_state(state, {"error": str(exc)})
            raise CommandError(f"could not start FRLM web: {exc}") from exc
        assert stack.supervisor is not None
        stack.supervisor.write_state(ready=True)
        self.stdout.write("supervisor: up; watching")
        self.stdout.flush()
        stop.wait()
        self.stdout.write("supervisor: stopping everything")
        self.stdout.flush()
        stack.stop()
        stack.supervisor.write_state(ready=False, stopped=True)

    def demo(self) -> None:
        self.demo_user()
        self.stdout.write(
            "\ndemo run: a 1,000,000-token needle-in-a-haystack task over venues "
            "local and edge (simulated model)\n"
        )
        self.stdout.flush()
        try:
            call_command("frlm_run", task="sniah", tokens=1_000_000, seed=7, venues="local,edge")
        except SystemExit as exc:
            if exc.code:
                raise CommandError("the demo run did not succeed; see above") from exc

    def demo_user(self) -> None:
        password = envstr("FRLM_DEMO_PASSWORD", "") or secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username="demo")
        user.is_staff = True
        user.set_password(password)
        user.save()
        # Staff sees every run; the admin also needs permissions, or it showed the demo user
        # nothing (a review): the venues (to trust one), tokens, workers and runs.
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label__in=("workers", "runs"),
                content_type__model__in=("venue", "enrolmenttoken", "worker", "run"),
            )
        )
        self.stdout.write(f"demo user: demo / {password}  (set FRLM_DEMO_PASSWORD to choose it)")


def console_host() -> str:
    """Where the web server listens, as a browser on this machine reaches it: it said
    127.0.0.1 with FRLM_WEB_HOST=10.77.0.1, which refused (a review)."""
    host = os.environ.get("FRLM_WEB_HOST") or "127.0.0.1"
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - read, not bound
