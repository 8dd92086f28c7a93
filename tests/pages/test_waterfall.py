"""The run page's waterfall and span panel in a real browser at 1440x900: a click shows the
span beside the waterfall, in view, as tables; search and filters narrow a 2,000-span
trace; a batch folds into one row that opens; workers go by their registered names;
whatever a worker or a model wrote stays text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from frlm_web.redis_client import get_redis
from tests.helpers import bare_run, wait_until
from tests.pages.helpers import session_cookie, shot, wait_for
from traces import store
from traces.emitter import Emitter
from workers.models import Venue, Worker

HOSTILE = "<img src=x onerror=window.__pwned=1>"
ROW_H = 16  # the waterfall's row height (static/frlm/waterfall.js)


@pytest.fixture
def page(browser, web: str, staff) -> Iterator[Any]:
    """A signed-in page at 1440x900, a laptop's screen."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=web)
    context.add_cookies([session_cookie(staff, web)])
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    # The machine the suite shares may be loaded: a page's first load (Plotly is 3.5 MB
    # through daphne) is given longer than a step on the page.
    pg.set_default_navigation_timeout(90_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _workers() -> list[Worker]:
    venue = Venue.objects.get(name="edge")
    names = ["edge-edge-1", "edge-edge-2", HOSTILE]
    workers = [Worker.objects.create(name=name, venue=venue, public_key="k" * 44) for name in names]
    Worker.objects.filter(id=workers[1].id).update(status=Worker.Status.LOST)
    return workers


def _fanout_run(staff, workers: list[Worker], *, subqueries: int, status: str = "succeeded"):
    """A stored run of one batch of `subqueries` sub-queries (a Submit and an Execute span
    each) spread over `workers`: every tenth failed, every fiftieth slow, the first with a
    routing decision, verdicts and a receipt, and a reply with markup in it."""
    run = bare_run(
        question="a big fanout",
        owner=staff,
        status=status,
    )
    client = get_redis()
    conductor = Emitter(client, run.id)
    routing = {
        "scores": {w.id: {"reputation": 0.9, "load": 0.1, "price": 0.002} for w in workers},
        "why": "best score " + "x" * 300,
        "candidates": [
            {"worker": w.id, "venue": "edge", "detail": {"a": {"b": 1}}} for w in workers
        ],
    }
    with conductor.batch():
        root = conductor.start("Run.Init", attrs={"question": "a big fanout"})
        conductor.start("Run.Decode", parent=root.span_id, turn=1).end(ms=5.0)
        cell = conductor.start("Repl.Exec", parent=root.span_id, turn=1, cell=1)
    for i in range(subqueries):
        worker = workers[i % len(workers)]
        on_worker = Emitter(client, run.id, venue="edge", worker_id=worker.id)
        with conductor.batch():
            attrs: dict[str, Any] = {"sq": i, "batch": 1, "route": "score"}
            if i == 0:
                attrs["routing"] = routing
            sq = conductor.start(
                "SubQuery.Submit",
                parent=cell.span_id,
                payload=f"prompt {i}",
                venue="edge",
                worker_id=worker.id,
                **attrs,
            )
            ex = on_worker.start("SubQuery.Execute", parent=sq.span_id, payload=f"prompt {i}")
            failed = i % 10 == 9
            ms = 900.0 if i % 50 == 49 else 40.0 + i % 7
            reply = f"reply {i} {HOSTILE}" if i == 0 else f"reply {i}"
            ex.end(
                "error" if failed else "ok",
                payload=None if failed else reply,
                ms=ms,
                tokens_in=100,
                tokens_out=5,
                cost=0.0001,
            )
            if i == 0:
                conductor.instant(
                    "Verify.Objective",
                    parent=sq.span_id,
                    links=[sq.span_id],
                    worker_id=worker.id,
                    check="regex",
                    detail={"pattern": "^reply", "matched": True},
                )
                conductor.instant(
                    "Receipt.Emit",
                    parent=sq.span_id,
                    span=sq.span_id,
                    worker=worker.id,
                    verdict="accepted",
                    paid="0.0001",
                    hash="ab" * 32,
                )
            # What the run paid for the reply, as the conductor ends a Submit: nothing for
            # a failed one.
            paid = {} if failed else {"tokens_in": 100, "tokens_out": 5, "cost": 0.0001}
            sq.end("error" if failed else "ok", ms=ms + 2, venue="edge", **paid)
    with conductor.batch():
        cell.end(ms=50.0)
        if status == "succeeded":
            conductor.instant("Run.Done", parent=root.span_id, answer="42")
            root.end()
    events = 4 * subqueries + 2 + (7 if status == "succeeded" else 5)
    wait_until(
        lambda: store.event_count(run.id) >= events,
        timeout=60,
        what="the run stored",
    )
    return run, root


def _open(page, run) -> None:
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")


def _click_row(page, predicate: str) -> None:
    """Click the waterfall row of the first shown span matching a JS predicate on `s`."""
    row = page.evaluate(f"frlmMovie.wf.rows.findIndex(s => {predicate})")
    assert row >= 0, predicate
    page.evaluate(f"frlmMovie.wf.scroll.scrollTop = {max(0, row - 5) * ROW_H}")
    page.wait_for_timeout(100)
    top = page.evaluate("frlmMovie.wf.scroll.scrollTop")
    box = page.locator("#waterfall canvas.wf-canvas").bounding_box()
    page.mouse.click(box["x"] + 150, box["y"] + row * ROW_H - top + ROW_H / 2)


def test_it_shows_a_clicked_span_beside_the_waterfall_in_view(page, web, staff, venues):
    workers = _workers()
    run, _ = _fanout_run(staff, workers, subqueries=12)
    _open(page, run)
    assert page.locator("#span-detail").is_hidden()  # the views show until a click
    page.uncheck("#waterfall .wf-group input")
    _click_row(page, "s.name === 'SubQuery.Submit' && s.attrs.sq === 0")
    page.wait_for_selector("#detail-body table.kv.overview")
    panel = page.locator("#span-detail").bounding_box()
    waterfall = page.locator("#waterfall").bounding_box()
    # Beside the waterfall, level with it, inside the 1440x900 window: no scrolling.
    assert panel["x"] >= waterfall["x"] + waterfall["width"] - 1
    assert 0 <= panel["y"] < 900 - 200 and panel["x"] + panel["width"] <= 1440
    assert abs(panel["y"] - page.locator(".wf-panel").bounding_box()["y"]) < 2
    # Readable: tables of figures, the worker by name with its id on hover.
    overview = page.inner_text("#detail-body table.overview")
    # A Submit span's tokens and cost are its attempts' (its Execute spans').
    for text in ("status\tok", "duration", "tokens in\t100", "cost\t$0.000100", "venue\tedge"):
        assert text in overview, (text, overview)
    assert "worker\tedge-edge-1" in overview
    worker_link = page.locator("#detail-body table.overview a[href^='/workers/']")
    assert worker_link.get_attribute("title").startswith(workers[0].id)
    # The five parts, each a link; the routing decision as a table, deep JSON wrapped
    # inside the panel, never wider than it.
    for part in ("prompt", "reply", "routing", "verdicts", "receipt"):
        assert page.locator(f"#detail-body [data-part={part}]").count() == 1, part
    assert "best score" in page.inner_text("#detail-body [data-part=routing] table.kv")
    assert page.locator("#detail-body [data-part=routing] pre.json").count() >= 1
    assert "verdict" in page.inner_text("#detail-body [data-part=receipt]")
    overflow = page.evaluate(
        """() => { const b = document.getElementById('detail-body');
                   return [...b.querySelectorAll('*')].filter(e => {
                       const r = e.getBoundingClientRect(), p = b.getBoundingClientRect();
                       return r.width && r.right > p.right + 1; }).map(e => e.className); }"""
    )
    assert overflow == [], overflow
    page.click("#detail-body a[data-goto=receipt]")
    assert "part=receipt" in page.url
    shot(page, "20-span-panel-1440")
    # The address opens the page on that span and part.
    address = page.url
    page.goto("about:blank")
    page.goto(address)
    page.wait_for_selector("#detail-body [data-part=receipt]")
    page.click("[data-act=close-span]")
    assert page.locator("#span-detail").is_hidden()
    assert page.locator("#view-pulse").is_visible()


def test_it_narrows_a_2000_span_waterfall_by_search_and_filters(page, web, staff, venues):
    workers = _workers()
    run, _ = _fanout_run(staff, workers, subqueries=1000)
    _open(page, run)
    total = page.evaluate("frlmMovie.rows.length")
    assert total == 2003
    page.uncheck("#waterfall .wf-group input")
    assert page.evaluate("frlmMovie.wf.rows.length") == total

    def shown() -> int:
        page.wait_for_timeout(250)  # the search waits for typing to pause
        return page.evaluate("frlmMovie.wf.rows.length")

    # Search by a worker's registered name: its spans only (a third of the sub-queries).
    page.fill("#waterfall .wf-search", "edge-edge-2")
    assert shown() == 2 * 333
    assert "666 of 2,003 spans match" in page.inner_text("#waterfall .wf-count")
    page.fill("#waterfall .wf-search", "")
    assert shown() == total
    page.select_option("#waterfall .wf-status", "error")
    assert shown() == 200  # every tenth sub-query: its Submit and its Execute
    page.select_option("#waterfall .wf-status", "")
    page.check("#waterfall .wf-errors input")
    assert shown() == 200
    page.uncheck("#waterfall .wf-errors input")
    page.check("#waterfall .wf-slow input")
    assert shown() == 40  # the twenty 900 ms sub-queries, Submit and Execute
    shot(page, "21-waterfall-filtered-slow")
    page.uncheck("#waterfall .wf-slow input")
    # The worker filter lists workers by name, the departed one marked.
    options = page.locator("#waterfall .wf-worker option").all_inner_texts()
    assert "edge-edge-1" in options and "edge-edge-2 (departed)" in options
    assert not any(w.id in options for w in workers)
    # The rows are labelled with the names too (the canvas draws _who's text).
    labels = page.evaluate("[...new Set(frlmMovie.wf.rows.map(s => frlmMovie.wf._who(s)))]")
    assert set(labels) == {"", "edge-edge-1", "edge-edge-2", HOSTILE}
    page.select_option("#waterfall .wf-worker", workers[0].id)
    assert shown() == 2 * 334
    page.select_option("#waterfall .wf-venue", "conductor")
    assert shown() == 0
    page.select_option("#waterfall .wf-worker", "")
    assert shown() == 3  # the root, its turn and its cell
    page.select_option("#waterfall .wf-venue", "edge")
    assert shown() == 2000
    shot(page, "22-waterfall-filtered-venue")
    # The page writes counts and orders names without the browser's ICU (its first use
    # cost a cold load 25-45 ms): the same text as the browser's own English, and an order
    # that folds case.
    differ = page.evaluate(
        """() => [0, 7, 999, 1000, 2003, 12345, -1234, 1234567, 1234.5, 98765432.125, NaN]
            .filter(n => FRLM.fmtCount(n) !== n.toLocaleString('en-US'))"""
    )
    assert differ == []
    names = page.evaluate("['edge-b', 'Edge-a', 'local', 'datacenter'].sort(FRLM.byText)")
    assert names == ["datacenter", "Edge-a", "edge-b", "local"]


def test_it_folds_a_batch_into_one_row_that_opens(page, web, staff, venues):
    workers = _workers()
    run, _ = _fanout_run(staff, workers, subqueries=30)
    _open(page, run)
    # Root, decode, cell, and one row for the batch's thirty sub-queries.
    wait_for(page, "frlmMovie.wf.rows.length === 4")
    batch = page.evaluate("(b => ({batch: b.batch, n: b.members.length}))(frlmMovie.wf.rows[3])")
    assert batch == {"batch": True, "n": 30}
    _click_row(page, "s.batch")
    wait_for(page, "frlmMovie.wf.rows.length === 4 + 60")
    facts = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('#detail-body table.kv tr')]
              .map(tr => [tr.cells[0].textContent, tr.cells[1].textContent]))"""
    )
    assert facts["sub-queries"] == "30" and facts["done"] == "27" and facts["failed"] == "3"
    assert facts["p50"].endswith("ms") and facts["p95"].endswith("ms")
    assert facts["cost"] == "$0.002700"  # what the run paid: the 27 that answered
    assert "edge-edge-1 × 10" in facts["workers"]
    assert "edge-edge-2 (departed) × 10" in facts["workers"]
    _click_row(page, "s.batch")
    wait_for(page, "frlmMovie.wf.rows.length === 4")


def test_it_keeps_the_root_and_current_turn_pinned_while_live(page, web, staff, venues):
    workers = _workers()
    run, root = _fanout_run(staff, workers, subqueries=200, status="running")
    _open(page, run)
    page.uncheck("#waterfall .wf-group input")
    scroller = "frlmMovie.wf.scroll"
    wait_for(page, f"{scroller}.scrollTop > 0", what="the waterfall following the newest rows")
    wait_for(page, "(frlmMovie.wf._bandRows || []).length === 3", what="the pinned rows")
    pinned = page.evaluate("frlmMovie.wf._bandRows.map(s => s.name)")
    assert pinned == ["Run.Init", "Run.Decode", "Repl.Exec"]
    # A click on the band opens the pinned span.
    box = page.locator("#waterfall canvas.wf-canvas").bounding_box()
    page.mouse.click(box["x"] + 150, box["y"] + ROW_H / 2)
    page.wait_for_selector("#detail-body .span-name")
    assert page.inner_text("#detail-body .span-name") == "Run.Init"
    root.end()


def test_it_shows_what_workers_and_models_wrote_as_text(page, web, staff, venues):
    workers = _workers()
    run, _ = _fanout_run(staff, [workers[2]], subqueries=2)
    _open(page, run)
    page.uncheck("#waterfall .wf-group input")
    _click_row(page, "s.name === 'SubQuery.Execute'")
    page.wait_for_selector("#detail-body [data-part=reply]")
    assert HOSTILE in page.inner_text("#detail-body [data-part=reply]")
    assert HOSTILE in page.inner_text("#detail-body table.overview")
    assert HOSTILE in page.locator("#waterfall .wf-worker option").all_inner_texts()
    assert page.locator("#detail-body img, #waterfall img").count() == 0
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None


def test_it_names_workers_on_the_venues_history_marking_departed_ones(page, web, staff, venues):
    workers = _workers()
    _fanout_run(staff, workers[:2], subqueries=4)
    page.goto("/venues/history")
    data = page.evaluate("JSON.parse(document.body.innerText)")
    assert data["names"][workers[1].id] == {
        "name": "edge-edge-2",
        "venue": "edge",
        "departed": True,
    }
    page.goto("/venues")
    page.wait_for_selector("#history[data-ready='1']")
    legend = page.locator("#history .legendtext").evaluate_all("es => es.map(e => e.textContent)")
    assert "edge-edge-1 p50" in legend and "edge-edge-2 (departed) p50" in legend
    assert not any(w.id in text for w in workers for text in legend)


def test_it_names_workers_in_flow_heat_and_topology(page, web, staff, venues):
    workers = _workers()
    run, _ = _fanout_run(staff, workers[:2], subqueries=4)
    _open(page, run)
    wait_for(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    # Flow shortens a label to its node's room and gives the whole name on hover (<title>).
    for view, tag in (("flow", "title"), ("topology", "text"), ("heat", "text")):
        page.wait_for_selector(f"#view-{view} {tag}", state="attached")
        texts = page.locator(f"#view-{view} {tag}").evaluate_all("es => es.map(e => e.textContent)")
        assert any("edge-edge-1" in t for t in texts), (view, texts)
        assert any("edge-edge-2 (departed)" in t for t in texts), (view, texts)
        if tag == "text":  # a hover names the id beside the name
            assert not any(w.id in t for w in workers for t in texts), (view, texts)
