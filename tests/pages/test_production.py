"""What the real daphne answers with DEBUG off, as it now runs by default: static files
served, no debug page for a path that does not exist, a socket to an unknown path closed
with 4404, a run socket opened from another site's page refused, and a browser's sign-in
refused past the limit of failures."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.helpers import bare_run
from tests.pages.helpers import PASSWORD, make_user, session_cookie


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_it_serves_static_files_with_debug_off(web, venues):
    status, headers, body = get(web + "/static/frlm.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    assert body
    # The admin's own, found in its app: no collectstatic step is needed.
    assert get(web + "/static/admin/css/base.css")[0] == 200
    assert get(web + "/static/nothing-here.css")[0] == 404


def test_it_shows_no_debug_page_for_a_path_that_does_not_exist(web, venues):
    status, _, body = get(web + "/no/such/page")
    assert status == 404
    assert b"URLconf" not in body and b"DEBUG = True" not in body and b"Traceback" not in body
    # The site's own page, with a way back: it was Django's bare "Not Found" (a review).
    assert b"Back to the dashboard" in body and b"/no/such/page" in body
    assert get(web + "/static/favicon.svg")[0] == 200


@pytest.mark.parametrize("path", ["/ws/nope", "/ws/runs/rabc123/extra", "/elsewhere"])
def test_it_closes_a_socket_to_an_unknown_path_with_4404(web, venues, path):
    with connect(web.replace("http://", "ws://") + path, open_timeout=10) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9",  # another port of the same host: a local service's page
        "https://127.0.0.1",
        "http://localhost",
        "http://evil.example",
        "null",
    ],
)
def test_it_refuses_a_signed_in_users_run_socket_opened_from_another_origin(web, venues, origin):
    """A page on another port of the console's host rode the user's session cookie into the
    run socket and read the run: the Origin was compared by host name only."""
    owner = make_user("watched")
    run = bare_run(question="a secret question", owner=owner)
    cookie = {"Cookie": f"sessionid={session_cookie(owner, web)['value']}"}
    url = web.replace("http://", "ws://") + f"/ws/runs/{run.id}?after_seq=0"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, origin=origin, additional_headers=cookie, open_timeout=10):
            pass
    assert refused.value.response.status_code == 403
    with connect(url, origin=web, additional_headers=cookie, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10)) == {"type": "caught_up", "last_seq": 0}


def test_it_refuses_a_browsers_sign_in_past_the_limit_of_failures(
    anonymous, web, venues, sign_in_counts_cleared
):
    make_user("hammered", staff=True)
    page = anonymous
    page.goto("/accounts/login/")
    for _ in range(10):  # FRLM_LOGIN_FAIL_LIMIT's default
        page.fill("#id_username", "hammered")
        page.fill("#id_password", "wrong")
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert page.locator(".errors").is_visible()
    page.fill("#id_username", "hammered")
    page.fill("#id_password", PASSWORD)
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click("button[type=submit]")
    assert posted.value.status == 429
    assert page.locator(".errors", has_text="Try again in").is_visible()
    assert "/accounts/login/" in page.url
