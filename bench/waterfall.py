"""Waterfall benchmark, in headless Chromium, measured in one run: what search, filters and
batch rows cost on a trace of 10,000 spans (and 100,000), side by side with the plain tree.

For each way of showing the rows (the tree, batches folded, a text search, a status filter,
errors only, slower than p95) it times, in the page:

rebuild   choosing the rows to show from the trace's rows (static/frlm/wfrows.js), once per
          cursor move or live batch
frame     drawing the canvas (static/frlm/waterfall.js) with those rows, scrolled midway
live      a live batch of 100 spans: Trace.add, Trace.rows, the rebuild and a frame

and prints each against the plain tree's (the ratio of rebuild + frame, fastest runs).
No server: the page is the static scripts and a trace built in it, shaped as bench/ui.py's (turns, batches of up to 1,000
sub-queries, a Submit and an Execute span each, 32 workers over 4 venues).

  .venv/bin/python bench/waterfall.py [--spans 10000] [--repeat 30] [--quick]
"""

# The page's JavaScript below keeps the static scripts' line length, not Python's.
# ruff: noqa: E501

from __future__ import annotations

import argparse
from pathlib import Path

from _stack import stop_on_signals  # puts the repository on the path

from tests.pages.conftest import CHROMIUM, CHROMIUM_ARGS  # the browser the page tests use

STATIC = Path(__file__).resolve().parent.parent / "static" / "frlm"
SCRIPTS = ["trace.js", "wfrows.js", "waterfall.js"]

# Builds the trace in the page: wire rows as traces.live sends them.
BUILD_JS = """(spans) => {
  const F = FRLM.F, rows = [];
  let seq = 0, t = 1e12, made = 1, turn = 0;
  const ev = (span, parent, name, phase, ts, extra) => {
    const r = new Array(17).fill(null);
    r[F.SEQ] = ++seq; r[F.SPAN] = span; r[F.PARENT] = parent; r[F.NAME] = name;
    r[F.PHASE] = phase; r[F.T] = ts; r[F.STATUS] = "ok"; r[F.DEPTH] = 0;
    Object.assign(r, extra || {});
    rows.push(r);
  };
  const span = (name, parent, t0, t1, extra, endExtra) => {
    const id = "s" + seq;
    ev(id, parent, name, "start", t0, extra);
    ev(id, parent, name, "end", t1, Object.assign({ [F.MS]: t1 - t0 }, extra, endExtra));
    return id;
  };
  ev("root", null, "Run.Init", "start", t, { [F.VENUE]: "conductor" });
  while (made < spans) {
    turn++;
    span("Run.Decode", "root", t, t + 400, { [F.VENUE]: "conductor", [F.ATTRS]: { turn } });
    t += 400;
    const batch = Math.min(1000, Math.floor((spans - made - 2) / 2));
    const cell = span("Repl.Exec", "root", t, t + batch * 5 + 950, { [F.VENUE]: "conductor", [F.ATTRS]: { turn, cell: turn } });
    made += 2;
    for (let i = 0; i < batch; i++) {
      const v = i % 4, w = "w" + v + "-" + (i % 8), sent = t + 20 + i * 5, done = sent + 200 + (i * 37) % 600;
      const status = i % 97 === 0 ? "error" : "ok";
      const sq = span("SubQuery.Submit", cell, sent, done + 5, { [F.VENUE]: "venue" + v, [F.ATTRS]: { sq: i, batch: turn } }, { [F.STATUS]: status });
      span("SubQuery.Execute", sq, sent + 10, done, { [F.VENUE]: "venue" + v, [F.WORKER]: w }, { [F.STATUS]: status, [F.COST]: 0.0001 });
      made += 2;
    }
    t += batch * 5 + 950;
  }
  ev("root", null, "Run.Init", "end", t, { [F.VENUE]: "conductor" });
  rows.sort((a, b) => a[F.T] - b[F.T]).forEach((r, i) => { r[F.SEQ] = i + 1; });
  window.__rows = rows;
  return rows.length;
}"""

