"""The dashboard: search and status filter over the runs, questions shown in full on hover
and not cut to a few characters, counts with thousands separators (issue 19)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings

from frlm_web import vendor
from runs.models import Run
from tests.helpers import bare_run
from tests.pages.helpers import shot, wait_for

LONG = (
    "Across every ledger in the archive, which supplier was paid twice for the same "
    "invoice number, and by how much did the duplicates exceed the original amounts?"
)


def _run(owner, question: str, status: str, **fields) -> Run:
    return bare_run(
        question=question,
        owner=owner,
        status=status,
        **fields,
    )


def _shown(page) -> list[str]:
    return page.locator("#runs tbody tr[data-run]").evaluate_all("rs => rs.map(r => r.dataset.run)")


def test_it_finds_runs_by_text_and_status(page, web, staff):
    ledger = _run(staff, LONG, "succeeded", tokens_in=1_234_567, tokens_out=8_901)
    cats = _run(staff, "how many cats are in the census", "failed")
    live = _run(staff, "how many dogs are in the census", "running")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector(f"#runs tr[data-run='{ledger.id}']")
    assert {ledger.id, cats.id, live.id} <= set(_shown(page))
    # The question is shown over its column's width, and whole on hover.
    cell = page.locator(f"#runs tr[data-run='{ledger.id}'] td.question")
    assert cell.get_attribute("title") == LONG
    assert cell.bounding_box()["width"] >= 300
    assert len(cell.inner_text()) > 60
    # 1,234,567 + 8,901 tokens, written with separators.
    assert "1,243,468" in page.locator(".totals").inner_text()
    page.fill("#run-q", "census")
    wait_for(page, f"!document.querySelector(\"#runs tr[data-run='{ledger.id}']\")")
    assert set(_shown(page)) == {cats.id, live.id}
    page.select_option("#run-status-filter", "live")
    wait_for(page, f"!document.querySelector(\"#runs tr[data-run='{cats.id}']\")")
    assert _shown(page) == [live.id]
    shot(page, "19-dashboard-filtered")
    # The table's polling keeps the filter: after a refresh the same single row.
    page.wait_for_timeout(2500)
    assert _shown(page) == [live.id]
    # Another period keeps the search and the status, and so does a reload: the links
    # were drawn once, from what the page first had (a review).
    page.click("nav.seg a:has-text('7d')")
    page.wait_for_url("**/?*period=7d*")
    assert page.input_value("#run-q") == "census"
    assert page.input_value("#run-status-filter") == "live"
    page.wait_for_selector(f"#runs tr[data-run='{live.id}']")
    assert _shown(page) == [live.id]
    page.fill("#run-q", "no such question anywhere")
    wait_for(page, "document.querySelector('#runs td.empty') !== null")
    assert "matches" in page.locator("#runs td.empty").inner_text()


def _trace_types_drawn() -> set[str]:
    """The Plotly trace types the pages' scripts draw: a `type` on a line that also gives
    the trace its `x` (a shape's or an axis's `type` gives none)."""
    types = set()
    for script in (Path(settings.BASE_DIR) / "static" / "frlm").glob("*.js"):
        text = script.read_text()
        named = dict(re.findall(r"const (\w+) = \"(\w+)\";", text))
        for line in text.splitlines():
            if re.search(r"\bx: ", line):
                for quoted, name in re.findall(r"\btype: (?:\"(\w+)\"|([A-Z]+)\b)", line):
                    types.add(quoted or named[name])
    return types


def test_the_plotly_bundle_holds_every_trace_type_the_pages_draw(page, web):
    drawn = _trace_types_drawn()
    assert drawn == {"scatter", "bar", "heatmap"}, drawn  # a new one: static/vendor/README.md
    page.goto("/venues")
    page.wait_for_function("window.Plotly && Plotly.PlotSchema")
    bundled = set(page.evaluate("Object.keys(Plotly.PlotSchema.get().traces)"))
    assert drawn <= bundled
    assert bundled == {"scatter", "bar", "heatmap"}  # and no more: it is run on every load


def test_it_serves_plotly_compressed_and_cached_for_a_year(web):
    page = urllib.request.urlopen(f"{web}/accounts/login/", timeout=60).read().decode()
    assert "plotly" not in page  # only the pages that chart load it
    url = f"{web}/vendor/{vendor.PLOTLY_FILE}"
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip, deflate, br"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
        headers = response.headers
    assert headers["Content-Encoding"] == "gzip"
    # FRLM's bundle: 1.18 MB plain (static/vendor/README.md); Plotly's cartesian bundle
    # was 0.50 MB gzipped, and the full one 4.8 MB plain.
    assert len(body) < 450_000
    assert "max-age=31536000" in headers["Cache-Control"]
    assert "immutable" in headers["Cache-Control"]
    assert "Accept-Encoding" in headers["Vary"]
    again = urllib.request.Request(url, headers={"If-None-Match": headers["ETag"]})
    try:
        urllib.request.urlopen(again, timeout=60)
        raise AssertionError("a cached copy was sent again")
    except urllib.error.HTTPError as exc:
        assert exc.code == 304
