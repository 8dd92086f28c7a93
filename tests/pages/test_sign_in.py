"""Signing in, and everything refused to whoever has not."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.helpers import bare_run
from tests.pages.helpers import PASSWORD, make_user, shot

PAGES = [
    "/",
    "/runs/new",
    "/runs/rabc123",
    "/runs/table",
    "/diff",
    "/diff?a=x&b=y",
    "/venues",
    "/venues/panel",
    "/runs/rabc123/header",
    "/workers/wabc123",
]
APIS = [
    "/api/runs/rabc123/events",
    "/api/runs/rabc123/spans/s1",
    "/api/runs/rabc123/turns",
    "/api/runs/rabc123/aggregates",
    "/api/diff?a=rabc123&b=rabc123",
    "/venues/history",
    "/api/worker-names?id=wabc123",
]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_it_signs_in_with_the_form_and_lands_on_the_dashboard(anonymous, web, venues):
    make_user("demo", staff=True)
    page = anonymous
    page.goto("/")
    assert "/accounts/login/" in page.url and "next=/" in page.url
    shot(page, "01-sign-in")
    page.fill("#id_username", "demo")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".errors").is_visible()
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(web + "/")
    assert page.locator("h1", has_text="Runs").is_visible()
    page.wait_for_selector("#health .venue")  # the venue panel loads through htmx
    assert page.locator("#health", has_text="local").is_visible()


def test_it_redirects_pages_and_refuses_apis_to_anonymous_users(web, venues):
    for path in PAGES:
        status, headers, _ = fetch(web + path)
        assert status == 302, path
        assert headers["Location"].startswith("/accounts/login/?next="), path
    for path in APIS:
        status, headers, body = fetch(web + path)
        assert status == 401, path  # a script asked: no redirect to a sign-in page
        assert "sign in" in json.loads(body)["error"]
    for path in ["/runs/new", "/runs/rabc123/replay", "/runs/rabc123/cancel"]:
        status, _, _ = fetch(web + path, method="POST")
        assert status == 403, path  # no CSRF token: refused before anything else


def test_it_refuses_an_anonymous_socket(anonymous, web, venues):
    run = bare_run(
        question="q",
    )
    page = anonymous
    page.goto("/accounts/login/")
    code = page.evaluate(
        """(id) => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}/ws/runs/${id}?after_seq=0`);
            ws.onmessage = () => resolve('message');
            ws.onclose = (e) => resolve(e.code);
        })""",
        run.id,
    )
    assert code == 4401


def test_a_dashboard_whose_session_ended_goes_to_sign_in_and_comes_back(page, web, venues):
    """The dashboard's polls pasted the sign-in page into its panels once the session ended
    (signed out in another tab), the header still naming the user."""
    from django.contrib.sessions.models import Session

    page.goto("/?q=crimson")
    page.wait_for_selector("#runs")
    Session.objects.all().delete()
    page.wait_for_url("**/accounts/login/?next=*", timeout=15_000)
    assert page.title().startswith("Sign in")
    assert page.locator("#runs").count() == 0
    assert "next=%2F%3Fq%3Dcrimson" in page.url


def test_there_is_no_password_reset_by_mail_that_no_mail_could_reach(web, venues):
    """Django's reset pages said a mail was sent, and none could be: the server has no mail
    set up (a review). A password is changed signed in, or by `manage.py changepassword`."""
    for path in ["/accounts/password_reset/", "/accounts/reset/MQ/set-password/"]:
        status, _, _ = fetch(web + path)
        assert status == 404, path
    status, headers, _ = fetch(web + "/accounts/password_change/")
    assert status == 302 and headers["Location"].startswith("/accounts/login/?next=")
