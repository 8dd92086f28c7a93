"""The run page, the execution movie: live while the run goes (and after reconnects),
played back with the scrubber afterwards, span details, and model text shown as text."""

from __future__ import annotations

import time

from django.test import Client

from frlm_web.redis_client import get_redis
from tests.helpers import bare_run, finish, launch, scripted, trace, wait_until
from tests.pages.helpers import SLOW_WORKERS, make_user, plot_updates, shot, slow_question, wait_for
from traces import store
from traces.emitter import Emitter


def test_it_shows_a_live_run_as_it_happens(page, web):
    run = launch(question=slow_question(ticks=10, tail_s=4.0), worker_sim=SLOW_WORKERS)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    assert page.locator("#live-badge").is_visible()
    # An open span is drawn while it is open: the first REPL cell sleeps for four seconds.
    wait_for(
        page,
        "frlmMovie.rows.some(s => s.name === 'Repl.Exec' && s.i1 < 0 && s.attrs.cell === 1)",
        what="the first cell, open",
    )
    # The header was drawn before the sandbox started: it says which it got, while running.
    wait_for(
        page,
        "!['', 'not started yet'].includes("
        "document.getElementById('run-isolation').textContent.trim())",
        what="the sandbox in the header",
    )
    first = plot_updates(page)
    wait_for(page, "frlmMovie.stats.liveBatches > 0", what="a live batch")
    wait_for(
        page,
        "frlmMovie.rows.filter(s => s.name === 'SubQuery.Execute').length >= 10",
        what="sub-queries on the waterfall",
    )
    for view, count in first.items():
        wait_for(
            page,
            f"Number(document.getElementById('view-{view}').dataset.updates) > {count}",
            what=f"the {view} view to redraw",
        )
    run.refresh_from_db()
    assert not run.done, "the run ended before the page could watch it"
    shot(page, "05-run-live")
    finish(run)
    page.wait_for_function(
        "document.getElementById('run-answer').textContent.includes('the plan holds')"
    )
    wait_for(page, "document.getElementById('run-header').dataset.done === '1'")
    assert page.locator("#live-badge").is_hidden()
    assert "succeeded" in page.inner_text("#run-status")


def test_cancel_run_stops_a_run_whose_cell_is_asleep_within_seconds(page, web):
    """The run page's "Cancel run", clicked while a cell sleeps: the run ends cancelled and
    the page says so within seconds, not at the cell's wall clock."""
    run = launch(question=scripted("import time\ntime.sleep(60)", "FINAL('never')"))
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(
        page,
        "frlmMovie.rows.some(s => s.name === 'Repl.Exec' && s.i1 < 0)",
        what="the cell, open",
    )
    clicked = time.monotonic()
    page.locator("#run-actions button.danger", has_text="Cancel run").click()
    page.wait_for_load_state("domcontentloaded")
    wait_for(
        page,
        "document.getElementById('run-header').dataset.done === '1'",
        timeout=15,
        what="the page to show the run ended",
    )
    took = time.monotonic() - clicked
    assert "cancelled" in page.inner_text("#run-status"), page.inner_text("#run-status")
    assert took < 8, f"the page showed the run ended {took:.1f} s after the click"
    run.refresh_from_db()
    assert run.status == "cancelled", (run.status, run.error)


def test_it_catches_up_after_reconnects_with_no_gap_and_no_duplicate(page, web):
    run = launch(question=slow_question(ticks=15), worker_sim=SLOW_WORKERS)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    drops = 0
    while drops < 3:
        # The current socket (the first, or the one after the last drop) has caught up.
        wait_for(page, f"frlmMovie.finished || frlmMovie.stats.catchUps > {drops}")
        if page.evaluate("frlmMovie.finished"):
            break
        page.evaluate("frlmMovie.ws.close()")  # the network drops: the page reconnects
        drops += 1
    assert drops >= 2, "the run ended before the page could drop its socket twice"
    finish(run)
    trace(run)
    # The page has the whole run once its root span has ended (the run's last event).
    page.wait_for_selector("#movie[data-complete='1']")
    stored = [e["seq"] for e in store.read_events(run.id)]
    seen = page.evaluate("frlmMovie.trace.events.map(e => e[0])")
    assert seen == stored  # every stored event once, in order
    stats = page.evaluate("frlmMovie.stats")
    assert stats["reconnects"] >= drops - 1 and stats["catchUps"] >= drops
    assert stats["liveEvents"] > 0
    assert page.evaluate("frlmMovie.trace.duplicates") == 0  # the server sent each seq once