# Times one way of showing the rows; `setup` sets the waterfall's filter and grouping.
MEASURE_JS = """([setup, repeat]) => {
  const T = new FRLM.Trace();
  T.add(window.__rows);
  const wf = new FRLM.Waterfall(document.getElementById("w"), {});
  wf.trace = T;
  wf.group = false;
  new Function("wf", setup)(wf);
  const k = T.events.length, source = T.rows(k);
  const view = { tStart: T.t0, tEnd: T.t1, cursor: null, k, events: T.events, origin: T.t0 };
  // The fastest of the repeats and the median: on a shared machine the median carries the
  // other processes' noise, the fastest what the code costs.
  const stat = (xs) => { xs.sort((a, b) => a - b); return [xs[0], xs[Math.floor(xs.length / 2)]]; };
  const rebuild = [], frame = [], live = [];
  wf.set(source, view, true);
  for (let n = 0; n < repeat; n++) {
    let t0 = performance.now();
    wf._dirty = true; wf.set(source, view, false);
    rebuild.push(performance.now() - t0);
    wf.scroll.scrollTop = Math.floor(wf.rows.length * wf.opts.rowH / 2);
    t0 = performance.now();
    wf.drawNow();
    frame.push(performance.now() - t0);
  }
  const shown = wf.rows.length;
  // Live: the trace grows by 100 spans (200 events) a batch under the last cell.
  const F = FRLM.F, cell = source.filter((s) => s.name === "Repl.Exec").pop();
  let seq = T.lastSeq, tt = T.t1;
  for (let n = 0; n < repeat; n++) {
    const batch = [];
    for (let i = 0; i < 100; i++) {
      const id = "live" + n + "-" + i, a = new Array(17).fill(null), b = new Array(17).fill(null);
      a[F.SEQ] = ++seq; a[F.SPAN] = id; a[F.PARENT] = cell.id; a[F.NAME] = "SubQuery.Submit"; a[F.PHASE] = "start"; a[F.T] = ++tt; a[F.DEPTH] = 0; a[F.ATTRS] = { batch: 999 }; a[F.VENUE] = "venue0";
      b[F.SEQ] = ++seq; b[F.SPAN] = id; b[F.PARENT] = cell.id; b[F.NAME] = "SubQuery.Submit"; b[F.PHASE] = "end"; b[F.T] = ++tt; b[F.STATUS] = "ok"; b[F.MS] = 1; b[F.DEPTH] = 0;
      batch.push(a, b);
    }
    const t0 = performance.now();
    T.add(batch);
    const k2 = T.events.length;
    wf.set(T.rows(k2), Object.assign({}, view, { k: k2, tEnd: tt }), true);
    live.push(performance.now() - t0);
  }
  wf.el.replaceChildren();
  return { rebuild: stat(rebuild), frame: stat(frame), live: stat(live), shown };
}"""

MODES = [
    ("tree (every span a row)", ""),
    ("batches folded", "wf.group = true;"),
    ("search 'w1-5'", "wf.filter.text = 'w1-5';"),
    ("status error", "wf.filter.status = 'error';"),
    ("errors only", "wf.filter.errors = true;"),
    ("slower than p95", "wf.filter.slow = true;"),
    ("worker + venue", "wf.filter.worker = 'w1-1'; wf.filter.venue = 'venue1';"),
]


def measure(page, spans: int, repeat: int) -> None:
    events = page.evaluate(BUILD_JS, spans)
    print(f"\n{spans:,} spans ({events:,} events), {repeat} repeats: fastest / median ms")
    print(f"  {'rows shown':<24}{'shown':>7}{'rebuild':>15}{'frame':>15}{'live':>15}  ratio")
    base = None
    for label, setup in MODES:
        r = page.evaluate(MEASURE_JS, [setup, repeat])
        cost = r["rebuild"][0] + r["frame"][0]
        base = base or cost
        cells = "".join(f"{a:>8.2f} /{b:>5.1f}" for a, b in (r["rebuild"], r["frame"], r["live"]))
        print(f"  {label:<24}{r['shown']:>7,}{cells}  {cost / max(1e-6, base):4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="10,000 spans only, 10 repeats")
    args = parser.parse_args()
    stop_on_signals()
    from playwright.sync_api import sync_playwright

    scripts = "\n".join(
        f"<script>{(STATIC / name).read_text(encoding='utf-8')}</script>" for name in SCRIPTS
    )
    html = (
        "<!doctype html><html><body style='margin:0'>"
        "<div id='w' style='width:1200px;height:600px;display:flex'></div>"
        f"{scripts}</body></html>"
    )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 800})
            page.set_content(html)
            sizes = [args.spans] if args.quick else [args.spans, 10 * args.spans]
            for spans in sizes:
                measure(page, spans, 10 if args.quick else args.repeat)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
