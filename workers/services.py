"""Writes about workers: enrolment tokens, registration, heartbeats, leaving, being lost,
and strikes against a worker that signed badly or forged a result.

Errors are exceptions carrying an HTTP status and a message that says what to do, so the
JSON API and the in-process runtime report the same thing the same way."""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypedDict

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from frlm_web import presence, throttle
from frlm_web.money import ZERO, money, money_str
from frlm_web.redis_client import get_redis
from workers import keys
from workers.models import WORKER_ID, EnrolmentToken, Venue, Worker, token_digest, worker_queue
from workers.reputation import record_bequeath, strike_add, strikes_at, strikes_key
from workers.venues import Link, LiveWorker, presence_group

log = logging.getLogger(__name__)

TOKEN_PREFIX = "frlmt_"  # noqa: S105 (a marker that makes tokens recognisable, not a secret)
# \Z, not $: $ also matches before a final newline, and "gpu-1\n" passed as a second
# worker named gpu-1.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
MODEL_RE = re.compile(r"^[\x21-\x7e]{1,128}\Z")  # printable ASCII, no spaces
MAX_MODELS = 64
MAX_CONCURRENCY = 1024
MAX_CONTEXT_TOKENS = 100_000_000
MAX_PRICE = 1_000_000.0  # dollars per 1,000 tokens: anything above is a typo
# How long a deregistered worker's id stays out of presence whatever it announces: far past
# the FRLM_HEARTBEAT_WRITE_S within which whoever serves it writes its row and finds out.
DEREGISTERED_BAR_S = 3600.0
PRICE_STEP = Decimal("1e-12")  # the price columns' decimal_places (workers.models.Worker)
REGISTRATION_FIELDS = (
    "name",
    "venue",
    "models",
    "concurrency",
    "context_tokens",
    "price_in",
    "price_out",
    "public_key",
)
# A worker taking back its name (a restart) answers the server's challenge with these.
PROOF_FIELDS = ("challenge", "challenge_sig")
CHALLENGE_RE = re.compile(r"^[A-Za-z0-9_-]{43}\Z")  # secrets.token_urlsafe(32)
HEARTBEAT_FIELDS = ("inflight", "memory_mb", "latency_ms", "pid", "draining")


class Registration(TypedDict, total=False):
    """What a worker says about itself when it registers (the body of POST register)."""

    name: str
    venue: str
    models: list[str]  # [] serves any model
    concurrency: int
    context_tokens: int
    price_in: Decimal  # dollars per 1,000 tokens, exact
    price_out: Decimal
    public_key: str  # base64 of the 32-byte ed25519 public key
    challenge: str  # only to take back a name: the challenge the server answered 409 with
    challenge_sig: str  # the worker's signature of challenge_claim(...)


class Figures(TypedDict, total=False):
    """A heartbeat's body: how the worker is doing right now."""

    inflight: int  # sub-queries running now
    memory_mb: float  # resident memory of the worker process
    latency_ms: float | None  # median of its recent sub-queries; None before the first
    pid: int
    draining: bool  # shutting down: finishing what it holds, taking nothing new


