"""The worker registration API: JSON for machine clients, documented in workers/openapi.py.

register is authorised by an enrolment token (Authorization: Bearer); heartbeat and
deregister by the worker's ed25519 signature over {method, path, timestamp, body sha256}.
No session, hence no CSRF: a forged browser request can carry neither. A request that fails
to authenticate counts against its source address (REMOTE_ADDR), which is answered 429 for
the rest of the window after FRLM_API_FAIL_LIMIT failures."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from frlm_web import jsontext
from frlm_web.redis_client import get_redis
from workers import keys, services
from workers.models import Worker
from workers.openapi import schema
from workers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, request_claim, sha256_hex
from workers.venues import HTTP_ONLY, Link

log = logging.getLogger(__name__)

SCHEMA_HINT = "see /api/openapi.json"


def error(
    status: int,
    message: str,
    fix: str,
    fields: dict[str, list[str]] | None = None,
    challenge: str = "",
) -> JsonResponse:
    """Every error of this API: what is wrong, what to do, which fields, and the
    challenge to sign when the fix is to prove who you are."""
    body: dict[str, Any] = {"error": message, "fix": fix}
    if fields:
        body["fields"] = fields
    if challenge:
        body["challenge"] = challenge
    return JsonResponse(body, status=status)


def _from(exc: services.WorkerError) -> JsonResponse:
    challenge = exc.challenge if isinstance(exc, services.ChallengeRequired) else ""
    return error(exc.status, str(exc), exc.fix, exc.fields or None, challenge)


def machine_post(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
    """POST only, CSRF-exempt (no cookies are honoured), with a bounded body."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        if request.method != "POST":
            response = error(405, f"{request.method} is not allowed here", "send a POST")
            response["Allow"] = "POST"
            return response
        limit = settings.FRLM_API_MAX_BODY
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return _too_big(limit)
        try:
            body = request.body
        except RequestDataTooBig:
            return _too_big(limit)
        if len(body) > limit:
            return _too_big(limit)
        return view(request, *args, **kwargs)

    return wrapped


def _too_big(limit: int) -> JsonResponse:
    return error(
        413,
        f"the request body is larger than {limit} bytes",
        "send only the fields the schema describes; " + SCHEMA_HINT,
    )


def _json_body(request: HttpRequest) -> Any:
    """The body as JSON, or Invalid."""
    if not request.body:
        return {}
    try:
        return jsontext.loads(request.body)
    except ValueError as exc:
        raise services.Invalid(
            f"the body is not valid JSON: {exc}",
            "send a JSON object with Content-Type: application/json; " + SCHEMA_HINT,
        ) from exc


@machine_post
def register(request: HttpRequest) -> JsonResponse:
    throttled = _throttled(request)
    if throttled is not None:
        return throttled
    auth = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        _failed(request)
        return error(
            401,
            "no enrolment token: send the header `Authorization: Bearer <token>`",
            "ask the venue's operator for a token (`python manage.py frlm_token --venue VENUE`)",
        )
    try:
        worker = services.worker_register(token.strip(), _json_body(request))
    except services.WorkerError as exc:
        if exc.status == 401:
            log.warning("registration from %s refused: %s", _address(request), exc)
            _failed(request)
        return _from(exc)
    return JsonResponse(
        {
            "worker_id": worker.id,
            "queue": worker.queue,
            "venue": worker.venue.name,
            "venue_queue": worker.venue.queue,
            "heartbeat_s": float(settings.FRLM_WORKER_HEARTBEAT_S),
            "trusted": worker.venue.trusted,
        },
        status=201,
    )


