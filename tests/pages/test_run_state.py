"""The run page tells one story (issue 19): its header, the five views and the waterfall
read one state, fed by the same events, live and in playback; its buttons follow the run.

The live runs here are traces written event by event by the test (as a conductor would,
through a real Emitter, recorder, Redis and socket), so each moment is held as long as the
checks need, however loaded the machine is."""

from __future__ import annotations

import time
from typing import Any

from frlm_web.redis_client import get_redis
from runs.models import Run
from tests.helpers import bare_run, wait_until
from tests.pages.helpers import shot, wait_for
from traces import store
from traces.emitter import Emitter

# One JavaScript turn reads the header and the waterfall together: no frame in between.
AGREE = """() => {
  const m = frlmMovie, h = document.getElementById('run-header');
  const settled = m.rows.filter(s => s.name === 'SubQuery.Submit' && s.i1 >= 0).length;
  const sent = m.rows.filter(s => s.name === 'SubQuery.Submit').length;
  const metric = (k) => document.querySelector(`[data-metric=${k}]`).textContent.trim();
  return {k: m.lastK, headerK: Number(h.dataset.k), settled, sent,
          subqueries: metric('subqueries'), wall: metric('wall'), cost: metric('cost'),
          tokens: metric('tokens'),
          status: document.getElementById('run-status').textContent.trim()};
}"""
# Every view says at which event index it was drawn last.
VIEWS_AT_K = (
    "[...document.querySelectorAll('[data-view]')]"
    ".every(d => Number(d.dataset.k) === frlmMovie.lastK)"
)


def wait(page: Any, expression: str, what: str = "") -> Any:
    """wait_for with room for a machine that other test suites load heavily."""
    return wait_for(page, expression, timeout=90, what=what)


def _watch_console(page: Any) -> list[str]:
    """Console errors and any NaN or Infinity the page logs, and requests that failed
    (the browser's own favicon.ico request apart)."""
    bad: list[str] = []

    def seen(msg: Any) -> None:
        text = msg.text
        if text.startswith("Failed to load resource"):
            return  # said with its URL by the response handler below
        if msg.type == "error" or "NaN" in text or "Infinity" in text:
            bad.append(text)

    def answered(response: Any) -> None:
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            bad.append(f"{response.status} {response.url}")

    page.on("console", seen)
    page.on("response", answered)
    return bad


def _live_run(owner: Any, question: str = "a fanout watched live") -> Run:
    return bare_run(
        question=question,
        owner=owner,
        status="running",
    )