class WorkerError(Exception):
    """A request about a worker cannot be done. `status` is the HTTP status the API answers
    with, the message says what is wrong, `fix` what to do, `fields` which inputs."""

    status = 400

    def __init__(self, message: str, fix: str, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.fix = fix
        self.fields = fields or {}


class Invalid(WorkerError):
    status = 400


class TokenRejected(WorkerError):
    status = 401


class NameTaken(WorkerError):
    status = 409


class WorkerUnknown(WorkerError):
    status = 404


class WorkerGone(WorkerError):
    status = 410


class ChallengeRequired(NameTaken):
    """The name is held by a registration with this key: prove to be that worker by
    signing `challenge` (a restart registers again this way)."""

    def __init__(self, message: str, fix: str, challenge: str) -> None:
        super().__init__(message, fix, {"name": ["held by a live registration with this key"]})
        self.challenge = challenge


class ChallengeRejected(WorkerError):
    status = 401


class Unavailable(WorkerError):
    status = 503


# --- enrolment tokens --------------------------------------------------------------------
def token_create(
    venue: Venue, *, ttl: timedelta | None = None, label: str = "", user: Any = None
) -> tuple[EnrolmentToken, str]:
    """A new enrolment token for `venue` and its plaintext, which is not kept anywhere:
    show it once."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = EnrolmentToken.objects.create(
        venue=venue,
        digest=token_digest(plaintext),
        label=label[:100],
        created_by=user if getattr(user, "pk", None) else None,
        expires=timezone.now() + ttl if ttl else None,
    )
    return token, plaintext


def token_check(plaintext: str) -> EnrolmentToken:
    """The live token whose plaintext this is, or TokenRejected saying why not."""
    fix = (
        "ask the venue's operator for a fresh enrolment token "
        "(`python manage.py frlm_token --venue VENUE` or the admin)"
    )
    if not isinstance(plaintext, str) or not plaintext:
        raise TokenRejected("no enrolment token was given", fix)
    token = (
        EnrolmentToken.objects.select_related("venue")
        .filter(digest=token_digest(plaintext))
        .first()
    )
    if token is None:
        raise TokenRejected("this enrolment token is not known", fix)
    if token.revoked:
        raise TokenRejected("this enrolment token was revoked", fix)
    if token.expires is not None and token.expires <= timezone.now():
        raise TokenRejected(
            f"this enrolment token expired at {token.expires:%Y-%m-%d %H:%M} UTC", fix
        )
    return token


# --- registration ------------------------------------------------------------------------
def _int_field(data: dict, key: str, low: int, high: int, errors: dict[str, list[str]]) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        errors.setdefault(key, []).append(f"must be a whole number from {low} to {high}")
        return 0
    if not low <= value <= high:
        errors.setdefault(key, []).append(f"must be from {low} to {high}; got {value}")
    return value


def _price_field(data: dict, key: str, errors: dict[str, list[str]]) -> Decimal:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errors.setdefault(key, []).append("must be a number of dollars per 1,000 tokens, >= 0")
        return ZERO
    if not 0 <= value <= MAX_PRICE:
        errors.setdefault(key, []).append(f"must be from 0 to {MAX_PRICE:g}; got {value}")
        return ZERO
    price = money(value)  # a JSON number, taken by its shortest spelling: exact as sent
    if price != price.quantize(PRICE_STEP):
        # Stored to 12 places, it would be rounded: 1e-15 to 0, which means "the model's
        # list price" (found by a review).
        errors.setdefault(key, []).append(
            f"may have at most 12 decimal places (a price is kept to {PRICE_STEP}); got {value}"
        )
        return ZERO
    return price


def registration_clean(data: Any, venue: Venue) -> Registration:
    """The registration in `data`, checked field by field, or Invalid with every field's
    errors at once (a worker fixes them in one go)."""
    if not isinstance(data, dict):
        raise Invalid(
            "the body must be a JSON object",
            "send the registration as a JSON object; see /api/openapi.json",
        )
    errors: dict[str, list[str]] = {}
    allowed = REGISTRATION_FIELDS + PROOF_FIELDS
    for key in sorted(set(data) - set(allowed)):
        errors.setdefault(key, []).append("unknown field; allowed: " + ", ".join(allowed))
    for key in PROOF_FIELDS:
        if key in data and not isinstance(data[key], str):
            errors.setdefault(key, []).append("must be a string")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.setdefault("name", []).append(
            "must be 1 to 64 letters, digits, '.', '-' or '_', starting with a letter or digit"
        )
    venue_name = data.get("venue")
    if not isinstance(venue_name, str) or not venue_name:
        errors.setdefault("venue", []).append("must be the name of the token's venue")
    elif venue_name != venue.name:
        errors.setdefault("venue", []).append(
            f"this enrolment token is for venue {venue.name!r}, not {venue_name!r}"
        )
    models = data.get("models", [])
    if not isinstance(models, list) or len(models) > MAX_MODELS:
        errors.setdefault("models", []).append(
            f"must be a list of at most {MAX_MODELS} model names ([] serves any model)"
        )
        models = []
    elif not all(isinstance(m, str) and MODEL_RE.match(m) for m in models):
        errors.setdefault("models", []).append(
            "each model name must be 1 to 128 printable characters without spaces"
        )
    elif len(set(models)) != len(models):
        errors.setdefault("models", []).append("names a model more than once")
    concurrency = _int_field(data, "concurrency", 1, MAX_CONCURRENCY, errors)
    context_tokens = _int_field(
        {"context_tokens": 128_000, **data}, "context_tokens", 1, MAX_CONTEXT_TOKENS, errors
    )
    price_in = _price_field(data, "price_in", errors)
    price_out = _price_field(data, "price_out", errors)
    public_key = data.get("public_key")
    try:
        keys.public_from_b64(public_key)  # type: ignore[arg-type]
    except keys.BadKey as exc:
        errors.setdefault("public_key", []).append(str(exc))
    if errors:
        raise Invalid(
            "the registration has errors in: " + ", ".join(sorted(errors)),
            "correct the fields listed in `fields` and register again",
            errors,
        )
    return {
        "name": name,  # type: ignore[typeddict-item]
        "venue": venue.name,
        "models": list(models),
        "concurrency": concurrency,
        "context_tokens": context_tokens,
        "price_in": price_in,
        "price_out": price_out,
        "public_key": public_key,  # type: ignore[typeddict-item]
    }


def worker_register(plaintext_token: str, data: Any, *, in_process: bool = False) -> Worker:
    """1. check the token, 2. every field, 3. if the name is held by a live registration,
    or the key is one the venue knows, proof of holding that key: its signature over a fresh
    challenge (ChallengeRequired hands one out; a restart answers it); a previous one of the
    name is retired, its id leaves presence and the conductor re-dispatches what it held,
    4. create the worker, 5. its key's record (_take_on_record). It joins presence with its
    first heartbeat. `in_process`: the caller has the database's rights (LocalControl),
    which prove more than a signature; the HTTP API never sets it."""
    token = token_check(plaintext_token)
    reg = registration_clean(data, token.venue)
    try:
        with transaction.atomic():
            previous = list(
                Worker.objects.select_for_update()
                .filter(venue=token.venue, name=reg["name"])
                .exclude(status=Worker.Status.DEREGISTERED)
            )
            for old in previous:
                if old.public_key != reg["public_key"]:
                    raise NameTaken(
                        f"venue {token.venue.name!r} already has a worker named {reg['name']!r} "
                        f"({old.id}) with another key",
                        "choose another name, or stop that worker (it deregisters on SIGTERM) "
                        "or have the operator deregister it in the admin",
                        {"name": ["taken in this venue by a worker with another key"]},
                    )
            known = Worker.objects.filter(venue=token.venue, public_key=reg["public_key"])
            if (previous or known.exists()) and not in_process:
                _possession_check(token.venue, reg, data)
            for old in previous:
                _retire(old, "registered again")
            worker = Worker.objects.create(
                name=reg["name"],
                venue=token.venue,
                token=token,
                models_served=reg["models"],
                concurrency=reg["concurrency"],
                context_tokens=reg["context_tokens"],
                price_in=reg["price_in"],
                price_out=reg["price_out"],
                public_key=reg["public_key"],
            )
    except IntegrityError as exc:
        # Two registrations of one name raced; the loser is told as if it came second.
        raise NameTaken(
            f"venue {token.venue.name!r} already has a worker named {reg['name']!r}",
            "choose another name, or wait for the other worker to leave",
            {"name": ["taken in this venue"]},
        ) from exc
    _take_on_record(worker, known)
    log.info("worker %s registered as %s in venue %s", worker.id, worker.name, worker.venue)
    return worker


def _take_on_record(worker: Worker, same_key: Any) -> None:
    """The record of the venue's last registration of its key (record_bequeath); none where
    this process may not write records (in-process, as the broker's `worker` role)."""
    earlier = same_key.exclude(id=worker.id).order_by("-registered").first()
    try:
        if earlier is not None:
            record_bequeath(get_redis(), earlier.id, worker.id)
    except redis.RedisError as exc:
        log.info("worker %s starts with no record of %s: %s", worker.id, earlier, exc)


# --- taking a name back: proof of holding its key ----------------------------------------
def challenge_claim(challenge: str, venue: str, name: str, public_key: str) -> dict[str, str]:
    """What a worker signs to take its name back."""
    return {"challenge": challenge, "venue": venue, "name": name, "public_key": public_key}


def _challenge_key(challenge: str) -> str:
    return f"frlm:api:challenge:{challenge}"


def worker_challenge(venue: Venue, name: str, public_key: str) -> str:
    """A fresh single-use challenge for taking back `name` in `venue` with `public_key`,
    kept FRLM_API_CHALLENGE_TTL_S."""
    challenge = secrets.token_urlsafe(32)
    bound = json.dumps([venue.name, name, public_key])
    ttl = max(1, int(settings.FRLM_API_CHALLENGE_TTL_S))
    try:
        get_redis().set(_challenge_key(challenge), bound, ex=ttl)
    except redis.RedisError as exc:
        raise Unavailable(
            "Redis is unreachable; no challenge could be made to take this name back",
            "retry in a few seconds",
        ) from exc
    return challenge


def _challenge_take(challenge: Any) -> list[str] | None:
    """What a challenge was given for, once: it is gone after this."""
    if not isinstance(challenge, str) or not CHALLENGE_RE.match(challenge):
        return None
    try:
        pipe = get_redis().pipeline()  # MULTI: only one taker sees it
        pipe.get(_challenge_key(challenge))
        pipe.delete(_challenge_key(challenge))
        bound = pipe.execute()[0]
    except redis.RedisError as exc:
        raise Unavailable("Redis is unreachable; the challenge cannot be checked", "retry") from exc
    return json.loads(bound) if bound else None


def _possession_check(venue: Venue, reg: Registration, data: dict[str, Any]) -> None:
    """Nothing when `data` answers a challenge given for this venue, name and key with
    that key's signature; else ChallengeRequired (with a fresh challenge) or
    ChallengeRejected. The public key alone proves nothing: it is in every receipt."""
    what = "signature, by the worker's key, of the canonical JSON of"
    fix = (
        "prove this is the same worker: send the registration again with `challenge` set to "
        f"the `challenge` of this answer and `challenge_sig` the base64 {what} "
        "{challenge, name, public_key, venue}; a different worker must choose another name"
    )
    name = reg["name"]
    if "challenge" not in data:
        raise ChallengeRequired(
            f"venue {venue.name!r} has a worker named {name!r} or with this key",
            fix,
            worker_challenge(venue, name, reg["public_key"]),
        )
    if _challenge_take(data.get("challenge")) != [venue.name, name, reg["public_key"]]:
        raise ChallengeRequired(
            "the challenge is unknown, expired, already used or for another worker",
            fix,
            worker_challenge(venue, name, reg["public_key"]),
        )
    claim = challenge_claim(data["challenge"], venue.name, name, reg["public_key"])
    if not keys.verify(reg["public_key"], claim, data.get("challenge_sig", "")):
        raise ChallengeRejected(
            "challenge_sig is not the signature of the challenge by this worker's key",
            f"sign with the key whose public half is `public_key`: the {what} "
            "{challenge, name, public_key, venue}, standard base64",
            {"challenge_sig": ["not this key's signature of the challenge"]},
        )


def _retire(worker: Worker, why: str) -> None:
    Worker.objects.filter(id=worker.id).update(
        status=Worker.Status.DEREGISTERED, deregistered=timezone.now()
    )
    presence_withdraw(worker)
    log.info("worker %s (%s) deregistered: %s", worker.id, worker.name, why)


def presence_withdraw(worker: Worker, *, bar_s: float = 0) -> None:
    try:
        presence.withdraw(get_redis(), presence_group(worker.venue.name), worker.id, bar_s=bar_s)
    except redis.RedisError as exc:
        log.warning(
            "could not withdraw worker %s from presence (%s): its entry lapses by itself "
            "within FRLM_VENUE_HEARTBEAT_TTL_S",
            worker.id,
            exc,
        )


# Celery's consumer of a broker worker declares its own queue `worker.<id>` with an exchange
# of the same name, which kombu's Redis transport keeps as a set per exchange. Jobs are put
# on the queue directly (workers/wire.py), so nothing reads these once the worker is gone,
# and each worker that ever ran left two keys behind (125 of each in a dev Redis).
_BINDING_KEYS = ("_kombu.binding.worker.", "_kombu.binding_permanent.worker.")


def queue_bindings_forget(client: redis.Redis, worker_ids: list[str]) -> None:
    """Drop the queue bindings Celery declared for these workers, and their own queues with
    whatever jobs are left in them (the conductor sends those elsewhere when it finds the
    worker gone; a review found 16 of them held for good). Best effort: a process whose
    Redis role may not delete them (a trusted worker deregistering itself) leaves them to
    the next sweep (departed_bindings_sweep)."""
    if not worker_ids:
        return
    try:
        client.delete(
            *[prefix + wid for wid in worker_ids for prefix in _BINDING_KEYS],
            *[worker_queue(wid) for wid in worker_ids],
        )
    except redis.RedisError as exc:
        log.debug("queue bindings of %s left for the next sweep: %s", worker_ids, exc)


def departed_bindings_sweep(client: redis.Redis) -> int:
    """Drop the queue bindings and the own queues of every worker that is not active:
    deregistered, lost, or unknown to this database (a gateway worker's queue has no
    bindings). Returns how many workers' went."""
    ids = {
        key.decode("utf-8", "replace").removeprefix(prefix)
        for prefix in (*_BINDING_KEYS, worker_queue(""))
        for key in client.scan_iter(match=f"{prefix}*", count=1000)
    }
    ids = {wid for wid in ids if WORKER_ID.fullmatch(wid)}  # not kombu's priority queues
    if not ids:
        return 0
    active = set(
        Worker.objects.filter(id__in=ids, status=Worker.Status.ACTIVE).values_list("id", flat=True)
    )
    departed = sorted(ids - active)
    for start in range(0, len(departed), 500):
        queue_bindings_forget(client, departed[start : start + 500])
    return len(departed)


# --- heartbeats --------------------------------------------------------------------------
def figures_clean(data: Any) -> Figures:
    if not isinstance(data, dict):
        raise Invalid(
            "the heartbeat body must be a JSON object",
            "send {inflight, memory_mb, latency_ms}; see /api/openapi.json",
        )
    errors: dict[str, list[str]] = {}
    for key in sorted(set(data) - set(HEARTBEAT_FIELDS)):
        errors.setdefault(key, []).append("unknown field; allowed: " + ", ".join(HEARTBEAT_FIELDS))
    inflight = _int_field({"inflight": 0, **data}, "inflight", 0, 1_000_000, errors)
    figures: Figures = {"inflight": inflight}
    for key in ("memory_mb", "latency_ms"):
        value = data.get(key)
        if value is None and key == "latency_ms":
            figures[key] = None  # type: ignore[literal-required]
            continue
        if value is None:
            value = 0.0
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.setdefault(key, []).append("must be a number >= 0")
        elif not math.isfinite(value) or not 0 <= value <= 1e12:
            errors.setdefault(key, []).append("must be a number from 0 to 1e12")
        else:
            figures[key] = float(value)  # type: ignore[literal-required]
    if "pid" in data:
        figures["pid"] = _int_field(data, "pid", 0, 2**31 - 1, errors)
    draining = data.get("draining", False)
    if not isinstance(draining, bool):
        errors.setdefault("draining", []).append("must be true or false")
    figures["draining"] = draining is True
    if errors:
        raise Invalid(
            "the heartbeat has errors in: " + ", ".join(sorted(errors)),
            "correct the fields listed in `fields`",
            errors,
        )
    return figures


def live_entry(worker: Worker, figures: Figures, link: Link | None = None) -> LiveWorker:
    """The presence entry of `worker` with this heartbeat's figures and how it is
    connected (a broker worker, unless the gateway says otherwise)."""
    inflight = int(figures.get("inflight", 0))
    slots = int((link or {}).get("concurrency") or worker.concurrency)  # the gateway's credit
    entry: LiveWorker = {
        "worker_id": worker.id,
        "name": worker.id,
        "label": worker.name,
        "venue": worker.venue.name,
        "queue": worker.queue,
        "concurrency": slots,
        "models": list(worker.models_served),
        "context_tokens": worker.context_tokens,
        "price_in": money_str(worker.price_in),
        "price_out": money_str(worker.price_out),
        "trusted": worker.venue.trusted,
        "inflight": inflight,
        "load": inflight / max(1, slots),
        "memory_mb": float(figures.get("memory_mb") or 0.0),
        "latency_ms": figures.get("latency_ms"),  # type: ignore[typeddict-item]
        "draining": bool(figures.get("draining")),
    }
    if figures.get("pid"):
        entry["pid"] = int(figures["pid"])
    entry.update(link or {"connection": "broker"})  # type: ignore[typeddict-item]
    return entry


def worker_heartbeat(worker: Worker, figures: Figures, link: Link | None = None) -> LiveWorker:
    """1. note the heartbeat in the database when the last note is older than
    FRLM_HEARTBEAT_WRITE_S (a lost worker that beats again is active again), 2. announce the
    worker in its venue's presence with these figures. WorkerGone if it was deregistered,
    WorkerUnknown if its row is gone."""
    now = timezone.now()
    due = (
        worker.last_heartbeat is None
        or worker.status != Worker.Status.ACTIVE
        or (now - worker.last_heartbeat).total_seconds() >= settings.FRLM_HEARTBEAT_WRITE_S
    )
    if due:
        _note_heartbeat(worker, now, figures)
        # The process holds the row from its registration; the operator may have changed
        # the venue's trust since, and presence must say the trust it has now.
        # (Read through the row: a row put back after the tables were emptied may name
        # another venue row of the same name than the one this process holds.)
        trusted = Worker.objects.filter(id=worker.id).values_list("venue__trusted", flat=True)
        worker.venue.trusted = bool(trusted.first())
        if worker.status == Worker.Status.LOST:
            log.info("worker %s (%s) is back after being lost", worker.id, worker.name)
        worker.status, worker.last_heartbeat, worker.health = Worker.Status.ACTIVE, now, figures
    entry = live_entry(worker, figures, link)
    group = presence_group(worker.venue.name)
    if not presence.announce(get_redis(), group, worker.id, dict(entry)):
        # Barred at its deregistration: told now, not at its next write to the database
        # (FRLM_HEARTBEAT_WRITE_S), which a gateway worker kept being served until.
        raise WorkerGone(
            f"worker {worker.id} was deregistered",
            "stop this worker, or register again with an enrolment token",
        )
    return entry


def _note_heartbeat(worker: Worker, now: datetime, figures: Figures) -> None:
    """Write the beat to the worker's row. A row that is not there when the write looks, and
    is when the status is read after it, was put back in between (by the worker restoring
    it, or a test's fixture after emptying the tables): it is written again, not taken for
    a deregistration. One such race told a live worker it was deregistered, and it stopped
    (a stack worker vanished mid-session in CI)."""
    for _ in range(3):
        updated = (
            Worker.objects.filter(id=worker.id)
            .exclude(status=Worker.Status.DEREGISTERED)
            .update(status=Worker.Status.ACTIVE, last_heartbeat=now, health=dict(figures))
        )
        if updated:
            return
        status = Worker.objects.filter(id=worker.id).values_list("status", flat=True).first()
        if status is None:
            raise WorkerUnknown(f"no worker {worker.id}", "register again with an enrolment token")
        if status == Worker.Status.DEREGISTERED:
            raise WorkerGone(
                f"worker {worker.id} was deregistered",
                "stop this worker, or register again with an enrolment token",
            )
    log.warning(
        "worker %s: its row kept changing under its heartbeat; the next one writes it", worker.id
    )


# --- leaving -----------------------------------------------------------------------------
def worker_deregister(worker: Worker) -> bool:
    """The worker leaves for good: deregistered, and out of presence at once. True if this
    call deregistered it (False: it already was)."""
    updated = (
        Worker.objects.filter(id=worker.id)
        .exclude(status=Worker.Status.DEREGISTERED)
        .update(status=Worker.Status.DEREGISTERED, deregistered=timezone.now())
    )
    # Barred from presence, so its next heartbeat (whichever process takes it) is refused at
    # once: the process serving it holds its row as it was, active, until it writes again.
    presence_withdraw(worker, bar_s=DEREGISTERED_BAR_S)
    queue_bindings_forget(get_redis(), [worker.id])
    if updated:
        worker.status = Worker.Status.DEREGISTERED
        log.info("worker %s (%s) deregistered", worker.id, worker.name)
    return bool(updated)


def worker_mark_lost(worker_id: str) -> bool:
    """An active worker stopped beating: mark it lost and take it out of presence. True
    only for the one caller that made the change (several conductors may notice)."""
    updated = Worker.objects.filter(id=worker_id, status=Worker.Status.ACTIVE).update(
        status=Worker.Status.LOST
    )
    if updated:
        worker = Worker.objects.select_related("venue").get(id=worker_id)
        presence_withdraw(worker)
        log.warning("worker %s (%s) is lost: it missed its heartbeats", worker.id, worker.name)
    return bool(updated)


# --- failed authentication, counted per address ------------------------------------------
def _fail_key(address: str) -> str:
    return f"frlm:api:fail:{address[:64]}"


def auth_failed(address: str) -> None:
    """Count a request (API or gateway) that failed to authenticate against its address, in
    a window that starts with the first failure. Nobody's strike: the caller proved nothing."""
    throttle.hit(_fail_key(address), settings.FRLM_API_FAIL_WINDOW_S)


def auth_throttle(address: str) -> int | None:
    """Seconds `address` must wait when it has failed FRLM_API_FAIL_LIMIT times in its
    window, else None (also when Redis is away: the signature check still stands)."""
    return throttle.wait(
        _fail_key(address), settings.FRLM_API_FAIL_LIMIT, settings.FRLM_API_FAIL_WINDOW_S
    )


def heartbeat_throttle(worker_id: str) -> int | None:
    """Count a heartbeat of an authenticated worker: the seconds it must wait when it sent
    more than FRLM_API_HEARTBEAT_LIMIT in its window, else None. Beating too often is no
    strike, only refused: each beat writes presence, so a flood costs Redis."""
    counted = throttle.hit(f"frlm:api:beat:{worker_id}", settings.FRLM_API_HEARTBEAT_WINDOW_S)
    if counted is None or counted[0] <= settings.FRLM_API_HEARTBEAT_LIMIT:
        return None
    return counted[1]


def throttled_error(address: str) -> str:
    return (
        f"too many requests from {address} failed to authenticate (at least "
        f"{settings.FRLM_API_FAIL_LIMIT} in {settings.FRLM_API_FAIL_WINDOW_S:g} s)"
    )


def throttled_fix(retry: int) -> str:
    return (
        f"wait {retry} s (Retry-After), then sign requests with the worker's own key and the "
        "current time, and register with a valid enrolment token"
    )


# --- strikes -----------------------------------------------------------------------------
def worker_strike(worker_id: str, reason: str) -> float:
    """Count a forged result or attestation against the worker; its reputation reads the
    count, which halves every FRLM_STRIKE_HALF_LIFE_S. Returns the worker's strikes now."""
    client = get_redis()
    count = strike_add(client, worker_id)
    # The latest reasons, for whoever investigates.
    pipe = client.pipeline()
    pipe.lpush(strikes_key(worker_id) + ":why", f"{timezone.now():%Y-%m-%dT%H:%M:%SZ} {reason}")
    pipe.ltrim(strikes_key(worker_id) + ":why", 0, 99)
    pipe.execute()
    log.warning("strike against worker %s (now %.2f): %s", worker_id, count, reason)
    return count


def worker_strikes(worker_id: str) -> float:
    """The worker's strikes now, to two decimals (as people read them)."""
    return round(strikes_at(get_redis().get(strikes_key(worker_id))), 2)