def test_it_plays_a_finished_run_back_with_the_scrubber(page, web):
    run = finish(launch(task="sniah", tokens=150_000, seed=9))
    assert run.status == "succeeded", run.error
    total = len({e["span_id"] for e in trace(run) if e["phase"] == "start"})
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, f"frlmMovie.rows.length === {total}")
    page.click("[data-act=start]")
    wait_for(page, "frlmMovie.rows.length <= 1")
    assert page.inner_text("#clock").startswith("0.000 s")
    # Drag to the first moment a second span has started: some spans shown, not all, and
    # the rest of the run still ahead to play (from the middle of the events, a run this
    # short could play to its end, and stop there, before the test could press pause). The
    # views redraw at that moment.
    drawn = plot_updates(page)
    page.evaluate(
        """() => { const s = document.getElementById('scrubber'), T = frlmMovie.trace;
                   for (const e of T.events) {
                     s.value = Math.round(e[FRLM.F.T] - T.t0);
                     s.dispatchEvent(new Event('input'));
                     if (frlmMovie.rows.length > 1) break;
                   }
                   s.dispatchEvent(new Event('change')); }"""
    )
    half = page.evaluate("frlmMovie.rows.length")
    assert 1 < half < total
    for view, count in drawn.items():
        wait_for(page, f"Number(document.getElementById('view-{view}').dataset.updates) > {count}")
    # Play (slowly: the whole run lasts about a second): the clock moves; pause: it stops.
    page.select_option("[data-act=speed]", "0.25")
    page.click("[data-act=play]")
    wait_for(page, f"frlmMovie.rows.length > {half}", what="playback to advance")
    page.click("[data-act=play]")
    assert page.evaluate("frlmMovie.playing") is False, "the pause did not stop playback"
    paused = page.inner_text("#clock")
    page.wait_for_timeout(300)
    assert page.inner_text("#clock") == paused
    # Jump between root turns, then to the end.
    page.click("[data-act=start]")
    page.click("[data-act=next]")
    assert page.evaluate("frlmMovie.cursor") == page.evaluate("frlmMovie.trace.turnStarts[0]")
    page.click("[data-act=end]")
    wait_for(page, f"frlmMovie.rows.length === {total}")
    # A click on a span opens its detail with the texts from the blob store (batches
    # unfolded: each sub-query on its own row).
    page.uncheck("#waterfall .wf-group input")
    submit_row = page.evaluate("frlmMovie.wf.rows.findIndex(s => s.name === 'SubQuery.Submit')")
    box = page.locator("#waterfall canvas.wf-canvas").bounding_box()
    page.mouse.click(box["x"] + 120, box["y"] + submit_row * 16 + 8)
    page.wait_for_selector("#detail-body .payload-text.prompt")
    assert "special magic number" in page.inner_text("#detail-body .payload-text.prompt")
    assert page.locator("#detail-body .payload-text.reply").count() == 1
    # Jump to an event: the movie's clock goes to the span's start, then to its end.
    span = page.evaluate("frlmMovie.trace.spans.get(frlmMovie.root.dataset.selected)")
    page.click("#detail-body [data-seek=start]")
    assert page.evaluate("frlmMovie.cursor") == span["t0"]
    assert page.evaluate("frlmMovie.following") is False
    started = page.evaluate("frlmMovie.rows.length")
    page.click("#detail-body [data-seek=end]")
    assert page.evaluate("frlmMovie.cursor") == span["t1"]
    assert page.evaluate("frlmMovie.rows.length") >= started
    page.click("[data-act=start]")
    page.evaluate(
        """() => { const s = document.getElementById('scrubber');
                   s.value = Math.round(s.max * 0.8);
                   s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }"""
    )
    page.wait_for_timeout(400)
    shot(page, "06-run-playback")


