"""Where a user looks for the run list: /runs/ (the docs named it; it was a 404)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.pages.helpers import make_user


@pytest.mark.django_db
def test_runs_slash_is_the_dashboard_with_its_filter_kept():
    client = Client()
    client.force_login(make_user("reader"))
    sent = client.get("/runs/?status=live&q=needle")
    assert sent.status_code == 302 and sent["Location"] == "/?status=live&q=needle"
    assert client.get("/runs/", follow=True).status_code == 200


@pytest.mark.django_db
def test_runs_slash_asks_an_anonymous_visitor_to_sign_in():
    page = Client().get("/runs/", follow=True)
    assert page.redirect_chain[-1][0].startswith("/accounts/login/")
