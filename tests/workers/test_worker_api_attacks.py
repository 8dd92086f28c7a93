"""Attacks on the worker API that must do no harm: strikes by whoever can reach the
server, a replay whose signature is re-encoded, a name taken over with only its public
key, and strikes that never fade."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from django.core.wsgi import get_wsgi_application

from frlm_web.redis_client import get_redis
from tests.workers.test_worker_api import joined, register, registration, signed_post
from workers import keys, reputation, services
from workers.client import ControlError, HttpControl, LocalControl
from workers.models import Worker
from workers.services import worker_strike, worker_strikes
from workers.signing import request_claim

pytestmark = pytest.mark.usefixtures("stack", "api_failures_cleared")

ZERO_SIG = base64.b64encode(bytes(64)).decode()


def unsigned_post(client: Any, path: str, sig: str, **extra: Any) -> Any:
    return client.post(
        path,
        b"{}",
        content_type="application/json",
        headers={"X-FRLM-Timestamp": str(int(time.time())), "X-FRLM-Signature": sig},
        **extra,
    )


def proof(key: Any, challenge: str, name: str = "gpu-1") -> dict[str, str]:
    claim = {
        "challenge": challenge,
        "venue": "apitest",
        "name": name,
        "public_key": keys.public_b64(key),
    }
    return {"challenge": challenge, "challenge_sig": keys.sign(key, claim)}


def re_encodings(sig: str) -> list[str]:
    """Other spellings of the same 64 signature bytes: the 86th character carries two bits
    of the last byte and four bits that a lax decoder ignores."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(sig[85])
    return [sig[:85] + alphabet[last ^ low] + sig[86:] for low in range(1, 16)]


def over_wsgi(control: HttpControl) -> HttpControl:
    """The HTTP client talking to this process's app (and the test database)."""
    control.http = httpx.Client(
        transport=httpx.WSGITransport(app=get_wsgi_application()), base_url="http://testserver"
    )
    return control


# --- 1. unauthenticated strikes ----------------------------------------------------------
def test_it_records_no_strike_for_an_unauthenticated_request(client, token):
    worker = joined(token, keys.generate())
    path = f"/api/workers/{worker.id}/heartbeat"
    for sig in (ZERO_SIG, ZERO_SIG, "garbage", ZERO_SIG):
        assert unsigned_post(client, path, sig).status_code == 401
    assert worker_strikes(worker.id) == 0
    assert reputation.load(get_redis(), [worker.id])[worker.id].score == 1.0


def test_it_throttles_an_address_after_too_many_failures(client, token, settings):
    settings.FRLM_API_FAIL_LIMIT = 5
    settings.FRLM_API_FAIL_WINDOW_S = 60
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    for _ in range(5):
        assert unsigned_post(client, path, ZERO_SIG).status_code == 401
    # Even a valid request from that address waits: its signature is not even checked.
    blocked = signed_post(client, path, {}, key)
    assert blocked.status_code == 429, blocked.json()
    assert 0 < int(blocked["Retry-After"]) <= 60
    body = blocked.json()
    assert "too many" in body["error"] and "Retry-After" in body["fix"]
    assert register(client, token, registration(keys.generate(), name="gpu-9")).status_code == 429
    # Another address is not held up by this one.
    assert signed_post(client, path, {}, key, REMOTE_ADDR="192.0.2.7").status_code == 200
    assert worker_strikes(worker.id) == 0


def test_it_throttles_an_address_that_tries_bad_enrolment_tokens(client, token, settings):
    settings.FRLM_API_FAIL_LIMIT = 3
    settings.FRLM_API_FAIL_WINDOW_S = 60
    for guess in ("frlmt_guess1", "frlmt_guess2", "frlmt_guess3"):
        assert register(client, guess, registration(keys.generate())).status_code == 401
    # The real token now waits too: it is not even checked until the window ends.
    blocked = register(client, token, registration(keys.generate()))
    assert blocked.status_code == 429, blocked.json()
    assert 0 < int(blocked["Retry-After"]) <= 60
    assert not Worker.objects.filter(name="gpu-1").exists()


def test_it_refuses_a_worker_that_floods_heartbeats_without_a_strike(client, token, settings):
    settings.FRLM_API_HEARTBEAT_LIMIT = 3
    settings.FRLM_API_HEARTBEAT_WINDOW_S = 60
    key, other_key = keys.generate(), keys.generate()
    worker = joined(token, key)
    other = joined(token, other_key, name="gpu-2")
    path = f"/api/workers/{worker.id}/heartbeat"
    now = int(time.time())
    # Each request signed afresh (another timestamp), as a flooding worker would.
    for ago in range(3):
        assert signed_post(client, path, {}, key, stamp=str(now - ago)).status_code == 200
    flooded = signed_post(client, path, {}, key, stamp=str(now - 3))
    assert flooded.status_code == 429, flooded.json()
    assert 0 < int(flooded["Retry-After"]) <= 60
    assert "heartbeats" in flooded.json()["error"] and "Retry-After" in flooded.json()["fix"]
    assert worker_strikes(worker.id) == 0
    # Neither the address nor another worker is held up: beating too often is no failure.
    assert services.auth_throttle("127.0.0.1") is None
    other_path = f"/api/workers/{other.id}/heartbeat"
    assert signed_post(client, other_path, {}, other_key).status_code == 200