def test_it_shows_what_a_model_wrote_as_text(page, web):
    hostile = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
    run = finish(
        launch(question=scripted(f"print({hostile!r})", f"FINAL({hostile + '<b>bold</b>'!r})"))
    )
    assert run.status == "succeeded", run.error
    trace(run)
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    page.wait_for_selector("#turns pre.out")
    assert hostile in page.inner_text("#run-answer")
    assert page.locator("#run-answer b, #run-answer script, #run-answer img").count() == 0
    assert any(hostile in text for text in page.locator("#turns pre").all_inner_texts())
    page.goto("/")
    assert page.locator(f"tr[data-run={run.id}]").is_visible()
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None


def test_it_hides_a_run_from_a_user_who_may_not_see_it(browser, web, venues):
    alice, bob = make_user("alice"), make_user("bob")
    mine = bare_run(
        question="alice's question",
        owner=alice,
    )
    cli = bare_run(
        question="a CLI run",
    )
    as_alice, as_bob = Client(), Client()
    as_alice.force_login(alice)
    as_bob.force_login(bob)
    assert as_alice.get(f"/runs/{mine.id}").status_code == 200
    for run in (mine, cli):
        assert as_bob.get(f"/runs/{run.id}").status_code == 404
        assert as_bob.get(f"/api/runs/{run.id}/events").status_code == 404
        assert as_bob.get(f"/api/runs/{run.id}/turns").status_code == 404
        assert as_bob.get(f"/runs/{run.id}/header").status_code == 404
        assert as_bob.post(f"/runs/{run.id}/cancel").status_code == 404
    assert as_alice.get(f"/runs/{cli.id}").status_code == 404  # CLI runs: staff only
    assert as_bob.get(f"/diff?a={mine.id}&b={cli.id}").status_code == 404
    assert "alice&#x27;s question" not in as_bob.get("/").content.decode()
    # Over the real server too, and the live socket says why it closes.
    context = browser.new_context(base_url=web)
    client = Client()
    client.force_login(bob)
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": web}]
    )
    page = context.new_page()
    assert page.goto(f"/runs/{mine.id}").status == 404
    code = page.evaluate(
        """(id) => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}/ws/runs/${id}?after_seq=0`);
            ws.onmessage = () => resolve('message');
            ws.onclose = (e) => resolve(e.code);
        })""",
        mine.id,
    )
    assert code == 4403
    context.close()


def test_it_shows_names_workers_chose_as_text_in_the_views(page, web, staff):
    """Plotly reads some HTML in its texts (<b>, <a href>): a worker's or venue's name
    must show as written there too."""
    worker, venue = "<b>w9</b>", "<i>edge</i>"
    run = bare_run(
        question="names",
        owner=staff,
        status="succeeded",
    )
    client = get_redis()
    conductor = Emitter(client, run.id)
    with conductor.span("Run.Init") as root:
        with conductor.span("SubQuery.Submit", parent=root.span_id, venue=venue) as sq:
            with Emitter(client, run.id, venue=venue, worker_id=worker).span(
                "SubQuery.Execute", parent=sq.span_id
            ):
                pass
        conductor.instant("Run.Done", parent=root.span_id)
    wait_until(lambda: store.event_count(run.id) >= 7, timeout=20, what="the run stored")
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, "Number(document.getElementById('movie').dataset.viewsDrawn) >= 1")
    for view in ("flow", "topology", "heat"):
        texts = page.locator(f"#view-{view} text").evaluate_all("es => es.map(e => e.textContent)")
        assert any(worker in t for t in texts), (view, texts)
        assert page.locator(f"#view-{view} b, #view-{view} [font-weight=bold]").count() == 0
    texts = page.locator("#view-topology text").evaluate_all("es => es.map(e => e.textContent)")
    assert venue in texts


