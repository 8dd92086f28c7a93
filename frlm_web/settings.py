"""FRLM web settings. Every value comes from the environment; the defaults run a fresh
checkout on one machine (SQLite, Redis on localhost, the simulated model)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from frlm_web import redis_acl, secret
from frlm_web.env import envbool, envfloat, envint, envlist, envmap, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
# Everything the product writes at run time (database, traces, blobs, logs, pids).
DATA_DIR = Path(envstr("FRLM_DATA_DIR", str(BASE_DIR / "var")))

# Without FRLM_SECRET_KEY, a random key kept in the data directory: every process of this
# installation reads the same one (the Redis passwords derive from it), and it is nobody
# else's. Debug pages show settings and tracebacks to whoever asks: on only when asked for.
SECRET_KEY = envstr("FRLM_SECRET_KEY", "") or secret.stored_key(DATA_DIR / "secret_key")
DEBUG = envbool("FRLM_DEBUG", False)
# Loopback always: the stack, its readiness probes and the tests speak to 127.0.0.1.
ALLOWED_HOSTS = list(
    dict.fromkeys(["127.0.0.1", "localhost", "[::1]", *envlist("FRLM_ALLOWED_HOSTS", [])])
)

# Behind an HTTPS proxy (README, "Production"): the proxy says the request came over TLS
# (it must set X-Forwarded-Proto itself, and daphne must be reachable only through it),
# plain HTTP is redirected, cookies travel over TLS only, and browsers remember to use it.
FRLM_HTTPS = envbool("FRLM_HTTPS", False)
if FRLM_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = envint("FRLM_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("FRLM_HSTS_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = envbool("FRLM_HSTS_PRELOAD", True)
    # A form posted from the public name (a proxy may rewrite Host): each allowed host over
    # HTTPS, a leading dot meaning its subdomains.
    CSRF_TRUSTED_ORIGINS = envlist(
        "FRLM_CSRF_TRUSTED_ORIGINS",
        [
            f"https://*{host}" if host.startswith(".") else f"https://{host}"
            for host in envlist("FRLM_ALLOWED_HOSTS", [])
            if host != "*"
        ],
    )

# daphne's app makes `manage.py runserver` serve ASGI (WebSockets); importing it installs
# Twisted's reactor, a third of a second, so only runserver loads it. The web process is
# `python -m daphne` (frlm_web/stack.py), which needs no app.
_DAPHNE_APP = ["daphne"] if sys.argv[1:2] == ["runserver"] else []
INSTALLED_APPS = [
    *_DAPHNE_APP,
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "frlm_web",
    "traces",
    "workers",
    "runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A signed-out htmx poll sends the page to sign in (frlm_web/htmx_auth.py).
    "frlm_web.htmx_auth.HtmxSignIn",
]

ROOT_URLCONF = "frlm_web.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = None
ASGI_APPLICATION = "frlm_web.asgi.application"

_db_path = envstr("FRLM_DB_PATH", str(DATA_DIR / "db.sqlite3"))
# A fresh checkout has no data directory yet, and SQLite will not create one.
Path(_db_path).parent.mkdir(parents=True, exist_ok=True)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _db_path,
        # Several processes (web, conductor, CLI) write: WAL lets readers go on while one
        # writes, IMMEDIATE takes the write lock up front instead of failing mid-transaction.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not memory: the test suite's Celery workers open the same database.
        "TEST": {"NAME": envstr("FRLM_TEST_DB_PATH", str(DATA_DIR / "test-db.sqlite3"))},
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Failed sign-ins counted per source address and per username: past the limit within the
# window, either is answered 429 until the window ends (frlm_web/accounts.py).
FRLM_LOGIN_FAIL_LIMIT = envint("FRLM_LOGIN_FAIL_LIMIT", 10)
FRLM_LOGIN_FAIL_WINDOW_S = envfloat("FRLM_LOGIN_FAIL_WINDOW_S", 300.0)

# --- Redis, Celery, Channels -------------------------------------------------------------
# The Redis this instance uses, without credentials (or with an external Redis's own).
FRLM_REDIS_URL = envstr("FRLM_REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis ACL users per role (frlm_web/redis_acl.py), made by the stack when it starts its own
# redis-server. On by default so that a CLI command in another shell talks to such a
# Redis as its role; off for a Redis of your own without FRLM's users.
FRLM_REDIS_ACL = envbool("FRLM_REDIS_ACL", True)
# Whom this process connects as. The stack sets it for each process it starts; a command
# run by the operator on the server's machine is `admin` (it holds SECRET_KEY, from which
# every role's password derives, so a narrower default would only pretend).
FRLM_REDIS_ROLE = envstr("FRLM_REDIS_ROLE", "admin")
REDIS_URL = (
    redis_acl.role_url(FRLM_REDIS_URL, FRLM_REDIS_ROLE, SECRET_KEY)
    if FRLM_REDIS_ACL
    else FRLM_REDIS_URL
)

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The one task sent by name alone: a run to a conductor. A sub-query
# (workers.subquery_execute) is always sent with the queue of the worker or venue the
# router chose (runs/engine/fanout/transport.py), so it has no static route.
CELERY_TASK_ROUTES = {"runs.conduct": {"queue": "runs"}, "runs.experiment": {"queue": "runs"}}
CELERY_TASK_DEFAULT_QUEUE = "runs"
# Celery task events for a monitor such as Flower (off: every task then costs extra Redis
# publishes, measured in README). On, conductors and workers start with -E and their
# heartbeats, senders announce what they send, and the Redis roles may publish on the
# events channel (frlm_web/redis_acl.py).
FRLM_CELERY_EVENTS = envbool("FRLM_CELERY_EVENTS", False)
CELERY_WORKER_SEND_TASK_EVENTS = FRLM_CELERY_EVENTS
CELERY_TASK_SEND_SENT_EVENT = FRLM_CELERY_EVENTS

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels_redis waits 5 s on its blocking pops, which redis-py (6+) also takes as
        # its default socket timeout: the race ended consumers with a TimeoutError (1011).
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
    }
}

# --- FRLM --------------------------------------------------------------------------------
FRLM_TRACE_DIR = Path(envstr("FRLM_TRACE_DIR", str(DATA_DIR / "traces")))
FRLM_SANDBOX_DIR = Path(envstr("FRLM_SANDBOX_DIR", str(DATA_DIR / "sandbox")))
FRLM_CONTEXT_DIR = Path(envstr("FRLM_CONTEXT_DIR", str(DATA_DIR / "contexts")))
# The folders (separated by os.pathsep, ":" on Linux) under which a staff user may name a
# file or folder on the server as a run's context. The services run as root: anything
# else (/etc/shadow, the keys) must stay out of reach. The server's own files are refused
# even under a root (runs/engine/context.py, `server_files`).
FRLM_CONTEXT_ROOTS = [
    Path(p) for p in envstr("FRLM_CONTEXT_ROOTS", str(FRLM_CONTEXT_DIR)).split(os.pathsep) if p
]
# The conductor's ed25519 key: it countersigns every receipt (made on first use).
FRLM_CONDUCTOR_KEY_FILE = Path(
    envstr("FRLM_CONDUCTOR_KEY_FILE", str(DATA_DIR / "keys" / "conductor.key"))
)
# "auto" and "bwrap" run the REPL in bubblewrap and refuse runs where it cannot work; only
# "none", asked for by name, runs it unisolated (rlimits only, marked NOT ISOLATED).
FRLM_SANDBOX_ISOLATION = envstr("FRLM_SANDBOX_ISOLATION", "auto")
# Whom the REPL runs as when the service runs as root (nobody by default).
FRLM_SANDBOX_UID = envint("FRLM_SANDBOX_UID", 65534)
# The longest model reply, run answer or event payload kept whole (longer ones are cut and
# flagged): far above any real model's output.
FRLM_MAX_REPLY_CHARS = envint("FRLM_MAX_REPLY_CHARS", 1_000_000)

# The simulated model server, the embedded default model.
FRLM_SIM_HOST = envstr("FRLM_SIM_HOST", "127.0.0.1")
FRLM_SIM_PORT = envint("FRLM_SIM_PORT", 8765)
FRLM_SIM_URL = envstr("FRLM_SIM_URL", f"http://{FRLM_SIM_HOST}:{FRLM_SIM_PORT}/v1")

# A real OpenAI-compatible endpoint, used when a run names one (--root-model openai).
FRLM_OPENAI_BASE_URL = envstr("FRLM_OPENAI_BASE_URL", "https://api.openai.com/v1")
# The endpoints a run launched from the web may use, `name=url` pairs separated by commas.
# Only these: the conductor sends the server's API key to the endpoint, so a user must
# never be able to name a URL of their own.
FRLM_ENDPOINTS = envmap("FRLM_ENDPOINTS", {"openai": FRLM_OPENAI_BASE_URL})
FRLM_MODEL_TIMEOUT_S = envfloat("FRLM_MODEL_TIMEOUT_S", 120.0)
FRLM_MODEL_RETRIES = envint("FRLM_MODEL_RETRIES", 3)
# What carries the openai client's requests: kept-alive http.client connections
# (workers/http_transport.py), or httpx's own transport ("httpx"; proxies are honoured
# either way, an endpoint behind one always goes through httpx's).
FRLM_MODEL_TRANSPORT = envstr("FRLM_MODEL_TRANSPORT", "kept-alive")
if FRLM_MODEL_TRANSPORT not in {"kept-alive", "httpx"}:
    raise ValueError(
        f"FRLM_MODEL_TRANSPORT={FRLM_MODEL_TRANSPORT!r}: use kept-alive (the default) or httpx"
    )

# Celery messages a venue worker holds per slot (its prefetch multiplier).
FRLM_WORKER_PREFETCH = envint("FRLM_WORKER_PREFETCH", 2)
# Whose loop takes a broker worker's jobs (frlm_worker --consumer): FRLM's own
# (workers/consumer.py: less CPU per job, nothing held beyond free slots; its slots are
# tasks of an event loop, workers/aslots.py, or with frlm-threads a thread each), or
# Celery's, the default while FRLM_CELERY_EVENTS is on, since only Celery's sends Flower
# task events.
FRLM_WORKER_CONSUMER = os.environ.get("FRLM_WORKER_CONSUMER") or (
    "celery" if FRLM_CELERY_EVENTS else "frlm"
)
WORKER_CONSUMERS = ("frlm", "frlm-threads", "celery")
if FRLM_WORKER_CONSUMER not in WORKER_CONSUMERS:
    raise ValueError(
        f"FRLM_WORKER_CONSUMER={FRLM_WORKER_CONSUMER!r}: use {', '.join(WORKER_CONSUMERS)}"
    )
# A gateway worker's work buffer: jobs it holds beyond its slots, as a share of them (at
# least one when above 0; 0: it holds one job per slot). workers/gateway/protocol.py.
FRLM_GATEWAY_BUFFER = envfloat("FRLM_GATEWAY_BUFFER", 0.5)
if not 0.0 <= FRLM_GATEWAY_BUFFER <= 4.0:
    raise ValueError(
        f"FRLM_GATEWAY_BUFFER={FRLM_GATEWAY_BUFFER}: a share of a worker's slots from 0 to 4"
    )
# How long a venue worker's liveness key lives without a refresh.
FRLM_VENUE_HEARTBEAT_TTL_S = envfloat("FRLM_VENUE_HEARTBEAT_TTL_S", 6.0)
# A conductor's lease on each run it conducts (runs/lease.py): renewed every RENEW_S by a
# thread of its own, failed by a watcher (the web server, every other conductor) once it has
# gone TTL_S without renewal. The margin (7 missed renewals) is for a live conductor starved
# of CPU on a busy machine: a false failure ends a healthy run, a late one costs seconds.
FRLM_RUN_LEASE_TTL_S = envfloat("FRLM_RUN_LEASE_TTL_S", 8.0)
FRLM_RUN_LEASE_RENEW_S = envfloat("FRLM_RUN_LEASE_RENEW_S", 1.0)
# Whether a broker worker holds an alive line (workers/alive.py); off only to measure the
# failover by presence alone beside it (bench/failover.py).
FRLM_WORKER_ALIVE_LINE = envbool("FRLM_WORKER_ALIVE_LINE", True)
# Whether the long-running processes freeze what they loaded at start out of the cycle
# collector's walks (frlm_web/collector.py); off only to measure the difference.
FRLM_GC_FREEZE = envbool("FRLM_GC_FREEZE", True)
# Whether the web server watches the leases (the test suite's own process does not).
FRLM_LEASE_WATCH = envbool("FRLM_LEASE_WATCH", True)
# Circuit breakers per worker and per venue: open after this many consecutive failures,
# half-open after the cooldown, closed again after that many successful probes.
# Jobs for one broker worker sent in one Celery message (workers/wire.py), at most; 1 sends
# each alone.
FRLM_BUNDLE_MAX = envint("FRLM_BUNDLE_MAX", 16)
FRLM_CIRCUIT_FAILURES = envint("FRLM_CIRCUIT_FAILURES", 5)
# A venue's breaker: that many consecutive failures, from at least that many distinct
# workers (one worker failing all it holds has its own breaker; it cannot shut the venue).
FRLM_CIRCUIT_VENUE_FAILURES = envint("FRLM_CIRCUIT_VENUE_FAILURES", 10)
FRLM_CIRCUIT_VENUE_WORKERS = envint("FRLM_CIRCUIT_VENUE_WORKERS", 2)
FRLM_CIRCUIT_COOLDOWN_S = envfloat("FRLM_CIRCUIT_COOLDOWN_S", 60.0)
FRLM_CIRCUIT_PROBES = envint("FRLM_CIRCUIT_PROBES", 3)

# Worker registration: how often a worker beats, how often a beat is also written to the
# database (presence in Redis carries every beat), how far a signed request's timestamp
# may be from the server's clock, and the largest request body the worker API reads.
FRLM_WORKER_HEARTBEAT_S = envfloat("FRLM_WORKER_HEARTBEAT_S", 1.0)
FRLM_HEARTBEAT_WRITE_S = envfloat("FRLM_HEARTBEAT_WRITE_S", 5.0)
# A gateway worker silent this long (no heartbeat, no answer to the gateway's pings, which
# go out each heartbeat) is dropped and its jobs go elsewhere.
FRLM_GATEWAY_SILENCE_S = envfloat("FRLM_GATEWAY_SILENCE_S", 3.0)
FRLM_API_CLOCK_SKEW_S = envfloat("FRLM_API_CLOCK_SKEW_S", 60.0)
FRLM_API_MAX_BODY = envint("FRLM_API_MAX_BODY", 64 * 1024)
# The longest request body the web server reads at all (frlm_web/web_server.py): the
# launcher's upload (runs.forms.UPLOAD_MAX_BYTES, 64 MiB) and a MiB for the form's fields.
FRLM_HTTP_MAX_BODY = envint("FRLM_HTTP_MAX_BODY", 65 * 1024 * 1024)
# Requests to the worker API that fail to authenticate, counted per source address: past
# the limit within the window, that address is answered 429 until the window ends.
FRLM_API_FAIL_LIMIT = envint("FRLM_API_FAIL_LIMIT", 20)
FRLM_API_FAIL_WINDOW_S = envfloat("FRLM_API_FAIL_WINDOW_S", 60.0)
# Heartbeats one worker may send over HTTP in a window (by default three times what it
# should): past them it is answered 429, without a strike, until the window ends.
FRLM_API_HEARTBEAT_WINDOW_S = envfloat("FRLM_API_HEARTBEAT_WINDOW_S", 10.0)
FRLM_API_HEARTBEAT_LIMIT = envint(
    "FRLM_API_HEARTBEAT_LIMIT",
    3 * math.ceil(FRLM_API_HEARTBEAT_WINDOW_S / FRLM_WORKER_HEARTBEAT_S),
)
# How long a challenge to take back a worker's name (a restart) may be answered.
FRLM_API_CHALLENGE_TTL_S = envfloat("FRLM_API_CHALLENGE_TTL_S", 60.0)
# A strike against a worker (a forged result or attestation) halves its reputation; the
# strike itself halves every this many seconds, as the other reputation terms forget.
FRLM_STRIKE_HALF_LIFE_S = envfloat("FRLM_STRIKE_HALF_LIFE_S", 3600.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("FRLM_LOG_LEVEL", "INFO")},
    "loggers": {name: {"level": "WARNING"} for name in ("httpx", "httpx2", "httpcore", "openai")},
}
