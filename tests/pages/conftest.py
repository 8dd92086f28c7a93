"""The console in a real browser: daphne serving FRLM web on a free port, next to the
session's process stack (same database, Redis and trace store), and headless Chromium
(Debian's) driven by Playwright."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pages.helpers import SHOTS, make_user, session_cookie

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="package")
def browser(web: str) -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread, and Django refuses ORM calls
    # where one runs; the tests' own ORM calls (users, runs) are plain sync code. Only this
    # process is told so, after the stack's processes have their environment.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def staff(venues, browser) -> object:
    """A staff user (like `make demo`'s demo user): sees every run."""
    return make_user("ops", staff=True)


@pytest.fixture
def page(browser, web: str, staff) -> Iterator[object]:
    """A signed-in page (the session cookie of `staff`), 1600 x 1000."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, base_url=web)
    context.add_cookies([session_cookie(staff, web)])
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}"))
    pg.js_errors = errors  # type: ignore[attr-defined]
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def anonymous(browser, web: str) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, base_url=web)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()