def test_it_keeps_the_newest_spans_in_view_until_the_reader_scrolls_up(page, web, staff):
    run = bare_run(
        question="a long fanout",
        owner=staff,
        status="running",
    )
    page.goto(f"/runs/{run.id}")
    page.wait_for_function("frlmMovie.ws && frlmMovie.ws.readyState === 1")
    conductor = Emitter(get_redis(), run.id)
    root = conductor.start("Run.Init")

    def fan_out(n: int) -> None:
        for i in range(n):
            conductor.start("SubQuery.Submit", parent=root.span_id, venue="local", sq=i).end()

    scroller = "document.querySelector('#waterfall .wf-scroll')"
    at_end = f"(s => s.scrollHeight - s.scrollTop - s.clientHeight < 16)({scroller})"
    fan_out(120)  # far more rows than the waterfall shows
    wait_for(page, "frlmMovie.rows.length === 121", what="the spans on the waterfall")
    wait_for(page, f"{scroller}.scrollTop > 0 && {at_end}", what="the waterfall at its end")
    # The reader scrolls up to the run's start: new spans no longer move the view.
    page.evaluate(f"{scroller}.scrollTop = 0")
    fan_out(40)
    wait_for(page, "frlmMovie.rows.length === 161", what="the new spans")
    page.wait_for_timeout(300)
    assert page.evaluate(f"{scroller}.scrollTop") == 0
    root.end()


def test_it_keeps_an_ended_runs_trace_answer_until_a_later_event(staff):
    import gzip
    import json

    from traces.views import EVENTS_CACHE

    run = finish(launch(question=scripted("FINAL('kept')")))
    assert run.status == "succeeded", run.error
    trace(run)
    client = Client()
    client.force_login(staff)

    def events(**headers) -> dict:
        answer = client.get(f"/api/runs/{run.id}/events", **headers)
        assert answer.status_code == 200
        body = answer.content
        if answer.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)

    first = events(HTTP_ACCEPT_ENCODING="gzip")
    cache = store.run_dir(run.id) / EVENTS_CACHE
    assert cache.exists()  # the run has ended: its answer is kept
    assert events(HTTP_ACCEPT_ENCODING="gzip") == first == events()  # kept, and as built
    # A later event (a given-up attempt ending after its run) makes the kept answer stale.
    count = store.event_count(run.id)
    Emitter(get_redis(), run.id).instant("Verify.Flag", status="rejected", reason="late")
    wait_until(lambda: store.event_count(run.id) > count, what="the late event stored")
    later = events(HTTP_ACCEPT_ENCODING="gzip")
    assert later["last_seq"] > first["last_seq"]
    assert later["events"][: len(first["events"])] == first["events"]


