"""The worker registration API: tokens, registration, signed heartbeats and leaving, every
bad input, the OpenAPI schema, and the same API fuzzed against that schema."""

from __future__ import annotations

import io
import json
import logging
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, get_resolver

from frlm_web.redis_client import get_redis
from workers import keys
from workers.models import EnrolmentToken, Venue, Worker, token_digest
from workers.services import (
    challenge_claim,
    token_create,
    worker_deregister,
    worker_mark_lost,
    worker_register,
    worker_strikes,
)
from workers.signing import request_claim
from workers.venues import announced, live_workers

pytestmark = pytest.mark.usefixtures("stack", "api_failures_cleared")


def registration(key: Any, **over: Any) -> dict[str, Any]:
    return {
        "name": "gpu-1",
        "venue": "apitest",
        "models": ["frlm-sim-worker"],
        "concurrency": 4,
        "context_tokens": 32_000,
        "price_in": 0.1,
        "price_out": 0.2,
        "public_key": keys.public_b64(key),
        **over,
    }


def register(client: Client, token: str, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(
        "/api/workers/register",
        raw,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def signed_post(
    client: Client,
    path: str,
    body: Any,
    key: Any,
    *,
    stamp: str | None = None,
    sign_body: bytes | None = None,
    **extra: Any,
) -> Any:
    raw = json.dumps(body).encode()
    stamp = stamp or str(int(time.time()))
    sig = keys.sign(
        key, request_claim("POST", path, stamp, raw if sign_body is None else sign_body)
    )
    return client.post(
        path,
        raw,
        content_type="application/json",
        headers={"X-FRLM-Timestamp": stamp, "X-FRLM-Signature": sig},
        **extra,
    )


def joined(token: str, key: Any, **over: Any) -> Worker:
    return worker_register(token, registration(key, **over))


def test_it_registers_a_worker_with_an_enrolment_token(client, token):
    key = keys.generate()
    response = register(client, token, registration(key))
    assert response.status_code == 201, response.json()
    body = response.json()
    worker = Worker.objects.get(id=body["worker_id"])
    assert body == {
        "worker_id": worker.id,
        "queue": f"worker.{worker.id}",
        "venue": "apitest",
        "venue_queue": "venue.apitest",
        "heartbeat_s": 1.0,
        "trusted": False,
    }
    assert (worker.name, worker.concurrency, worker.context_tokens) == ("gpu-1", 4, 32_000)
    assert worker.models_served == ["frlm-sim-worker"] and worker.price_out == Decimal("0.2")
    assert worker.public_key == keys.public_b64(key) and worker.status == "active"


def test_it_refuses_missing_wrong_expired_and_revoked_tokens(client, venue, token):
    body = registration(keys.generate())
    expired = token_create(venue, ttl=timedelta(seconds=-1))[1]
    revoked_row, revoked = token_create(venue)
    EnrolmentToken.objects.filter(pk=revoked_row.pk).update(revoked=True)
    cases = {
        "missing": client.post("/api/workers/register", body, content_type="application/json"),
        "wrong": register(client, token + "x", body),
        "expired": register(client, expired, body),
        "revoked": register(client, revoked, body),
    }
    for case, response in cases.items():
        assert response.status_code == 401, case
        assert "frlm_token" in response.json()["fix"], case
    assert "expired" in cases["expired"].json()["error"]
    assert "revoked" in cases["revoked"].json()["error"]
    assert not Worker.objects.filter(venue__name="apitest").exists()


def test_it_lists_the_errors_of_every_malformed_field(client, token):
    bad = {
        "name": "-no good",
        "venue": "elsewhere",
        "models": ["ok", "has space"],
        "concurrency": 1025,
        "context_tokens": 0,
        "price_in": -1,
        "price_out": "cheap",
        "public_key": "AAAA",
        "colour": "red",
    }
    response = register(client, token, bad)
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert set(fields) == set(bad)
    assert "this enrolment token is for venue 'apitest'" in fields["venue"][0]
    assert "1 to 1024" in fields["concurrency"][0]
    assert "32 bytes" in fields["public_key"][0]
    assert register(client, token, registration(keys.generate(), concurrency=0)).status_code == 400
    # Finer than the 12 places a price is kept to: 1e-15 was stored as 0, "the list price".
    fine = register(client, token, registration(keys.generate(), price_in=1e-15, price_out=2e-12))
    assert fine.status_code == 400 and set(fine.json()["fields"]) == {"price_in"}
    assert "at most 12 decimal places" in fine.json()["fields"]["price_in"][0]
    assert register(client, token, registration(keys.generate(), concurrency=True)).json()[
        "fields"
    ] == {"concurrency": ["must be a whole number from 1 to 1024"]}
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = register(client, token, raw)
        assert response.status_code == 400 and response.json()["fix"], raw
    assert not Worker.objects.filter(venue__name="apitest").exists()


def test_it_refuses_json_nested_too_deeply_with_a_400_not_a_crash(client, token):
    """2 KB of brackets nest deeper than the JSON parser recurses: found by a review, a 500
    (RecursionError) for anyone, before any token was checked."""
    deep = b"[" * 1100 + b"]" * 1100
    for sent_with in (token, "not-a-token"):
        response = register(client, sent_with, deep)
        assert response.status_code == 400, response.content[:200]
        assert "nested too deeply" in response.json()["error"]
        assert response.json()["fix"]
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    stamp = str(int(time.time()))
    sig = keys.sign(key, request_claim("POST", path, stamp, deep))
    beat = client.post(
        path,
        deep,
        content_type="application/json",
        headers={"X-FRLM-Timestamp": stamp, "X-FRLM-Signature": sig},
    )
    assert beat.status_code == 400 and "nested too deeply" in beat.json()["error"]


def test_it_refuses_a_name_or_model_that_ends_in_a_newline(client, token):
    """`$` matches before a final newline: "gpu-1\\n" passed as a name beside "gpu-1" and
    showed as the same worker on every page (found by a review)."""
    joined(token, keys.generate())
    for over in ({"name": "gpu-1\n"}, {"name": "gpu-2\n"}, {"models": ["frlm-sim-worker\n"]}):
        response = register(client, token, registration(keys.generate(), **over))
        assert response.status_code == 400, (over, response.json())
        assert set(response.json()["fields"]) == set(over)
    assert Worker.objects.filter(venue__name="apitest").count() == 1


def test_it_refuses_an_oversized_body(client, token):
    body = registration(keys.generate(), models=["m" * 100] * 700)
    response = register(client, token, body)
    assert response.status_code == 413
    assert "larger than 65536 bytes" in response.json()["error"]


def test_it_refuses_a_second_worker_of_the_same_name_in_a_venue(client, venue, token):
    first = joined(token, keys.generate())
    response = register(client, token, registration(keys.generate()))
    assert response.status_code == 409
    assert response.json()["fields"] == {
        "name": ["taken in this venue by a worker with another key"]
    }
    other = Venue.objects.create(name="apitest2")
    elsewhere = token_create(other)[1]
    assert (
        register(client, elsewhere, registration(keys.generate(), venue="apitest2")).status_code
        == 201
    )
    # Once the first leaves, its name is free again.
    worker_deregister(first)
    assert register(client, token, registration(keys.generate())).status_code == 201


def test_a_row_put_back_between_a_beats_write_and_its_read_is_no_deregistration(token, monkeypatch):
    """The beat's write found no row (a test's fixture had emptied the tables) and its read
    found one (the fixture had put it back): the live worker was told it was deregistered
    and stopped; a stack worker vanished mid-session in CI so. The row is written again."""
    from django.db.models.query import QuerySet

    from workers.services import figures_clean, worker_heartbeat

    worker = joined(token, keys.generate())
    worker.last_heartbeat = None
    real_update, missed = QuerySet.update, []

    def update(self, **fields):
        if self.model is Worker and "last_heartbeat" in fields and not missed:
            missed.append(True)
            return 0  # the row was not there at that instant
        return real_update(self, **fields)

    monkeypatch.setattr(QuerySet, "update", update)
    worker_heartbeat(worker, figures_clean({"inflight": 1}))
    worker.refresh_from_db()
    assert missed and worker.status == "active" and worker.last_heartbeat is not None


def test_it_gives_a_restarted_worker_a_new_id_and_retires_the_old(client, token):
    key = keys.generate()
    first = joined(token, key)
    held = register(client, token, registration(key))
    assert held.status_code == 409 and first.status == "active"
    challenge = held.json()["challenge"]
    claim = challenge_claim(challenge, "apitest", "gpu-1", keys.public_b64(key))
    answer = {"challenge": challenge, "challenge_sig": keys.sign(key, claim)}
    second = register(client, token, registration(key, **answer)).json()["worker_id"]
    assert second != first.id
    first.refresh_from_db()
    assert first.status == "deregistered"


def test_it_takes_signed_heartbeats_and_announces_the_worker(client, token):
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    figures = {"inflight": 3, "memory_mb": 120.5, "latency_ms": 250.0, "pid": 4242}
    response = signed_post(client, path, figures, key)
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "worker_id": worker.id,
        "status": "active",
        "heartbeat_s": 1.0,
        "load": 0.75,
    }
    (live,) = announced(get_redis(), "apitest")
    assert live["name"] == live["worker_id"] == worker.id and live["label"] == "gpu-1"
    assert (live["inflight"], live["load"], live["memory_mb"]) == (3, 0.75, 120.5)
    assert (live["latency_ms"], live["pid"], live["queue"]) == (250.0, 4242, worker.queue)
    assert live["models"] == ["frlm-sim-worker"] and live["trusted"] is False
    # An untrusted venue's worker is refused the broker: over HTTP alone it takes no work.
    assert live["connection"] == "http" and live_workers(get_redis(), "apitest") == []
    worker.refresh_from_db()
    assert worker.last_heartbeat is not None and worker.health["inflight"] == 3
    bad = signed_post(client, path, {"inflight": -1, "memory_mb": "lots"}, key)
    assert bad.status_code == 400
    assert set(bad.json()["fields"]) == {"inflight", "memory_mb"}


def test_it_makes_a_lost_worker_active_again_when_it_beats(client, token):
    key = keys.generate()
    worker = joined(token, key)
    signed_post(client, f"/api/workers/{worker.id}/heartbeat", {"inflight": 0}, key)
    assert worker_mark_lost(worker.id) is True
    assert worker_mark_lost(worker.id) is False  # only one caller makes it lost
    assert Worker.objects.get(id=worker.id).status == "lost"
    assert announced(get_redis(), "apitest") == []
    response = signed_post(client, f"/api/workers/{worker.id}/heartbeat", {"inflight": 1}, key)
    assert response.status_code == 200
    assert Worker.objects.get(id=worker.id).status == "active"
    assert [w["worker_id"] for w in announced(get_redis(), "apitest")] == [worker.id]


def test_it_refuses_and_logs_requests_for_unknown_or_deregistered_workers(client, token, caplog):
    key = keys.generate()
    caplog.set_level(logging.WARNING, logger="workers.api")
    unknown = signed_post(client, "/api/workers/w000000000000/heartbeat", {}, key)
    assert unknown.status_code == 404 and "register" in unknown.json()["fix"]
    worker = joined(token, key)
    assert signed_post(client, f"/api/workers/{worker.id}/deregister", {}, key).status_code == 200
    for action in ("heartbeat", "deregister"):
        gone = signed_post(client, f"/api/workers/{worker.id}/{action}", {}, key)
        assert gone.status_code == 410 and "register again" in gone.json()["fix"]
    logged = caplog.text
    assert "unknown worker 'w000000000000'" in logged
    assert f"deregistered worker {worker.id}" in logged


def test_it_refuses_bad_signatures_without_counting_them_against_the_worker(client, token):
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    forged = signed_post(client, path, {"inflight": 0}, keys.generate())
    tampered = signed_post(client, path, {"inflight": 0}, key, sign_body=b'{"inflight": 9}')
    unsigned = client.post(path, {}, content_type="application/json")
    for response in (forged, tampered):
        assert response.status_code == 401
        assert "does not match" in response.json()["error"]
    assert unsigned.status_code == 401 and "X-FRLM-Signature" in unsigned.json()["error"]
    assert worker_strikes(worker.id) == 0  # whoever sent them is not known to be the worker
    assert announced(get_redis(), "apitest") == []


def test_it_refuses_stale_and_replayed_requests(client, token):
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    stale = signed_post(client, path, {}, key, stamp=str(int(time.time()) - 3600))
    assert stale.status_code == 401 and "within 60 s" in stale.json()["error"]
    stamp = str(int(time.time()))
    assert signed_post(client, path, {"inflight": 1}, key, stamp=stamp).status_code == 200
    replay = signed_post(client, path, {"inflight": 1}, key, stamp=stamp)
    assert replay.status_code == 401 and "already used" in replay.json()["error"]
    assert worker_strikes(worker.id) == 0  # neither is a forgery


def test_it_deregisters_a_worker_and_takes_it_out_of_presence(client, token):
    key = keys.generate()
    worker = joined(token, key)
    signed_post(client, f"/api/workers/{worker.id}/heartbeat", {}, key)
    assert announced(get_redis(), "apitest")
    response = signed_post(
        client, f"/api/workers/{worker.id}/deregister", {"reason": "maintenance"}, key
    )
    assert response.json() == {"worker_id": worker.id, "status": "deregistered"}
    assert announced(get_redis(), "apitest") == []
    worker.refresh_from_db()
    assert worker.status == "deregistered" and worker.deregistered is not None
    bad = signed_post(client, f"/api/workers/{worker.id}/deregister", {"why": 1}, key)
    assert bad.status_code == 410  # it is gone before its body is read


def test_it_answers_other_methods_with_405(client, token):
    response = client.get("/api/workers/register")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response.json()["fix"] == "send a POST"
    assert client.post("/api/openapi.json").json()["fix"] == "send a GET"


def test_it_exempts_only_the_worker_api_from_csrf(token):
    strict = Client(enforce_csrf_checks=True)
    assert register(strict, token, registration(keys.generate())).status_code == 201
    assert strict.post("/accounts/login/", {"username": "x"}).status_code == 403


def test_it_documents_every_endpoint_and_error_in_the_openapi_schema(client):
    schema = client.get("/api/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    routes = [
        "/" + str(p.pattern).replace("<str:worker_id>", "{worker_id}")
        for p in get_resolver().url_patterns
        if isinstance(p, URLPattern) and str(p.pattern).startswith("api/workers")
    ]
    assert routes and set(routes) <= set(schema["paths"])
    register_op = schema["paths"]["/api/workers/register"]["post"]
    assert {"201", "400", "401", "409", "413", "429"} <= set(register_op["responses"])
    for action in ("heartbeat", "deregister"):
        op = schema["paths"][f"/api/workers/{{worker_id}}/{action}"]["post"]
        assert {"400", "401", "404", "410", "413", "429"} <= set(op["responses"])
        headers = {p["name"] for p in op["parameters"] if p["in"] == "header"}
        assert headers == {"X-FRLM-Timestamp", "X-FRLM-Signature"}
    properties = schema["components"]["schemas"]["Registration"]["properties"]
    assert set(properties) == {
        "name",
        "venue",
        "models",
        "concurrency",
        "context_tokens",
        "price_in",
        "price_out",
        "public_key",
        "challenge",
        "challenge_sig",
    }


def test_it_prints_a_token_once_from_the_command_line(client, transactional_db):
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "frlm_token",
        "--venue",
        "clitest",
        "--ttl-hours",
        "2",
        "--label",
        "rack 4",
        stdout=out,
        stderr=err,
    )
    plaintext = out.getvalue().strip()
    assert plaintext.startswith("frlmt_") and "shown only now" in err.getvalue()
    row = EnrolmentToken.objects.get(venue__name="clitest")
    assert row.venue.name == "clitest" and row.label == "rack 4" and row.expires is not None
    assert plaintext not in row.digest
    body = registration(keys.generate(), venue="clitest")
    assert register(client, plaintext, body).status_code == 201


