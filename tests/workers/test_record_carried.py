"""A worker registered again with its key takes on its record: a restart made a new worker
id, and every record was the id's, so a liar caught at reputation 0 came back with none and
got work again (a federation review)."""

from __future__ import annotations

import pytest

from frlm_web.redis_client import get_redis
from tests.gateway import enrolment_token
from workers import keys, services
from workers.reputation import (
    Observation,
    Reputations,
    credit_key,
    heir_key,
    load,
    rep_key,
    strike_add,
)


def register(name: str, key, venue: str = "carried") -> str:
    data = {"name": name, "venue": venue, "concurrency": 2, "public_key": keys.public_b64(key)}
    # in_process: the possession check (a signed challenge) is the API's, tested there.
    return services.worker_register(enrolment_token(venue), data, in_process=True).id


def caught_lying(client, name: str, key) -> str:
    """A worker registered, then caught lying six times: its record says so."""
    liar = register(name, key)
    caught = Reputations(client)
    for _ in range(6):
        caught.observe(Observation(liar, completion=True, agreement=False))
    caught.flush()
    return liar


@pytest.mark.django_db
def test_a_worker_registered_again_with_its_key_takes_on_its_record(stack):
    client = get_redis()
    key = keys.generate()
    liar = caught_lying(client, "gpu-liar", key)
    strike_add(client, liar)
    client.set(credit_key(liar), 3, ex=3600)
    before = load(client, [liar])[liar]
    assert before.suspect

    again = register("gpu-liar", key)  # kill -9, then the same command again
    assert again != liar
    assert client.get(credit_key(again)) == b"3" and 3500 < client.ttl(credit_key(again))
    # Its reputation when a conductor first meets it (only conductors write reputations).
    assert client.exists(rep_key(again)) == 0 and client.get(heir_key(again)) == liar.encode()
    met = Reputations(client)
    met.refresh([again])
    after = met.get(again)
    assert after.suspect and (after.agreement_a, after.agreement_b) == (
        before.agreement_a,
        before.agreement_b,
    )
    assert after.strikes == pytest.approx(before.strikes, rel=0.01)
    assert client.exists(heir_key(again)) == 0  # taken on once

    # Under another name with the same key too; a new key is a new worker with no record.
    renamed = register("gpu-honest", key)
    Reputations(client).refresh([renamed])
    assert load(client, [renamed])[renamed].suspect
    fresh = register("gpu-new", keys.generate())
    Reputations(client).refresh([fresh])
    assert not load(client, [fresh])[fresh].suspect


@pytest.mark.django_db
def test_a_record_is_not_laundered_through_a_name_no_conductor_met(stack):
    """A review registered a throwaway name with a caught liar's key (never connected, so
    no conductor took the record on), then the real name again: it came back clean."""
    client = get_redis()
    key = keys.generate()
    liar = caught_lying(client, "laundry", key)
    throwaway = register("never-connected", key)
    back = register("laundry", key)
    assert client.get(heir_key(back)) == liar.encode(), throwaway  # the record's, not its
    Reputations(client).refresh([back])
    assert load(client, [back])[back].suspect


@pytest.mark.django_db
def test_a_known_key_registers_under_a_new_name_only_with_proof_of_holding_it(stack, client):
    """The possession check ran only for a name already taken: anyone with a token could
    register a victim's public key (in every receipt) under a new name, and leave the
    victim's next start that worker's record."""
    victim_key = keys.generate()
    register("victim", victim_key, venue="keyed")
    data = {
        "name": "impostor",
        "venue": "keyed",
        "concurrency": 2,
        "public_key": keys.public_b64(victim_key),
    }
    with pytest.raises(services.ChallengeRequired):
        services.worker_register(enrolment_token("keyed"), data)