def signed(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
    """Load the worker named in the URL and check the request is its signed word (see
    _authenticate), unless its address is throttled. A request that fails to authenticate
    counts against the address it came from, never against the worker: anyone can send a
    bad signature in a worker's name."""

    @machine_post
    @functools.wraps(view)
    def wrapped(request: HttpRequest, worker_id: str) -> JsonResponse:
        throttled = _throttled(request)
        if throttled is not None:
            return throttled
        checked = _authenticate(request, worker_id)
        if isinstance(checked, JsonResponse):
            if checked.status_code == 401:
                _failed(request)
            return checked
        return view(request, checked)

    return wrapped


def _authenticate(request: HttpRequest, worker_id: str) -> Worker | JsonResponse:
    """The worker whose signed word this request is, or the error saying why not:
    1. the worker exists and has not left (404, 410), 2. the timestamp is within the replay
    window, 3. the signature is the canonical base64 of 64 bytes and the worker's (401),
    4. those signature bytes were not seen before (a replay, 401)."""
    worker = Worker.objects.select_related("venue").filter(id=worker_id).first()
    if worker is None:
        log.warning("%s for unknown worker %r refused", request.path, worker_id[:40])
        return error(
            404,
            f"no worker {worker_id!r}",
            "register (POST /api/workers/register) and use the worker_id it returns",
        )
    if worker.status == Worker.Status.DEREGISTERED:
        log.warning("%s for deregistered worker %s refused", request.path, worker.id)
        return error(
            410,
            f"worker {worker.id} was deregistered",
            "stop this worker, or register again with an enrolment token",
        )
    stamp = request.META.get("HTTP_" + TIMESTAMP_HEADER.upper().replace("-", "_"), "")
    sig = request.META.get("HTTP_" + SIGNATURE_HEADER.upper().replace("-", "_"), "")
    fix = (
        f"sign canonical JSON of {{method, path, timestamp, body_sha256}} with the "
        f"worker's key; send it in {SIGNATURE_HEADER} and the epoch seconds in "
        f"{TIMESTAMP_HEADER}; " + SCHEMA_HINT
    )
    if not stamp or not sig:
        return error(401, f"{TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are required", fix)
    try:
        skew = abs(time.time() - float(stamp))
    except (ValueError, OverflowError):
        skew = float("inf")
    window = settings.FRLM_API_CLOCK_SKEW_S
    if not skew <= window:
        log.warning("stale request for worker %s refused (%s)", worker.id, stamp[:32])
        return error(
            401,
            f"{TIMESTAMP_HEADER} is not within {window:g} s of the server's clock",
            "sign each request afresh with the current time; check the worker's clock",
        )
    try:
        raw_sig = keys.signature_bytes(sig)
    except keys.BadSignature as exc:
        return error(
            401,
            f"{SIGNATURE_HEADER} is not accepted: {exc}",
            "send the standard base64 of the 64 signature bytes (padded, `+/` alphabet, as "
            "base64.b64encode writes it) and nothing else",
        )
    claim = request_claim(request.method or "POST", request.path, stamp, request.body)
    if not keys.verify(worker.public_key, claim, sig):
        log.warning("bad signature for worker %s from %s", worker.id, _address(request))
        return error(401, "the signature does not match this worker's key", fix)
    if not _first_use(raw_sig):
        log.warning("replayed request for worker %s refused", worker.id)
        return error(401, "this signed request was already used", "sign each request afresh")
    return worker


def _first_use(sig: bytes) -> bool:
    """True the first time these signature bytes are seen within the replay window."""
    ttl = int(settings.FRLM_API_CLOCK_SKEW_S * 2) + 1
    try:
        return bool(get_redis().set(f"frlm:api:sig:{sha256_hex(sig)}", 1, nx=True, ex=ttl))
    except redis.RedisError:
        return True  # the timestamp window still bounds a replay


# --- failed authentication, counted per address ------------------------------------------
def _address(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")[:64]


def _failed(request: HttpRequest) -> None:
    services.auth_failed(_address(request))


def _throttled(request: HttpRequest) -> JsonResponse | None:
    """A 429 when the address has failed FRLM_API_FAIL_LIMIT times in its window: it is
    not even checked until the window ends."""
    retry = services.auth_throttle(_address(request))
    if retry is None:
        return None
    log.warning("throttled %s %s from %s", request.method, request.path, _address(request))
    response = error(
        429, services.throttled_error(_address(request)), services.throttled_fix(retry)
    )
    response["Retry-After"] = str(retry)
    return response


@signed
def heartbeat(request: HttpRequest, worker: Worker) -> JsonResponse:
    retry = services.heartbeat_throttle(worker.id)
    if retry is not None:
        limit = settings.FRLM_API_HEARTBEAT_LIMIT
        window = settings.FRLM_API_HEARTBEAT_WINDOW_S
        response = error(
            429,
            f"worker {worker.id} sent more than {limit} heartbeats in {window:g} s",
            f"wait {retry} s (Retry-After); beat every "
            f"{float(settings.FRLM_WORKER_HEARTBEAT_S):g} s, as registration said",
        )
        response["Retry-After"] = str(retry)
        return response
    try:
        figures = services.figures_clean(_json_body(request))
        # A trusted venue's worker over HTTP consumes the broker's queues itself; an
        # untrusted one is refused the broker, so its beats say it takes no work: were it
        # announced as a broker worker, jobs queued for it would wait out their timeout.
        connection = "broker" if worker.venue.trusted else HTTP_ONLY
        link: Link = {"connection": connection, "address": _address(request)}
        entry = services.worker_heartbeat(worker, figures, link)
    except services.WorkerError as exc:
        return _from(exc)
    except redis.RedisError:
        return error(
            503,
            "presence (Redis) is unreachable; the heartbeat was not recorded",
            "retry at the next heartbeat",
        )
    return JsonResponse(
        {
            "worker_id": worker.id,
            "status": worker.status,
            "heartbeat_s": float(settings.FRLM_WORKER_HEARTBEAT_S),
            "load": entry["load"],
        }
    )


@signed
def deregister(request: HttpRequest, worker: Worker) -> JsonResponse:
    try:
        body = _json_body(request)
    except services.WorkerError as exc:
        return _from(exc)
    if (
        not isinstance(body, dict)
        or set(body) - {"reason"}
        or not isinstance(body.get("reason", ""), str)
    ):
        return error(
            400,
            'the body must be {} or {"reason": "..."}',
            "send an empty JSON object; " + SCHEMA_HINT,
            {"body": ["only `reason`, a string, is allowed"]},
        )
    services.worker_deregister(worker)
    log.info("worker %s left: %s", worker.id, str(body.get("reason", ""))[:200])
    return JsonResponse({"worker_id": worker.id, "status": Worker.Status.DEREGISTERED})


@csrf_exempt  # a read; a POST gets 405, not a CSRF page
def openapi(request: HttpRequest) -> JsonResponse:
    if request.method not in ("GET", "HEAD"):
        response = error(405, f"{request.method} is not allowed here", "send a GET")
        response["Allow"] = "GET, HEAD"
        return response
    return JsonResponse(schema(request.build_absolute_uri("/").rstrip("/")))