def test_it_makes_tokens_in_the_admin_and_shows_the_plaintext_once(venue):
    admin = get_user_model().objects.create_superuser("root", "r@example.com", "pw")
    browser = Client()
    browser.force_login(admin)
    response = browser.post(
        "/admin/workers/enrolmenttoken/add/",
        {"venue": venue.pk, "label": "from the admin", "ttl_hours": "1"},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    (message,) = [m for m in shown if "shown only now" in m]
    plaintext = message.rsplit(" ", 1)[1]
    row = EnrolmentToken.objects.get(label="from the admin")
    assert row.created_by == admin and row.expires is not None
    assert register(Client(), plaintext, registration(keys.generate())).status_code == 201
    # The list shows it again without its plaintext.
    assert plaintext not in browser.get("/admin/workers/enrolmenttoken/").content.decode()


def test_revoking_a_token_in_the_admin_says_who_stays_and_can_cut_them_off(client, token):
    """A revoked token let its workers keep working with nothing said (a review): the admin's
    revoke now says how many stay, and its second action deregisters them too."""
    key, other_key = keys.generate(), keys.generate()
    worker = joined(token, key)
    admin_user = get_user_model().objects.create_superuser("root", "r@example.com", "pw")
    browser = Client()
    browser.force_login(admin_user)
    row = EnrolmentToken.objects.get(digest=token_digest(token))

    def act(action: str, filters: str = "") -> list[str]:
        response = browser.post(
            f"/admin/workers/enrolmenttoken/{filters}",
            {"action": action, "_selected_action": [row.pk]},
            follow=True,
        )
        return [str(m) for m in response.context["messages"]]

    # From the list filtered to tokens not revoked, as an admin looking for live ones sees
    # it: the action's queryset carries the filter (it found nobody once it had revoked).
    lost = joined(token, keys.generate(), name="gpu-lost")
    Worker.objects.filter(id=lost.id).update(status=Worker.Status.LOST)
    assert act("revoke", "?revoked__exact=0") == [
        "1 token(s) revoked: nobody can join or register again with them. 1 worker(s) that "
        "joined with them still work and 1 lost one(s) may come back; to cut them off too, use "
        "'Revoke the selected tokens and deregister the workers they let in'."
    ]
    beat = f"/api/workers/{worker.id}/heartbeat"
    assert signed_post(client, beat, {"inflight": 0}, key).status_code == 200
    assert register(client, token, registration(other_key, name="gpu-2")).status_code == 401
    EnrolmentToken.objects.filter(pk=row.pk).update(revoked=False)
    assert act("revoke_and_deregister", "?revoked__exact=0") == [
        "1 token(s) revoked and 2 worker(s) that joined with them deregistered: each is told "
        "at its next heartbeat and gets no more work."
    ]
    assert Worker.objects.get(id=worker.id).status == "deregistered"
    assert signed_post(client, beat, {"inflight": 0}, key).status_code == 410
    assert announced(get_redis(), "apitest") == []


def test_it_survives_a_fuzz_of_its_own_openapi_schema(transactional_db, venue, token, settings):
    """schemathesis generates requests from /api/openapi.json against the app: no 5xx."""
    settings.FRLM_API_FAIL_LIMIT = 10**9  # its many bad requests must not lock it out
    schemathesis = pytest.importorskip("schemathesis")
    from django.core.wsgi import get_wsgi_application

    app = get_wsgi_application()
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
    failures: list[str] = []
    seen: dict[str, set[int]] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/api/workers/register",
        "/api/workers/{worker_id}/heartbeat",
        "/api/workers/{worker_id}/deregister",
    }
    key = keys.generate()
    worker = joined(token, key, name="fuzzed")
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            statuses = seen.setdefault(operation.path, set())
            _fuzz(operation, mode, token, (worker.id, key), failures, statuses)
    assert failures == []
    # Generated requests got past the token and the signature into validation, and past it.
    assert {400, 401} <= seen["/api/workers/register"]
    assert {200, 400, 401, 404} <= seen["/api/workers/{worker_id}/heartbeat"]