def test_it_shortens_a_huge_question_and_answer_and_still_loads(page, web, staff):
    """A run whose question and answer are megabytes (the question from before its limit,
    an answer as long as FINAL takes): the page, the dashboard and its table show them
    shortened, and the page loads (with 2,000,000 characters in it twice, it never did)."""
    run = bare_run("Q" * 2_000_000, answer="A" * 3_000_000, status="succeeded", owner=staff)
    client = Client()
    client.force_login(staff)
    for url in (f"/runs/{run.id}", f"/runs/{run.id}/header", "/", "/runs/table"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert len(response.content) < 200_000, (url, len(response.content))
    page.goto(f"/runs/{run.id}", timeout=20_000)
    answer = page.inner_text("#run-answer")
    assert "shortened here: the whole answer, 3000000 characters" in answer
    assert "frlm_runs --json" in answer


def test_a_runs_header_and_views_count_what_it_paid_not_what_workers_claimed(page, web, staff):
    """The header, the fill view and the batch's row add what the run paid for each reply
    (its Submit's end) and its turns, as its row and the CLI do: they added every Execute
    span's claim, a cancelled run's late work and a hedge's loser included, so the live
    figure dropped to the run's own at Run.Done (a review saw $0.0507, then $0.0426)."""
    from decimal import Decimal

    run = bare_run(
        question="cancelled",
        owner=staff,
        status="cancelled",
        tokens_in=300,
        tokens_out=4,
        cost=Decimal("0.0300"),
        wall_ms=1500.0,
    )
    client = get_redis()
    conductor = Emitter(client, run.id)
    with conductor.span("Run.Init") as root:
        with conductor.span("Run.Decode", parent=root.span_id) as turn:
            turn.end("ok", tokens_in=100, tokens_out=4, cost=Decimal("0.0100"))
        with conductor.span("SubQuery.Submit", parent=root.span_id, venue="edge") as sq:
            worker = Emitter(client, run.id, venue="edge", worker_id="wlate")
            with worker.span("SubQuery.Execute", parent=sq.span_id) as execute:
                execute.end("ok", tokens_in=5000, tokens_out=70, cost=Decimal("0.5"))
            # The hedge's loser, which ran on after the winner settled the sub-query.
            with worker.span("SubQuery.Execute", parent=sq.span_id) as loser:
                loser.end("ok", tokens_in=5000, tokens_out=70, cost=Decimal("0.5"))
            sq.end("ok", tokens_in=200, cost=Decimal("0.0200"))
        time.sleep(0.1)  # Run.Done well after: the scrubber can stop between them
        conductor.instant(
            "Run.Done",
            parent=root.span_id,
            status="cancelled",
            run_status="cancelled",
            wall_ms=1500.0,
            tokens_in=300,
            tokens_out=4,
            cost=Decimal("0.0300"),
        )
    wait_until(lambda: store.event_count(run.id) >= 10, timeout=20, what="the run stored")
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-ready='1']")
    wait_for(page, "document.querySelector('[data-metric=wall]').textContent.includes('1.5')")
    assert page.inner_text("[data-metric=tokens]") == "300 / 4"
    assert page.inner_text("[data-metric=cost]") == "$0.0300"
    wait_for(page, "(document.getElementById('view-fill').textContent || '').includes('cost $')")
    assert "tokens 304 · cost $0.0300" in page.evaluate(
        "document.getElementById('view-fill').textContent"
    )
    # The moment before Run.Done: the same figures, from the events alone.
    page.evaluate(
        """() => { const s = document.getElementById('scrubber'), T = frlmMovie.trace;
                   const done = T.events.find((e) => e[FRLM.F.NAME] === 'Run.Done');
                   s.value = Math.max(0, Math.floor(done[FRLM.F.T] - T.t0) - 50);
                   s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }"""
    )
    wait_for(page, "document.querySelector('[data-metric=cost]').textContent === '$0.0300'")
    assert page.inner_text("[data-metric=tokens]") == "300 / 4"


def test_it_asks_for_the_trace_once_and_for_plotly_only_once_the_trace_has_come(page, web):
    """The head preloads the trace and the page's fetch takes that answer (a fetch that did
    not match the preload would ask twice); Plotly's 1.2 MB is asked for only once the trace
    has come: fetched beside it, it held up the trace on a cold load (bench/ui.py)."""
    run = finish(launch(question=scripted("FINAL('drawn')")))
    assert run.status == "succeeded", run.error
    seen: list[tuple[str, str]] = []
    page.on("request", lambda r: seen.append(("asked", r.url)))
    page.on("requestfinished", lambda r: seen.append(("came", r.url)))
    page.goto(f"/runs/{run.id}")
    page.wait_for_selector("#movie[data-interactive][data-views-ready]")
    wait_for(page, "window.Plotly !== undefined")
    events = f"/api/runs/{run.id}/events"
    asked = [i for i, (what, url) in enumerate(seen) if what == "asked" and url.endswith(events)]
    assert len(asked) == 1, seen
    came = next(i for i, (what, url) in enumerate(seen) if what == "came" and url.endswith(events))
    plotly = [i for i, (what, url) in enumerate(seen) if what == "asked" and "/plotly" in url]
    assert plotly and min(plotly) > came, seen
