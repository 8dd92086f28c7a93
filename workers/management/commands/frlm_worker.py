from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from frlm_web.commands import FrlmCommand, http_url, number, rate, whole
from workers.client import Control, ControlError, HttpControl, LocalControl
from workers.gateway.agent import GatewayAgent, GatewayRefused, own_simulated_model
from workers.keys import public_b64
from workers.management.arguments import venue_name, worker_name
from workers.models import Venue, venue_defaults
from workers.runtime import WorkerRuntime, default_key_file, load_key
from workers.services import MAX_CONCURRENCY, NAME_RE, Registration

SIM_KEYS = (
    "latency_ms",
    "spread",
    "straggler_rate",
    "straggler_factor",
    "failure_rate",
    "lie_rate",
    "lie_after_s",
    "honest_first",
    "collude",
    "seed",
)


class Command(FrlmCommand):
    help = (
        "Run a registered venue worker: registers with the FRLM server (--server, --token) "
        "or, without --server, in-process on this machine's database; consumes its own "
        "queue worker.<id> and its venue's queue venue.<name>; heartbeats; signs its "
        "results; on SIGTERM finishes what it runs, then deregisters."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--venue", required=True, type=venue_name, help="venue name, e.g. local or edge"
        )
        parser.add_argument(
            "--server",
            type=http_url,
            default=None,
            help="the FRLM web server's URL (e.g. http://10.0.0.5:8000); without it the "
            "worker registers in-process, on this machine's database",
        )
        parser.add_argument(
            "--token",
            # From the environment too: on the command line every user of the machine sees
            # it in `ps` (a review).
            default=os.environ.get("FRLM_ENROLMENT_TOKEN") or None,
            help="the venue's enrolment token (`manage.py frlm_token`); required with --server "
            "(default: FRLM_ENROLMENT_TOKEN, which keeps it out of `ps`)",
        )
        parser.add_argument(
            "--connect",
            choices=["auto", "gateway", "broker"],
            default="auto",
            help="how jobs reach this worker: `gateway` (one WebSocket to --server; no "
            "Redis, no shared disk: for a worker on another machine), or `broker` (it "
            "consumes the Celery queues itself: trusted venues only, with FRLM_REDIS_URL). "
            "auto: gateway with --server, broker without",
        )
        parser.add_argument(
            "--consumer",
            choices=list(settings.WORKER_CONSUMERS),
            default=settings.FRLM_WORKER_CONSUMER,
            help="a broker worker's loop: `frlm` (FRLM's own: it takes jobs off its queues only "
            "for free slots, as many at once as are free, runs them as tasks of one event "
            "loop, and spends less CPU per job; bench/fanout.py --consumer celery,frlm), "
            "`frlm-threads` (the same with a thread per slot) or `celery` (Celery's worker: "
            "prefetch, "
            "remote control, task events for Flower). Default: FRLM_WORKER_CONSUMER, else "
            "frlm, or celery with FRLM_CELERY_EVENTS=1",
        )
        parser.add_argument(
            "--kind",
            choices=[k for k, _ in Venue.Kind.choices],
            default=None,
            help="the venue's kind when this creates it (default: from its name)",
        )
        parser.add_argument(
            "--concurrency",
            type=whole(1, MAX_CONCURRENCY),
            default=16,
            help="sub-queries at once",
        )
        parser.add_argument(
            "--name",
            type=worker_name,
            default=None,
            help="worker name, unique in its venue (default: venue-host-pid)",
        )
        parser.add_argument(
            "--key-file",
            default=None,
            help="the worker's ed25519 key, made on first use (default: "
            "DATA_DIR/workers/<venue>/<name>.key)",
        )
        parser.add_argument(
            "--backend",
            choices=["sim", "openai"],
            default="sim",
            help="the simulated model, or an OpenAI-compatible endpoint (default sim)",
        )
        parser.add_argument(
            "--base-url", default=None, help="the OpenAI-compatible endpoint (--backend openai)"
        )
        parser.add_argument("--model", default=None, help="the model this worker serves")
        parser.add_argument(
            "--context-tokens",
            type=whole(1),
            default=128_000,
            help="the model's context window in tokens (default 128000)",
        )
        parser.add_argument(
            "--price-in",
            type=number(0),
            default=0.0,
            help="$ per 1,000 input tokens (default 0: the model's list price)",
        )
        parser.add_argument(
            "--price-out",
            type=number(0),
            default=0.0,
            help="$ per 1,000 output tokens (default 0: the model's list price)",
        )
        sim = parser.add_argument_group("simulated model profile (when the worker model is sim)")
        sim.add_argument(
            "--sim-latency-ms", type=number(0), default=None, help="median latency of a reply"
        )
        sim.add_argument(
            "--sim-spread", type=number(0), default=None, help="lognormal sigma of latency"
        )
        sim.add_argument(
            "--sim-straggler-rate", type=rate, default=None, help="share of slow replies (0-1)"
        )
        sim.add_argument(
            "--sim-failure-rate", type=rate, default=None, help="share of failed calls (0-1)"
        )
        sim.add_argument(
            "--sim-lie-rate",
            type=rate,
            default=None,
            help="share of replies that are confident and wrong",
        )
        sim.add_argument(
            "--sim-straggler-factor", type=number(1), default=None, help="a straggler's slowdown"
        )
        sim.add_argument(
            "--sim-lie-after-s",
            type=number(0),
            default=None,
            help="answer honestly for this many seconds after starting, then lie",
        )
        sim.add_argument(
            "--sim-honest-first",
            type=whole(0),
            default=None,
            help="a liar that knows the check gate: it answers honestly the first this many "
            "jobs it begins after a pause (a batch's first), then lies",
        )
        sim.add_argument(
            "--sim-collude",
            type=rate,
            default=None,
            help="share of lies that are the liars' shared lie: colluders give identical answers",
        )
        sim.add_argument(
            "--sim-seed", type=whole(0), default=None, help="seed of the simulated model's draws"
        )

    def handle(self, *args, **options) -> None:
        """1. check the arguments, 2. set up the model backend and simulated profile,
        3. choose in-process or HTTP registration, 4. run the worker until it stops."""
        venue = options["venue"]
        concurrency = options["concurrency"]
        name = options["name"] or f"{venue}-{socket.gethostname()}-{os.getpid()}"
        if not NAME_RE.match(name):  # the default, made of this host's name
            raise CommandError(
                f"--name {name!r}: 1 to 64 letters, digits, '.', '-' or '_', starting with a "
                "letter or digit"
            )
        models = self._backend(options)
        self._sim_profile(options)
        key_path = Path(options["key_file"] or default_key_file(venue, name))
        try:
            key = load_key(key_path)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        registration: Registration = {
            "name": name,
            "venue": venue,
            "models": models,
            "concurrency": concurrency,
            "context_tokens": options["context_tokens"],
            "price_in": options["price_in"],
            "price_out": options["price_out"],
            "public_key": public_b64(key),
        }
        control = self._control(options, venue, key)
        if options["server"] and options["backend"] == "sim":
            # On another machine the server's simulated model is out of reach (and a job
            # never names an endpoint): the worker runs its own.
            url = own_simulated_model()
            self.stderr.write(f"the simulated model answers this worker's jobs at {url}")
        gateway = options["connect"] == "gateway" or (
            options["connect"] == "auto" and options["server"]
        )
        if gateway:
            self._gateway(options, control, registration, key)
            return
        runtime = WorkerRuntime(
            control,
            registration,
            key,
            trusted_prefetch=settings.FRLM_WORKER_PREFETCH,
            require_trusted=isinstance(control, HttpControl),
            consumer=options["consumer"],
        )
        try:
            runtime.run()
        except ControlError as exc:
            raise CommandError(_refused(exc)) from exc

    def _gateway(self, options: dict, control: Control, registration: Registration, key) -> None:
        """A worker on the gateway: it talks to the web server only."""
        if not isinstance(control, HttpControl):
            raise CommandError("--connect gateway needs --server and --token")
        agent = GatewayAgent(options["server"], control, registration, key)
        try:
            agent.run()
        except ControlError as exc:
            raise CommandError(_refused(exc)) from exc
        except GatewayRefused as exc:
            raise CommandError(f"the gateway refused this worker: {exc}") from exc

    def _backend(self, options: dict) -> list[str]:
        """The models this worker serves: with the simulated model, whatever a run asks
        (its reply is simulated either way); with an endpoint, the one model it names."""
        if options["backend"] == "sim":
            return [options["model"]] if options["model"] else []
        if not options["model"]:
            raise CommandError("--backend openai needs --model (the model the endpoint serves)")
        base_url = options["base_url"] or settings.FRLM_OPENAI_BASE_URL
        os.environ["FRLM_WORKER_BACKEND"] = json.dumps(
            {"kind": "openai", "model": options["model"], "base_url": base_url}
        )
        return [options["model"]]

    def _sim_profile(self, options: dict) -> None:
        profile = {
            key: options[f"sim_{key}"] for key in SIM_KEYS if options.get(f"sim_{key}") is not None
        }
        for key in ("straggler_rate", "failure_rate", "lie_rate", "collude"):
            if not 0 <= profile.get(key, 0) <= 1:
                raise CommandError(f"--sim-{key.replace('_', '-')} is a probability, 0 to 1")
        if profile:
            os.environ["FRLM_SIM_PROFILE"] = json.dumps(profile)

    def _control(self, options: dict, venue: str, key) -> Control:
        if options["server"]:
            if not options["token"]:
                raise CommandError(
                    "--server needs --token (or FRLM_ENROLMENT_TOKEN): an enrolment token of "
                    "the venue (`python manage.py frlm_token --venue VENUE` on the server)"
                )
            return HttpControl(options["server"], options["token"], key)
        # On the database's machine the worker may create its venue, like the demo needs.
        Venue.objects.get_or_create(name=venue, defaults=venue_defaults(venue, options["kind"]))
        return LocalControl(options["token"])


# The registration's fields, as this command's options set them.
OPTION_OF = {
    "name": "--name",
    "venue": "--venue",
    "models": "--model",
    "concurrency": "--concurrency",
    "context_tokens": "--context-tokens",
    "price_in": "--price-in",
    "price_out": "--price-out",
    "public_key": "--key-file",
    "challenge_sig": "--key-file",
}


def _refused(exc: ControlError) -> str:
    """A refused registration in this command's words: the options to change, not the HTTP
    API's `fields` (a review found 'correct the fields listed in `fields`')."""
    if not exc.fields:
        return f"could not register: {exc}"
    problems = "; ".join(
        f"{OPTION_OF.get(field, field)}: {', '.join(messages)}"
        for field, messages in sorted(exc.fields.items())
    )
    options = ", ".join(dict.fromkeys(OPTION_OF.get(field, field) for field in sorted(exc.fields)))
    if exc.fix and "`fields`" not in exc.fix:  # the server's own advice (a name taken)
        return f"could not register: {exc.message.rstrip('.')} ({problems}). What to do: {exc.fix}"
    return f"could not register: {problems}. What to do: correct {options} and start it again"
