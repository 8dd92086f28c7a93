"""How a worker talks to FRLM: register, heartbeat, deregister. Over HTTP (HttpControl, for
a worker on another machine: requests signed with its ed25519 key), or in-process
(LocalControl, for a worker on the machine that holds the database: the services
directly). The runtime uses either through the same three calls."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any, Protocol, TypedDict

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from workers import keys, services
from workers.models import Venue, Worker
from workers.services import Figures, Registration
from workers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, request_claim

log = logging.getLogger(__name__)

# The most a stopping worker waits for its last beat and its deregistration. With Redis or
# the server gone, each waited a minute or more and SIGTERM seemed ignored: a supervisor's
# grace ran out (a review's workers, their stack gone, outlived 8 s of SIGTERM).
LEAVE_S = 5.0


class Registered(TypedDict):
    """The answer to a registration (the body of POST register's 201)."""

    worker_id: str
    queue: str  # worker.<id>: this worker's own queue
    venue: str
    venue_queue: str  # venue.<name>: the venue's shared queue
    heartbeat_s: float
    trusted: bool


class ControlError(Exception):
    """The server (or the services) refused a request: `status` is the HTTP status (0 when
    the server could not be reached), the message what is wrong, `fix` what to do."""

    def __init__(
        self,
        status: int,
        message: str,
        fix: str = "",
        fields: dict[str, list[str]] | None = None,
        challenge: str = "",
    ) -> None:
        text = message
        if fields:
            text += " (" + "; ".join(k + ": " + ", ".join(v) for k, v in fields.items()) + ")"
        if fix:
            text = text.rstrip(".") + f". What to do: {fix}"
        super().__init__(text)
        self.status = status
        self.message = message
        self.fix = fix
        self.fields = fields or {}
        self.challenge = challenge  # to sign when taking back this worker's name

    @property
    def gone(self) -> bool:
        """The server no longer knows this worker: it must stop or register again."""
        return self.status in (404, 410)


class Control(Protocol):
    def register(self, registration: Registration) -> Registered: ...

    def heartbeat(self, worker_id: str, figures: Figures) -> None: ...

    def deregister(self, worker_id: str) -> None: ...


class HttpControl:
    """The worker API over HTTP. Heartbeat and deregister are signed with `key`."""

    def __init__(
        self, server: str, token: str, key: Ed25519PrivateKey, *, timeout_s: float = 10.0
    ) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.key = key
        self.http = httpx.Client(base_url=self.server, timeout=timeout_s)

    def register(self, registration: Registration) -> Registered:
        """Register; when the name is still held by this worker's previous registration (a
        restart), answer the server's challenge with this worker's key and take it back."""
        try:
            return self._register(registration)
        except ControlError as exc:
            if exc.status != 409 or not exc.challenge:
                raise
            challenge = exc.challenge
        claim = services.challenge_claim(
            challenge, registration["venue"], registration["name"], registration["public_key"]
        )
        answer: Registration = {
            **registration,
            "challenge": challenge,
            "challenge_sig": keys.sign(self.key, claim),
        }
        return self._register(answer)

    def _register(self, registration: Registration) -> Registered:
        return self._call(  # type: ignore[return-value]
            "POST",
            "/api/workers/register",
            registration,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def heartbeat(self, worker_id: str, figures: Figures) -> None:
        self._signed("POST", f"/api/workers/{worker_id}/heartbeat", figures)

    def deregister(self, worker_id: str) -> None:
        self._signed("POST", f"/api/workers/{worker_id}/deregister", {})

    def close(self) -> None:
        self.http.close()

    def _signed(self, method: str, path: str, body: Any) -> dict[str, Any]:
        raw = json.dumps(body).encode("utf-8")
        # Milliseconds: two requests with one body in one second still differ (no replay).
        stamp = f"{time.time():.3f}"
        sig = keys.sign(self.key, request_claim(method, path, stamp, raw))
        return self._call(
            method, path, raw, headers={TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sig}
        )

    def _call(self, method: str, path: str, body: Any, headers: dict[str, str]) -> dict[str, Any]:  # type: ignore[return]
        raw = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        try:
            response = self.http.request(
                method,
                path,
                content=raw,
                headers={**headers, "Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise ControlError(
                0,
                f"could not reach the FRLM server at {self.server}: {exc}",
                "check --server (the web server's URL, e.g. http://127.0.0.1:8000) and that "
                "it is running",
            ) from exc
        try:
            data = response.json()
        except ValueError:
            data = {}
        if response.status_code >= 400 or not isinstance(data, dict):
            data = data if isinstance(data, dict) else {}
            fix = str(data.get("fix") or "")
            if response.status_code == 400 and not data:
                # Django refuses a Host it does not serve with a bare 400 page.
                fix = (
                    f"if the server's log says DisallowedHost, add the host of --server "
                    f"({httpx.URL(self.server).host}) to FRLM_ALLOWED_HOSTS on the server"
                )
            raise ControlError(
                response.status_code,
                str(data.get("error") or f"{method} {path} answered {response.status_code}"),
                fix,
                data.get("fields") if isinstance(data.get("fields"), dict) else None,
                str(data.get("challenge") or ""),
            )
        return data


class LocalControl:
    """The same three calls through the services, for a worker on the database's machine.
    Without a token it makes itself one: it may write the database, so it may enrol; for
    the same reason it takes back its own name (same name and key: a restart) without the
    challenge a worker over HTTP must sign."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.worker: Worker | None = None

    def register(self, registration: Registration) -> Registered:
        token = self.token
        if token is None:
            venue = Venue.objects.get(name=registration["venue"])
            _, token = services.token_create(
                venue, ttl=timedelta(minutes=5), label=f"in-process start of {registration['name']}"
            )
        try:
            worker = services.worker_register(token, registration, in_process=True)
        except services.WorkerError as exc:
            raise ControlError(exc.status, str(exc), exc.fix, exc.fields) from exc
        self.worker = worker
        return {
            "worker_id": worker.id,
            "queue": worker.queue,
            "venue": worker.venue.name,
            "venue_queue": worker.venue.queue,
            "heartbeat_s": float(settings.FRLM_WORKER_HEARTBEAT_S),
            "trusted": worker.venue.trusted,
        }

    def heartbeat(self, worker_id: str, figures: Figures) -> None:
        try:
            services.worker_heartbeat(self.worker, services.figures_clean(dict(figures)))
        except services.WorkerUnknown:
            # The row went away under a live worker (a test database emptied between tests,
            # an operator's delete): this process still holds the identity, so it restores
            # the row and beats on.
            self._restore()
            services.worker_heartbeat(self.worker, services.figures_clean(dict(figures)))
        except services.WorkerError as exc:
            raise ControlError(exc.status, str(exc), exc.fix, exc.fields) from exc

    def deregister(self, worker_id: str) -> None:
        services.worker_deregister(self.worker)

    def _restore(self) -> None:
        assert self.worker is not None
        venue, _ = Venue.objects.get_or_create(
            name=self.worker.venue.name,
            defaults={"kind": self.worker.venue.kind, "trusted": self.worker.venue.trusted},
        )
        self.worker.venue = venue
        self.worker.token = None
        self.worker.last_heartbeat = None
        self.worker.save(force_insert=True)
        log.warning("worker %s restored its registration, which had been deleted", self.worker.id)
