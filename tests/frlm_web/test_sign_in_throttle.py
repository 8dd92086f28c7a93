"""Sign-in attempts throttled per source address and per username (frlm_web/accounts.py),
on both sign-in forms, with the counts in the stack's real Redis."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

PASSWORD = "correct horse battery staple"


@pytest.fixture
def limit(settings, sign_in_counts_cleared) -> int:
    settings.FRLM_LOGIN_FAIL_LIMIT = 3
    settings.FRLM_LOGIN_FAIL_WINDOW_S = 120
    return 3


@pytest.fixture
def alice(transactional_db):
    return get_user_model().objects.create_user("alice", password=PASSWORD, is_staff=True)


def sign_in(client, username: str, password: str, address: str = "192.0.2.1", path=None):
    return client.post(
        path or "/accounts/login/",
        {"username": username, "password": password},
        REMOTE_ADDR=address,
    )


def test_it_answers_429_to_an_address_past_the_limit_saying_when_to_retry(client, alice, limit):
    for name in ("alice", "bob", "carol"):
        assert sign_in(client, name, "wrong").status_code == 200
    refused = sign_in(client, "alice", PASSWORD)
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 120
    assert b"Too many failed sign-in attempts" in refused.content
    assert b"Try again in" in refused.content
    assert "_auth_user_id" not in client.session
    # The admin's form is held up as well, and another address is not.
    assert sign_in(client, "alice", PASSWORD, path="/admin/login/").status_code == 429
    assert sign_in(client, "alice", PASSWORD, address="192.0.2.2").status_code == 302


def test_it_answers_429_for_a_username_tried_from_many_addresses(client, alice, limit):
    """Guessing spread over addresses: the username's own limit is USERNAME_FACTOR times the
    plain one, each address staying under its own."""
    from frlm_web.accounts import USERNAME_FACTOR

    for i in range(limit * USERNAME_FACTOR):
        assert sign_in(client, "Alice", "wrong", address=f"198.51.100.{i}").status_code == 200
    assert sign_in(client, "alice", PASSWORD, address="198.51.100.250").status_code == 429
    # Nobody else's sign-in from a fresh address is held up.
    get_user_model().objects.create_user("bob", password=PASSWORD)
    assert sign_in(client, "bob", PASSWORD, address="198.51.100.250").status_code == 302


def test_one_address_cannot_lock_a_user_out(client, alice, limit):
    """Failures for a known username from one address stop that address, and that username
    from there, not the user signing in from elsewhere (a review locked any user out with
    ten wrong passwords from anywhere)."""
    for _ in range(limit):
        assert sign_in(client, "alice", "wrong", address="198.51.100.7").status_code == 200
    assert sign_in(client, "alice", "wrong", address="198.51.100.7").status_code == 429
    assert sign_in(client, "alice", PASSWORD, address="203.0.113.50").status_code == 302


def test_it_counts_the_admin_forms_failures_too(client, alice, limit):
    for _ in range(3):
        assert sign_in(client, "alice", "wrong", path="/admin/login/").status_code == 200
    assert sign_in(client, "alice", PASSWORD).status_code == 429


def test_it_lets_a_successful_sign_in_through_and_forgets_the_usernames_failures(
    client, alice, limit
):
    for _ in range(2):
        assert sign_in(client, "alice", "wrong", address="203.0.113.1").status_code == 200
    assert sign_in(client, "alice", PASSWORD, address="203.0.113.1").status_code == 302
    client.logout()
    # Two more failures from elsewhere would have made four for the username.
    for _ in range(2):
        assert sign_in(client, "alice", "wrong", address="203.0.113.2").status_code == 200
    signed_in = sign_in(client, "alice", PASSWORD, address="203.0.113.3")
    assert signed_in.status_code == 302 and signed_in["Location"] == "/"