def _ended_with_counts(page: Any, run: Run, events: int, status: str, counts: str) -> None:
    """Once the run's `events` are stored, its page at the end: `status`, and the run's own
    sub-query counts in the header."""
    wait_until(lambda: store.event_count(run.id) >= events, timeout=30, what="the run stored")
    page.goto(f"/runs/{run.id}", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector("#movie[data-ready='1']")
    wait(page, f"({AGREE})().status === '{status}'", what="the end")
    wait(
        page,
        f"document.querySelector('[data-metric=subqueries]').textContent.trim() === '{counts}'",
        what="the run's own counts in the header",
    )


def _agree(page: Any, settled: int, sent: int) -> dict[str, Any]:
    """Wait until the page holds `sent` sub-queries of which `settled` ended, then check
    that the header says what the waterfall shows, at the same event index."""
    wait(page, "frlmMovie.rows.some(s => s.name === 'Repl.Exec')", what="the first cell")
    wait(
        page,
        f"(() => {{ const s = frlmMovie.rows.filter(s => s.name === 'SubQuery.Submit');"
        f" return s.length === {sent} && s.filter(s => s.i1 >= 0).length === {settled}; }})()",
        what=f"{settled}/{sent} sub-queries on the waterfall",
    )
    wait(
        page,
        f"(s => s.subqueries === '{settled}/{sent}' && s.headerK === s.k)(({AGREE})())",
        what="the header to agree",
    )
    state = page.evaluate(AGREE)
    assert state["headerK"] == state["k"], state
    assert (state["settled"], state["sent"]) == (settled, sent), state
    assert state["status"] == "running", state
    assert "Infinity" not in state["wall"] and "NaN" not in state["wall"], state
    return state


def test_it_tells_one_story_while_the_run_is_live(page, web, staff):
    page.set_default_timeout(90_000)
    console = _watch_console(page)
    run = _live_run(staff)
    page.goto(f"/runs/{run.id}", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_function("frlmMovie.ws && frlmMovie.ws.readyState === 1", timeout=90_000)
    assert page.locator("#run-actions button.danger", has_text="Cancel run").is_visible()
    assert page.locator("#run-actions details.replay").count() == 0
    client = get_redis()
    conductor = Emitter(client, run.id)
    worker = Emitter(client, run.id, venue="local", worker_id="w-state-1")
    root = conductor.start("Run.Init")
    turn = conductor.start("Run.Decode", parent=root.span_id)
    turn.end(tokens_in=100, tokens_out=20, cost="0.001")
    cell = conductor.start("Repl.Exec", parent=root.span_id, cell=1)
    # The first events: the header leaves "queued" and counts from them.
    _agree(page, 0, 0)
    subs = []
    for i in range(12):
        subs.append(conductor.start("SubQuery.Submit", parent=cell.span_id, venue="local", sq=i))
    _agree(page, 0, 12)
    for sub in subs[:5]:
        ex = worker.start("SubQuery.Execute", parent=sub.span_id)
        ex.end(tokens_in=40, tokens_out=4, cost="0.0002")
        sub.end(tokens_in=40, tokens_out=4, cost="0.0002")  # what the run paid for it
    state = _agree(page, 5, 12)
    assert state["tokens"] == "300 / 40", state  # 100 + 5 x 40 in, 20 + 5 x 4 out
    assert state["cost"] == "$0.0020", state
    # The views draw the same tally: each says at which event index it was drawn, and the
    # Fill view's summary at that index is the header's.
    wait(
        page,
        VIEWS_AT_K,
        what="all five views drawn at the waterfall's event index",
    )
    fill = page.locator("#view-fill").inner_text()
    assert "5/12 settled" in fill, fill
    flow = page.locator("#view-flow text").all_text_contents()
    assert "w-state-1" in flow and "local" in flow, flow
    # Turn 1 runs: the turn panel says so rather than "has not answered yet".
    wait(page, "!document.getElementById('turns').textContent.includes('has not answered')")
    shot(page, "19-live-5-of-12")
    for sub in subs[5:]:
        ex = worker.start("SubQuery.Execute", parent=sub.span_id)
        ex.end("error", error="boom", tokens_in=40, tokens_out=0, cost="0")
        sub.end("error")
    _agree(page, 12, 12)
    cell.end()
    # The run ends as a conductor ends it: the row first, then Run.Done.
    Run.objects.filter(id=run.id).update(status="succeeded", answer="42", wall_ms=1234.0)
    conductor.instant(
        "Run.Done",
        parent=root.span_id,
        payload="42",
        answer="42",
        run_status="succeeded",
        wall_ms=1234.0,
        tokens_in=380,
        tokens_out=40,
        cost="0.002",
    )
    root.end()
    wait(page, "document.getElementById('run-header').dataset.done === '1'", what="the end")
    wait(page, "document.getElementById('run-status').textContent.trim() === 'succeeded'")
    # Cancel goes and Replay / what-if comes, without a reload.
    assert page.locator("#run-actions button.danger").count() == 0
    assert page.locator("#run-actions details.replay").is_visible()
    wait(page, "document.querySelector('[data-metric=wall]').textContent.trim() === '1.23 s'")
    nan_paths = page.locator("path[d*='NaN'], path[d*='Infinity']").count()
    assert nan_paths == 0
    assert not console, console


def test_it_plays_a_finished_run_back_with_header_and_views_at_the_clock(page, web, staff):
    page.set_default_timeout(90_000)
    console = _watch_console(page)
    run = _live_run(staff, question="a finished fanout")
    client = get_redis()
    conductor = Emitter(client, run.id)
    worker = Emitter(client, run.id, venue="edge", worker_id="w-state-2")
    root = conductor.start("Run.Init")
    for i in range(8):
        sub = conductor.start("SubQuery.Submit", parent=root.span_id, venue="edge", sq=i)
        worker.start("SubQuery.Execute", parent=sub.span_id).end(tokens_in=10, tokens_out=1)
        sub.end(tokens_in=10, tokens_out=1)
    Run.objects.filter(id=run.id).update(status="succeeded", answer="ok", subqueries=8)
    conductor.instant("Run.Done", parent=root.span_id, run_status="succeeded", answer="ok")
    root.end()
    wait_until(lambda: store.event_count(run.id) >= 35, timeout=30, what="the run stored")
    page.goto(f"/runs/{run.id}", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector("#movie[data-ready='1']")
    wait(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    assert page.locator("#run-actions button.danger").count() == 0
    # The clock at the start: the header and the views at the waterfall's event index.
    page.keyboard.press("Home")
    wait(
        page,
        f"(s => s.k < 8 && s.headerK === s.k)(({AGREE})())",
        what="the header at the start",
    )
    state = page.evaluate(AGREE)
    assert state["subqueries"] == f"{state['settled']}/{state['sent']}", state
    assert state["status"] == "running", state
    wait(
        page,
        VIEWS_AT_K,
        what="the views at the start",
    )
    page.keyboard.press("End")
    wait(page, f"({AGREE})().status === 'succeeded'", what="the end")
    assert page.evaluate(AGREE)["subqueries"] == "8"
    # The flow view's tally, counted again from the start after the seek back.
    flows = page.evaluate(
        "Object.fromEntries([...frlmMovie.A.flows]"
        ".map(([k, n]) => [k.replace('\\u0000', ' > '), n]))"
    )
    assert flows == {
        "conductor > venue:edge": 8,
        "venue:edge > worker:w-state-2": 8,
        "worker:w-state-2 > out:results back": 8,
    }
    assert page.locator("path[d*='NaN']").count() == 0
    assert not console, console


def test_a_finished_runs_header_counts_what_the_quorum_cut_apart_from_failures(page, web, staff):
    """The page said "17 (8 failed)" where frlm_run said "0 failed, 8 cut off at the
    quorum": the movie counted cancelled sub-queries as failed (a review)."""
    run = _live_run(staff, question="a quorum cut")
    client = get_redis()
    conductor = Emitter(client, run.id)
    worker = Emitter(client, run.id, venue="edge", worker_id="w-state-3")
    root = conductor.start("Run.Init")
    for i in range(6):
        sub = conductor.start("SubQuery.Submit", parent=root.span_id, venue="edge", sq=i)
        if i < 3:
            worker.start("SubQuery.Execute", parent=sub.span_id).end(tokens_in=10, tokens_out=1)
            sub.end(tokens_in=10, tokens_out=1)
        else:
            sub.end("timeout" if i == 3 else "cancelled")
    Run.objects.filter(id=run.id).update(
        status="succeeded", answer="ok", subqueries=6, subqueries_failed=1, subqueries_cut=2
    )
    conductor.instant(
        "Run.Done",
        parent=root.span_id,
        run_status="succeeded",
        answer="ok",
        subqueries=6,
        subqueries_failed=1,
        subqueries_cut=2,
    )
    root.end()
    _ended_with_counts(page, run, 20, "succeeded", "6 (1 failed, 2 cut off at the quorum)")


def test_a_batch_counts_its_cuts_apart_and_the_views_draw_no_conductor_venue(page, web, staff):
    """A browser review: a batch of the waterfall said "23 done · 11 failed" where the
    header said "11 cut off at the quorum"; sub-queries never sent (a budget stop, a
    cancel), stamped venue "conductor", were drawn as a venue holding them, in Fill, Flow
    and Topology; and their 0 ms made the batch's p50 0."""
    run = _live_run(staff, question="cuts and unsent")
    client = get_redis()
    conductor = Emitter(client, run.id)  # its events say venue "conductor"
    worker = Emitter(client, run.id, venue="edge", worker_id="w-state-4")
    root = conductor.start("Run.Init")
    for i in range(8):
        if i < 6:
            sub = conductor.start("SubQuery.Submit", parent=root.span_id, venue="edge", sq=i)
            run_ = worker.start("SubQuery.Execute", parent=sub.span_id)
            time.sleep(0.02)
        else:  # never sent: the run was cancelled first
            sub = conductor.start("SubQuery.Submit", parent=root.span_id, sq=i)
        if i < 3:
            run_.end(tokens_in=10, tokens_out=1)
            sub.end(tokens_in=10, tokens_out=1)
        elif i == 3:
            run_.end("error")
            sub.end("error")
        elif i < 6:
            run_.end("cancelled")
            sub.end("cancelled", cut="quorum")
        else:
            sub.end("cancelled", cut="cancel")
    conductor.instant(
        "Run.Done",
        parent=root.span_id,
        run_status="cancelled",
        subqueries=8,
        subqueries_failed=1,
        subqueries_cut=2,
        subqueries_cancelled=2,
    )
    root.end("cancelled")
    Run.objects.filter(id=run.id).update(
        status="cancelled",
        subqueries=8,
        subqueries_failed=1,
        subqueries_cut=2,
        subqueries_cancelled=2,
    )
    counts = "8 (1 failed, 2 cut off at the quorum, 2 cancelled with the run)"
    _ended_with_counts(page, run, 30, "cancelled", counts)
    summary = page.evaluate(
        "() => FRLM.WaterfallRows.batchSummary({members: frlmMovie.rows.filter("
        "s => s.name === 'SubQuery.Submit')}, frlmMovie.trace.events.length)"
    )
    assert (summary["done"], summary["failed"], summary["cut"], summary["open"]) == (3, 1, 4, 0)
    assert summary["p50"] >= 10, summary  # the six sent took 20 ms or more; unsent, none
    venues = page.evaluate(
        "() => ({views: [...frlmMovie.A.venues.keys()], filter: [...frlmMovie.trace.venues]})"
    )
    # The waterfall's filter keeps "conductor": it shows the conductor's own spans.
    assert venues == {"views": ["edge"], "filter": ["conductor", "edge"]}, venues


def test_it_proposes_runs_of_the_same_question_first_to_compare_with(page, web, staff):
    mine = _live_run(staff, question="how many cats")
    Run.objects.filter(id=mine.id).update(status="succeeded")
    twin = _live_run(staff, question="how many cats")
    Run.objects.filter(id=twin.id).update(status="succeeded")
    for n in range(3):  # newer and unrelated
        bare_run(
            question=f"imported {n}",
            context_source="imported",
            owner=staff,
            status="succeeded",
        )
    page.goto(f"/runs/{mine.id}", wait_until="domcontentloaded", timeout=90_000)
    first = page.locator("#compare-b option").first
    assert first.get_attribute("value") == twin.id
    assert "same question" in first.inner_text()


def test_a_live_page_reads_the_work_that_ends_after_the_run(page, web, staff):
    """A live page stopped reading half a second after Run.Done, so work that ended later
    (a cancelled run's jobs its workers finished, a hedge's loser) stayed open on it, a
    worker shown busy for good, where a reload showed every worker idle (a review)."""
    import time

    run = _live_run(staff, question="cancelled while a worker still ran")
    page.goto(f"/runs/{run.id}", wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector("#movie[data-ready='1']")
    client = get_redis()
    conductor = Emitter(client, run.id)
    worker = Emitter(client, run.id, venue="edge", worker_id="w-late-1")
    root = conductor.start("Run.Init")
    sub = conductor.start("SubQuery.Submit", parent=root.span_id, venue="edge", sq=0)
    late = worker.start("SubQuery.Execute", parent=sub.span_id)
    wait(page, f"frlmMovie.trace.spans.has('{late.span_id}')", what="the job running")
    sub.end("cancelled")
    Run.objects.filter(id=run.id).update(status="cancelled", wall_ms=50.0)
    conductor.instant("Run.Done", parent=root.span_id, run_status="cancelled", wall_ms=50.0)
    root.end("cancelled")
    wait(page, "document.getElementById('movie').dataset.complete === '1'", what="the end")
    time.sleep(2.0)  # long past the socket's close
    late.end("cancelled")
    wait(page, "frlmMovie.trace.open === 0", what="the late job's end read")
    assert page.evaluate(f"frlmMovie.trace.spans.get('{late.span_id}').status") == "cancelled"
