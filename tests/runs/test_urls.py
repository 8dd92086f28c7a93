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


@pytest.mark.django_db
def test_the_apis_ask_a_script_signed_out_to_sign_in_whatever_it_asked():
    """Signed out, /api/worker-names answered "sign in to read traces" (a review)."""
    for url in ("/api/worker-names", "/api/runs/rnothere/events"):
        answer = Client().get(url)
        assert answer.status_code == 401, url
        assert answer.json()["error"].startswith("sign in first: POST /accounts/login/"), url


@pytest.mark.django_db
def test_the_dashboards_counts_add_up_to_its_runs(stack):
    """Cancelled and budget-stopped runs were in "runs" but in none of its parts (a review)."""
    import re

    from runs.models import Run
    from tests.helpers import bare_run

    owner = make_user("counter")
    for status in ("succeeded", "failed", "cancelled", "partial", "running"):
        bare_run(owner=owner, status=status)
    client = Client()
    client.force_login(owner)
    page = client.get("/").content.decode()
    shown = dict(
        re.findall(
            r'<span class="k">([a-z ·0-9]+?)(?: · [^<]*)?</span><span class="v[^"]*">(\d+)<', page
        )
    )
    assert (
        shown["runs"],
        shown["succeeded"],
        shown["failed"],
        shown["stopped"],
        shown["live"],
    ) == ("5", "1", "1", "2", "1"), shown
    assert Run.objects.count() == 5
