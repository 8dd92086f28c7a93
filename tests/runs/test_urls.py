"""Where a user looks for the run list: /runs/ (the docs named it; it was a 404)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.pages.helpers import PASSWORD, make_user


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
def test_the_apis_ask_a_script_signed_out_to_sign_in_whatever_it_asked(stack):
    """Signed out, /api/worker-names answered "sign in to read traces" (a review)."""
    for url in ("/api/worker-names", "/api/runs/rnothere/events"):
        answer = Client().get(url)
        assert answer.status_code == 401, url
        assert answer.json()["error"].startswith("sign in first: GET /accounts/login/"), url
    # What it says works, CSRF checked as in production.
    make_user("scripted")
    script = Client(enforce_csrf_checks=True)
    script.get("/accounts/login/")
    token = script.cookies["csrftoken"].value
    signed = script.post(
        "/accounts/login/",
        {"username": "scripted", "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert signed.status_code == 302 and "sessionid" in script.cookies
    assert script.get("/api/worker-names").status_code == 200


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


@pytest.mark.django_db
def test_an_exact_replay_says_its_cost_is_recorded_and_the_dashboard_adds_none_of_it(stack):
    """An exact replay called no model, yet its page showed the recording's cost as its own
    and the dashboard's cost added it again (a review)."""
    from decimal import Decimal

    from runs.cli import format_summary, summarise
    from tests.helpers import bare_run

    owner = make_user("replayer")
    source = bare_run(owner=owner, status="succeeded", cost=Decimal("1.25"), tokens_in=1000)
    exact = bare_run(owner=owner, status="succeeded", cost=Decimal("1.25"), tokens_in=1000)
    exact.replay_of = source
    exact.save()
    what_if = bare_run(owner=owner, status="succeeded", cost=Decimal("0.5"), tokens_in=10)
    what_if.replay_of, what_if.replay_turn = source, 1
    what_if.save()
    assert (source.exact_replay, exact.exact_replay, what_if.exact_replay) == (False, True, False)
    client = Client()
    client.force_login(owner)
    dashboard = client.get("/").content.decode()
    assert '<span class="v">$1.7500</span>' in dashboard
    page = client.get(f"/runs/{exact.id}").content.decode()
    assert 'id="cost-recorded"' in page
    assert 'id="cost-recorded"' not in client.get(f"/runs/{what_if.id}").content.decode()
    assert "(recorded: this replay called no model and spent nothing)" in format_summary(
        summarise(exact)
    )


def test_a_browser_asking_for_favicon_ico_is_sent_to_the_icon():
    """Every admin page logged a 404 for /favicon.ico (a review)."""
    answer = Client().get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"].endswith("favicon.svg")