def _fuzz(
    operation: Any,
    mode: Any,
    token: str,
    signer: tuple[str, Any],
    failures: list[str],
    seen: set[int],
) -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=80,
        deadline=None,
        derandomize=True,  # the same cases every run: coverage below must not be luck
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode))
    def fuzz(case: Any) -> None:
        if operation.path == "/api/workers/register" and case.body is not None:
            # Half the cases carry a real token, so validation runs past the 401.
            if len(json.dumps(case.body, default=str)) % 2:
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        body = case.body if isinstance(case.body, dict | list | str | int | float) else {}
        if "{worker_id}" in operation.path and len(json.dumps(body)) % 2:
            # Half the cases are signed by the worker, so its body is what gets checked.
            path = operation.path.replace("{worker_id}", signer[0])
            status = signed_post(Client(), path, body, signer[1]).status_code
        else:
            status = case.call().status_code
        seen.add(status)
        if status >= 500:
            failures.append(f"{operation.method.upper()} {operation.path}: {status}")

    fuzz()


def test_a_deregistered_worker_is_refused_at_its_next_beat_not_its_next_write(token):
    """Whoever serves a worker (the gateway, the worker API) holds its row as it was when
    the worker said hello, and wrote a beat to the database only every
    FRLM_HEARTBEAT_WRITE_S: until then a deregistered worker's beats put it back in presence
    and it was served (a review: about 5 s). Deregistration bars its id from presence."""
    from workers.services import WorkerGone, figures_clean, worker_heartbeat

    worker = joined(token, keys.generate())
    figures = figures_clean({"inflight": 0})
    worker_heartbeat(worker, figures)
    held = Worker.objects.select_related("venue").get(id=worker.id)  # as a server holds it
    assert worker.id in {w["name"] for w in live_workers(get_redis(), "apitest")}
    worker_deregister(Worker.objects.get(id=worker.id))
    with pytest.raises(WorkerGone, match="deregistered"):
        worker_heartbeat(held, figures)
    assert worker.id not in {w["name"] for w in live_workers(get_redis(), "apitest")}


def test_a_venues_trust_changed_by_the_operator_reaches_presence_at_the_next_write(venue, token):
    """A worker process holds its row, venue and all, from its registration (an in-process
    worker, a gateway connection): its presence said the trust the venue had then, for
    good. An operator who withdrew a venue's trust left its workers validating others; a
    stack worker that restored its row while a test's venue of the same name was untrusted
    stayed untrusted for the rest of the CI session (six trust tests failed). The trust is
    read again at each heartbeat that writes the row (FRLM_HEARTBEAT_WRITE_S)."""
    from workers.services import figures_clean, worker_heartbeat

    worker = joined(token, keys.generate())

    def beat_trust() -> bool:
        worker.last_heartbeat = None  # this beat writes the row
        worker_heartbeat(worker, figures_clean({"inflight": 0}))
        (live,) = announced(get_redis(), "apitest")
        return live["trusted"]

    assert beat_trust() is False
    Venue.objects.filter(id=venue.id).update(trusted=True)
    assert beat_trust() is True
    Venue.objects.filter(id=venue.id).update(trusted=False)
    assert beat_trust() is False
