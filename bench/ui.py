"""Run page benchmark, in headless Chromium, measured in one run:

run page         from navigation to the run page of a 10,000-span run: the header and the
                 waterfall drawn and painted, the page answering input ("waterfall"), and
                 all five views drawn from the whole stored trace ("views"; the page marks
                 the first render of the views after the trace is in); cold (a new browser
                 context each load: an empty profile, no cache) and warm (reloads in one
                 context). Two deliveries of Plotly side by side, the page's code the same
                 in both: "now" (FRLM's 1.18 MB bundle of the three trace types the views
                 draw, static/vendor/README.md, gzipped, fetched once the trace has come,
                 run and the views drawn once the waterfall is on screen) and "before" (the full
                 4.8 MB bundle, plain, loaded with defer so the page waited for it), the
                 latter put in place by the browser's request routing (which turns the
                 browser's HTTP cache off: a cold load either way; the routed page costs
                 "before" a little extra); warm loads of the page as it is served. Also the
                 page's own marks, median of the cold loads: the trace parsed, indexed, the
                 first frame, Plotly run, and each view's first draw. With
                 --scripts-from DIR, "before" is instead the page's own scripts
                 (static/frlm/*.js) as DIR has them, a checkout of another commit, and
                 "now" those of this checkout, both put in place by the routing: a change
                 to the page's code measured side by side in one run, the loads
                 alternated (cold loads here vary by ±70 ms from one minute to the next)
live latency     from an event's emission to its appearance in the page at 2,000 events/s
                 (target p95 < 100 ms): the waterfall frame that draws the event's span,
                 scrolled into view, has been painted. The page follows the newest spans (the
                 waterfall kept scrolled to its end, as a user watching the run does), so
                 every event's row is on screen when drawn; an event drawn off screen (rows
                 arriving faster than a screenful per frame) is counted apart. Also shown:
                 arrival (the socket message handled), which is cheaper than appearance and
                 is not the target

The events go the product's whole way: the emitter, the Redis stream, the live forwarder
(traces.forwarder, apart from the recorder that stores them), traces.live, the Redis channel
layer, daphne, the page.

  .venv/bin/python bench/ui.py [--spans 10000] [--rate 2000] [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import threading
import time
import uuid

import plotly
from _stack import private_stack, stop_on_signals  # sets up Django on a private instance

from frlm_web.stack import VenueSpec, free_port, web_proc
from tests.pages.conftest import CHROMIUM, CHROMIUM_ARGS  # the browser the page tests use
from traces import live, store
from traces.emitter import Emitter

WORKERS = [(f"venue{v}", f"w{v}-{i}") for v in range(4) for i in range(8)]


def big_trace(client, run_id: str, spans: int) -> int:
    """A finished run of `spans` spans, shaped like a fanout (turns, batches of sub-queries
    each with its worker's span), spread over a minute; returns the events emitted."""
    conductor = Emitter(client, run_id)
    t0 = time.time_ns() - 120 * 10**9
    events: list[dict] = []

    def at(ms: float) -> int:
        return t0 + int(ms * 1e6)

    def span(name, parent, start_ms, end_ms, emitter=conductor, status="ok", **fields):
        span_id = uuid.uuid4().hex[:16]
        start = emitter.build(name, "start", span_id=span_id, parent=parent, **fields)
        start["ts"] = at(start_ms)
        end = emitter.build(
            name, "end", span_id=span_id, parent=parent, status=status, ms=end_ms - start_ms
        )
        end["ts"] = at(end_ms)
        events.extend([start, end])
        return span_id

    made, turn, clock = 1, 0, 0.0
    root = uuid.uuid4().hex[:16]
    start = conductor.build("Run.Init", "start", span_id=root, question="benchmark")
    start["ts"] = at(0)
    events.append(start)
    while made < spans:
        turn += 1
        span("Run.Decode", root, clock, clock + 400, turn=turn, tokens_in=900, tokens_out=120)
        clock += 400
        batch = min(1000, (spans - made - 2) // 2)
        cell_end = clock + 50 + batch * 5 + 900
        cell = span("Repl.Exec", root, clock, cell_end, turn=turn, cell=turn)
        made += 2
        for i in range(batch):
            venue, worker_id = WORKERS[i % len(WORKERS)]
            worker = Emitter(client, run_id, venue=venue, worker_id=worker_id)
            sent = clock + 20 + i * 5
            done = sent + 200 + (i * 37) % 600
            status = "error" if i % 97 == 0 else "ok"
            submit = span("SubQuery.Submit", cell, sent, done + 5, venue=venue, sq=i)
            span(
                "SubQuery.Execute",
                submit,
                sent + 10,
                done,
                emitter=worker,
                status=status,
                tokens_in=800,
                tokens_out=3,
            )
            made += 2
        clock = cell_end
    end = conductor.build("Run.Init", "end", span_id=root, ms=clock)
    end["ts"] = at(clock)
    events.append(end)
    events.sort(key=lambda e: e["ts"])
    for start_at in range(0, len(events), 2000):
        conductor.send(events[start_at : start_at + 2000])
    return len(events)


def emit_live(client, run_id: str, rate: int, seconds: float) -> tuple[int, float]:
    """Sub-query spans (start and end events) at `rate` events/s, every 10 ms, stamped at
    emission; returns (events sent, seconds taken)."""
    emitter = Emitter(client, run_id, venue="local", worker_id="w0-0")
    per_tick = max(2, rate // 100)
    # The sub-queries' parent, open for the whole emission, as a REPL cell of a real run is
    # (a span whose parent the page has not seen is not drawn). Not counted.
    parent = uuid.uuid4().hex[:16]
    emitter.send([Emitter(client, run_id).build("Repl.Exec", "start", span_id=parent, cell=1)])
    time.sleep(0.5)
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = []
        for _ in range(per_tick // 2):
            span_id = uuid.uuid4().hex[:16]
            batch.append(emitter.build("SubQuery.Execute", "start", span_id=span_id, parent=parent))
            batch.append(
                emitter.build("SubQuery.Execute", "end", span_id=span_id, parent=parent, ms=5.0)
            )
        emitter.send(batch)
        sent += len(batch)
        wait = started + sent / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
    return sent, time.perf_counter() - started


class ChannelTap:
    """Joins the run's channel group in this process: when each event left traces.live
    (in the forwarder) and crossed the channel layer, without daphne and the browser."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.latencies: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)
        self.thread.start()
        time.sleep(0.5)

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(live.group_name(self.run_id), channel)
        while not self.stopping.is_set():
            try:
                message = await asyncio.wait_for(layer.receive(channel), timeout=0.5)
            except TimeoutError:
                continue
            now = time.time() * 1000
            self.latencies.extend(now - row[5] for row in message.get("events", []))

    def stop(self) -> list[float]:
        time.sleep(1)
        self.stopping.set()
        self.thread.join(timeout=5)
        return self.latencies


FULL_PLOTLY = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
PLOTLY_TAG = re.compile(r'<meta name="frlm-plotly" content="(/vendor/[^"]+)" id="plotly-js">')


CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def route_scripts(context, checkout: str) -> None:
    """Serve the page's own scripts (static/frlm/*.js) from `checkout`."""
    directory = os.path.join(checkout, "static", "frlm")
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".js"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            body = f.read()
        context.route(
            f"**/static/frlm/{name}",
            lambda route, request=None, body=body: route.fulfill(
                body=body, headers={"Content-Type": "text/javascript"}
            ),
        )


def route_delivery(context, run_id: str, before: bool) -> None:
    """Route the run page (and Plotly) through the browser's request routing: as served
    ("now"), or with the full bundle, plain and deferred, as the page loaded it before."""
    full = open(FULL_PLOTLY, "rb").read() if before else b""

    def page(route) -> None:
        response = route.fetch()
        html = response.text()
        if before:
            tag = '<script src="/vendor/plotly.min.js" defer></script>'
            html, found = PLOTLY_TAG.subn(tag, html)
            if not found:
                raise SystemExit("bench/ui.py: PLOTLY_TAG no longer finds Plotly in the run page")
        route.fulfill(response=response, body=html)

    context.route(f"**/runs/{run_id}", page)
    if before:
        context.route(
            "**/vendor/plotly.min.js",
            lambda route: route.fulfill(
                body=full,
                headers={"Content-Type": "text/javascript", "Cache-Control": "max-age=86400"},
            ),
        )


# The page's own marks (static/frlm/movie.js) and each view's first draw, ms.
MARKS_JS = """() => {
    const out = {};
    for (const m of performance.getEntriesByType("mark")) {
        out[m.name.replace("frlm:", "")] = m.startTime;
    }
    const [nav] = performance.getEntriesByType("navigation");
    if (nav) {
        out["page first byte"] = nav.responseStart;
        out["page received"] = nav.responseEnd;
    }
    for (const r of performance.getEntriesByType("resource")) {
        const name = r.name.split("?")[0].split("/").pop();
        if (name.endsWith(".js") || name.endsWith(".css")) out["got " + name] = r.responseEnd;
    }
    const got = performance.getEntriesByType("resource").find((r) => r.name.endsWith("/events"));
    if (got) {
        out["trace asked"] = got.requestStart;
        out["trace first byte"] = got.responseStart;
        out["trace received"] = got.responseEnd;
    }
    for (const [name, ms] of Object.entries(frlmMovie.views.timings)) out["draw " + name] = ms;
    return out;
}"""


def time_load(page, run_id: str) -> tuple[float, float, dict[str, float]]:
    """(waterfall, five views, the page's marks) in ms from navigation, for one load of the
    run page; NaN for a load whose marks did not come within two minutes (printed so)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    page.goto(f"/runs/{run_id}", wait_until="commit")
    try:
        page.wait_for_selector("#movie[data-interactive][data-views-ready]", timeout=120_000)
    except PageTimeout:
        return float("nan"), float("nan"), {}
    return (
        float(page.get_attribute("#movie", "data-interactive")),
        float(page.get_attribute("#movie", "data-views-ready")),
        page.evaluate(MARKS_JS),
    )


def time_cold(
    browser, base: str, cookie: dict, run_id: str, before: bool, loads: int, scripts_from: str
) -> list:
    """Loads each in a fresh context (an empty cache), routed as `before` says: with
    `scripts_from`, the page's scripts from there (before) or from this checkout (now)."""
    times = []
    for _ in range(loads):
        context = browser.new_context(viewport={"width": 1600, "height": 1000}, base_url=base)
        context.add_cookies([cookie])
        if scripts_from:
            route_scripts(context, scripts_from if before else CHECKOUT)
        elif before:  # "now" is the page as served: no routing, so a truly cold cache
            route_delivery(context, run_id, before)
        times.append(time_load(context.new_page(), run_id))
        context.close()
    return times


# In the page: each event's arrival (the socket message handled) and its appearance (the
# first painted waterfall frame that draws it on screen). The waterfall is kept scrolled to
# its end before each draw, as a user following the newest spans keeps it. A task posted
# from the frame's drawing runs once the frame has been painted.
WATCH_JS = """(views) => {
    const M = frlmMovie, W = M.wf, F = FRLM.F;
    const w = window.__watch = { arrival: [], appearance: [], offScreen: 0 };
    if (!views) M.views.render = () => true;
    M.listeners.push((rows, now) => { for (const r of rows) w.arrival.push(now - r[F.T]); });
    let seen = M.trace.events.length, pending = [];
    const painted = new MessageChannel();
    painted.port1.onmessage = () => {
        const now = Date.now();
        for (const t of pending) w.appearance.push(now - t);
        pending = [];
    };
    const draw = W._draw.bind(W);
    W._draw = function () {
        const h = W.scroll.clientHeight, rowH = W.opts.rowH;
        W.spacer.style.height = Math.max(0, W.rows.length * rowH - h) + "px";
        W.scroll.scrollTop = W.scroll.scrollHeight;
        draw();
        const k = W.view.k;
        if (k <= seen) return;
        const first = Math.floor(W.scroll.scrollTop / rowH);
        const last = Math.min(W.rows.length, first + Math.ceil(h / rowH));
        const shown = new Set();
        for (let r = first; r < last; r++) shown.add(W.rows[r].id);
        const ev = M.trace.events;
        for (let i = seen; i < k; i++) {
            const e = ev[i];
            if (shown.has(e[F.PHASE] === "instant" ? e[F.PARENT] : e[F.SPAN])) pending.push(e[F.T]);
            else w.offScreen++;
        }
        seen = k;
        painted.port2.postMessage(0);
    };
}"""


def watch_live(page, run_id: str, emit, *, views: bool = True) -> dict:
    """Open the live run's page, emit, and collect each event's arrival and appearance."""
    page.goto(f"/runs/{run_id}", wait_until="commit")
    page.wait_for_function("window.frlmMovie && frlmMovie.ws && frlmMovie.ws.readyState === 1")
    page.evaluate(WATCH_JS, views)
    sent, elapsed = emit()
    deadline = time.monotonic() + 30
    counted = "window.__watch.appearance.length + window.__watch.offScreen"
    while page.evaluate(counted) < sent and time.monotonic() < deadline:
        time.sleep(0.2)
    watch = page.evaluate("window.__watch")
    return {
        "sent": sent,
        "elapsed": elapsed,
        "got": page.evaluate("frlmMovie.trace.events.length"),
        "arrival": sorted(watch["arrival"]),
        "appearance": sorted(watch["appearance"]),
        "off_screen": watch["offScreen"],
        "timings": page.evaluate("frlmMovie.views.timings"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=2000, help="live events per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--loads", type=int, default=5, help="page loads to time (cold ones vary by ±70 ms here)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="2,000 spans, 3 s live, 2 loads: a few minutes"
    )
    parser.add_argument(
        "--scripts-from",
        metavar="DIR",
        default="",
        help="a checkout (git worktree add DIR REV) whose static/frlm scripts are 'before'",
    )
    args = parser.parse_args()
    if args.scripts_from and not os.path.isdir(os.path.join(args.scripts_from, "static", "frlm")):
        parser.error(f"--scripts-from {args.scripts_from}: no static/frlm there; give a checkout")
    if args.quick:
        args.spans, args.seconds, args.loads = min(args.spans, 2000), 3.0, 2
    stop_on_signals()

    from django.contrib.auth import get_user_model
    from django.test import Client

    from frlm_web.redis_client import get_redis
    from runs.models import Run

    venues = [VenueSpec("local", concurrency=2)]
    with private_stack(venues) as stack:
        port = free_port()
        web = web_proc(port)
        stack.launch(web)
        stack.wait_ready(web, 60)
        base = f"http://127.0.0.1:{port}"
        user = get_user_model().objects.create_user("bench", is_staff=True)
        client = Client()
        client.force_login(user)
        cookie = {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base}

        def new_run(status: str) -> Run:
            return Run.objects.create(
                question="benchmark",
                context_source="text",
                context_path="/dev/null",
                root_model={"kind": "sim", "model": "bench", "base_url": ""},
                worker_model={"kind": "sim", "model": "bench", "base_url": ""},
                owner=user,
                status=status,
            )

        redis_client = get_redis()
        big = new_run("succeeded")
        emitted = big_trace(redis_client, big.id, args.spans)
        deadline = time.monotonic() + 120
        while store.event_count(big.id) < emitted and time.monotonic() < deadline:
            time.sleep(0.2)
        spans_stored = store.run_summary(big.id)["spans"]

        from playwright.sync_api import sync_playwright

        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop; ORM calls are sync
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            context = browser.new_context(viewport={"width": 1600, "height": 1000}, base_url=base)
            context.add_cookies([cookie])
            page = context.new_page()
            page.set_default_timeout(120_000)  # a loaded machine answers slowly

            # --- the run page of a 10,000-span run: waterfall, then the five views ------
            page.goto(f"/runs/{big.id}", wait_until="commit")  # warm: daphne, the static files
            page.wait_for_selector("#movie[data-interactive][data-views-ready]", timeout=120_000)
            warm = [time_load(page, big.id) for _ in range(args.loads)]
            # Cold, the two deliveries alternated so that the machine's load falls on both.
            cold_now, cold_before = [], []
            for _ in range(args.loads):
                cold_now += time_cold(browser, base, cookie, big.id, False, 1, args.scripts_from)
                cold_before += time_cold(browser, base, cookie, big.id, True, 1, args.scripts_from)
            shown = page.evaluate("frlmMovie.trace.spans.size")
            scroll_start = time.perf_counter()
            page.evaluate(
                """() => new Promise((resolve) => {
                    const s = document.querySelector('#waterfall .wf-scroll');
                    let n = 0;
                    function step() {
                        s.scrollTop += 400;
                        n++;
                        if (n < 60) requestAnimationFrame(step); else resolve();
                    }
                    requestAnimationFrame(step);
                })"""
            )
            scroll_fps = 60 / (time.perf_counter() - scroll_start)

            # --- live latency at `rate` events/s ---------------------------------------
            live = new_run("running")
            tap = ChannelTap(live.id)
            full = watch_live(
                page, live.id, lambda: emit_live(redis_client, live.id, args.rate, args.seconds)
            )
            layer_lat = sorted(tap.stop())
            # The same with the five views not drawn: what drawing them costs.
            bare = new_run("running")
            no_views = watch_live(
                page,
                bare.id,
                lambda: emit_live(redis_client, bare.id, args.rate, args.seconds),
                views=False,
            )
            browser.close()

    def q(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")

    print(f"run page of {spans_stored:,} spans ({emitted:,} events), {shown:,} spans on the page")
    if args.scripts_from:
        print(
            f"  before: the page's scripts of {args.scripts_from}; now: this checkout's"
            " (both routed)"
        )
    else:
        print("  before: Plotly's full bundle, plain and deferred; now: the page as served")

    def line(label: str, times: list, which: int, target: str = "") -> None:
        values = [t[which] for t in times]
        print(
            f"  {label:32} median {statistics.median(values):6.0f} ms"
            f"  (runs: {', '.join(f'{v:.0f}' for v in values)}){target}"
        )

    for which, what, target in (
        (0, "waterfall", "   target < 500 ms"),
        (1, "five views", "   target < 1000 ms"),
    ):
        line(f"{what}, cold, now", cold_now, which, target)
        line(f"{what}, cold, before", cold_before, which)
        line(f"{what}, warm, now", warm, which)
    for which, what in ((0, "waterfall"), (1, "five views")):
        now = statistics.median(t[which] for t in cold_now)
        before = statistics.median(t[which] for t in cold_before)
        print(f"  {what}, cold: before / now = {before / max(now, 1):.2f}x")
    marks: dict[str, list[float]] = {}
    for _, _, detail in cold_now:
        for name, ms in detail.items():
            marks.setdefault(name, []).append(ms)
    print(
        "  cold, now, median ms: "
        + ", ".join(f"{name} {statistics.median(v):.0f}" for name, v in marks.items())
    )
    print(f"  waterfall scroll            {scroll_fps:5.0f} frames/s")
    print(
        f"live: {full['sent']:,} events at {full['sent'] / full['elapsed']:,.0f}/s for "
        f"{full['elapsed']:.1f} s; {full['got']:,} reached the page, "
        f"{len(full['appearance']):,} appeared on screen ({full['off_screen']:,} drawn off screen)"
    )
    for label, values in (
        ("emission -> appearance", full["appearance"]),
        ("  ... views not drawn", no_views["appearance"]),
        ("emission -> arrival", full["arrival"]),
        ("  ... views not drawn", no_views["arrival"]),
        ("emission -> channel layer", layer_lat),
    ):
        print(
            f"  {label:26} p50 {q(values, 0.5):6.1f} ms   p95 {q(values, 0.95):6.1f} ms"
            f"   p99 {q(values, 0.99):6.1f} ms   max {q(values, 1.0):6.1f} ms"
        )
    print("  target: emission -> appearance p95 < 100 ms")
    print(
        "  the views' last live render, ms: "
        + ", ".join(f"{name} {ms:.0f}" for name, ms in full["timings"].items())
    )


if __name__ == "__main__":
    main()