# --- 2. replay with a re-encoded signature -----------------------------------------------
def test_it_refuses_a_replay_whose_signature_is_re_encoded(client, token):
    key = keys.generate()
    worker = joined(token, key)
    path = f"/api/workers/{worker.id}/heartbeat"
    raw = json.dumps({"inflight": 1}).encode()
    stamp = str(int(time.time()))
    sig = keys.sign(key, request_claim("POST", path, stamp, raw))

    def send(signature: str) -> Any:
        return client.post(
            path,
            raw,
            content_type="application/json",
            headers={"X-FRLM-Timestamp": stamp, "X-FRLM-Signature": signature},
        )

    assert send(sig).status_code == 200
    for variant in re_encodings(sig):
        response = send(variant)
        assert response.status_code == 401, variant
        assert "standard base64 of the 64 signature bytes" in response.json()["fix"]
    assert send(sig).status_code == 401  # and the original is a plain replay


def test_it_accepts_only_the_canonical_encoding_of_signatures_and_keys():
    key = keys.generate()
    pub = keys.public_b64(key)
    sig = keys.sign(key, {"a": 1})
    assert keys.verify(pub, {"a": 1}, sig)
    assert keys.signature_bytes(sig) == base64.b64decode(sig)
    for variant in re_encodings(sig):
        assert not keys.verify(pub, {"a": 1}, variant)
        with pytest.raises(keys.BadSignature):
            keys.signature_bytes(variant)
    # Ed25519's own malleability (S + L) is refused by the library.
    raw = base64.b64decode(sig)
    s_plus_l = int.from_bytes(raw[32:], "little") + 2**252 + 27742317777372353535851937790883648493
    malleated = base64.b64encode(raw[:32] + s_plus_l.to_bytes(32, "little")).decode()
    assert not keys.verify(pub, {"a": 1}, malleated)
    # A public key has one spelling too (its 43rd character carries two ignored bits).
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    other = pub[:42] + alphabet[alphabet.index(pub[42]) ^ 1] + pub[43:]
    with pytest.raises(keys.BadKey, match="standard base64"):
        keys.public_from_b64(other)
    assert not keys.verify(other, {"a": 1}, sig)


# --- 3. name takeover --------------------------------------------------------------------
def test_it_keeps_a_name_from_whoever_has_only_the_workers_public_key(client, token):
    key = keys.generate()
    honest = joined(token, key)
    # The public key is in every receipt; the enrolment token may be widely shared.
    attempt = register(client, token, registration(key))
    assert attempt.status_code == 409, attempt.json()
    challenge = attempt.json()["challenge"]
    assert "challenge_sig" in attempt.json()["fix"]
    forged = register(client, token, registration(key, **proof(keys.generate(), challenge)))
    assert forged.status_code == 401
    assert "challenge" in forged.json()["error"]
    honest.refresh_from_db()
    assert honest.status == "active"
    assert list(Worker.objects.filter(venue__name="apitest")) == [honest]


def test_it_takes_a_challenge_once_and_only_for_the_name_it_was_given_for(client, token):
    key, other_key = keys.generate(), keys.generate()
    first = joined(token, key)
    joined(token, other_key, name="gpu-2")
    challenge = register(client, token, registration(key)).json()["challenge"]
    elsewhere = register(
        client, token, registration(other_key, name="gpu-2", **proof(other_key, challenge, "gpu-2"))
    )
    assert elsewhere.status_code == 409 and elsewhere.json()["challenge"] != challenge
    challenge = register(client, token, registration(key)).json()["challenge"]
    answer = registration(key, **proof(key, challenge))
    taken_back = register(client, token, answer)
    assert taken_back.status_code == 201, taken_back.json()
    first.refresh_from_db()
    assert first.status == "deregistered"
    again = register(client, token, answer)
    assert again.status_code == 409 and again.json()["challenge"] != challenge
    assert Worker.objects.get(id=taken_back.json()["worker_id"]).status == "active"


def test_it_lets_a_restarted_worker_take_its_name_back_over_http(token):
    key = keys.generate()
    first = joined(token, key)
    control = over_wsgi(HttpControl("http://testserver", token, key))
    second = control.register(registration(key))
    assert second["worker_id"] != first.id
    first.refresh_from_db()
    assert first.status == "deregistered"
    stranger = over_wsgi(HttpControl("http://testserver", token, keys.generate()))
    with pytest.raises(ControlError) as refused:
        stranger.register(registration(stranger.key))
    assert refused.value.status == 409
    assert "choose another name" in refused.value.fix
    assert Worker.objects.get(id=second["worker_id"]).status == "active"


def test_it_lets_an_in_process_worker_restart_under_its_name(token):
    key = keys.generate()
    first = LocalControl(token).register(registration(key))
    second = LocalControl(token).register(registration(key))
    assert second["worker_id"] != first["worker_id"]
    assert Worker.objects.get(id=first["worker_id"]).status == "deregistered"
    with pytest.raises(ControlError) as refused:
        LocalControl(token).register(registration(keys.generate()))
    assert refused.value.status == 409


# --- 4. strikes fade ---------------------------------------------------------------------
def test_it_lets_strikes_fade_with_their_half_life(settings):
    settings.FRLM_STRIKE_HALF_LIFE_S = 2.0
    wid = "w" + uuid.uuid4().hex[:12]
    worker_strike(wid, "forged a result")
    assert worker_strike(wid, "forged another") > 1.5
    assert worker_strikes(wid) > 1.5
    time.sleep(4.2)  # over two half-lives: at most a quarter is left
    assert 0 < worker_strikes(wid) < 0.5
    rep = reputation.load(get_redis(), [wid])[wid]
    assert 0 < rep.strikes < 0.5 and rep.score > 0.7
    # A new strike adds to what is left, not to the old count.
    assert 1 < worker_strike(wid, "and another") < 1.5
