/* FRLM: the movie's five views (fill, pulse, flow, heat, topology), drawn by Plotly from one
   aggregation pass over the trace's first k events. Everything is binned or counted first:
   the charts get tens or hundreds of points however many spans the run has. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;
  const F = FRLM.F;

  const C = {
    fg: "#c9d1d9", muted: "#7d8896", grid: "#1d242d", ok: "#3fb950", err: "#f85149",
    timeout: "#ff8b3d", cancelled: "#6e7681", blue: "#4fb3ff", amber: "#d6a23a",
    purple: "#a371f7", teal: "#39c5cf", idle: "#30475e", cursor: "#ffd33d",
    gold: "#e3b341", goldDim: "rgba(227,179,65,0.4)",
  };
  // Money reaches the page as exact decimal strings ("0.00075"; ARCHITECTURE.md §9), older
  // traces as numbers: both are drawn as numbers, which is all a chart needs.
  const num = (v) => {
    const n = typeof v === "string" && /^-?[0-9.]+(e-?[0-9]+)?$/i.test(v) ? Number(v) : v;
    return typeof n === "number" && isFinite(n) ? n : null;
  };
  // Plotly reads a few HTML tags in its texts (<b>, <a href>...): names that workers and
  // venues chose go in as entities, so they show as written.
  const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  // Traces carry a worker's id; the pages show the name it registered (FRLM.workers, read
  // by trace.js from the page's #run-workers), marked when it has departed.
  const wname = (id) => (FRLM.workers && id && id !== "?" ? FRLM.workers.label(id) : id);
  const wtitle = (id) => (FRLM.workers && id && id !== "?" ? FRLM.workers.title(id) : id);
  const fmt$ = (v) => (v >= 100 ? v.toFixed(2) : v.toFixed(4));
  const STATUS_COLOR = { ok: C.ok, error: C.err, timeout: C.timeout, cancelled: C.cancelled, rejected: C.err, abandoned: C.err };

  function niceBin(range, target) {
    const raw = Math.max(1, range / target);
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  function perWorker(A, vn) {
    const zeros = () => new Array(A.nb).fill(0);
    return { venue: vn, inflight: 0, calls: 0, errors: 0, latSum: zeros(), latN: zeros(), errN: zeros(), lastErrBin: -99 };
  }

  /** A fresh tally, before any event: the run as the page knows it at k = 0. */
  function fresh(trace, extent) {
    const binMs = niceBin(extent, 60);
    const nb = Math.max(1, Math.ceil(extent / binMs) + 1);
    const zeros = () => new Array(nb).fill(0);
    return {
      trace, n: 0, binMs, nb, t0: trace.t0,
      dispatch: zeros(), done: zeros(), failed: zeros(), tokens: zeros(),
      submitted: 0, ok: 0, error: 0, timeout: 0, cancelled: 0, tin: 0, tout: 0, cost: 0,
      // The run's own state at k: what the header says (status, turns, the Run.Done figures).
      status: "queued", turns: 0, tLast: null, doneAttrs: null, doneStatus: null,
      venues: new Map(),    // name -> {inflight, ok, failed, cancelled, submitted}
      workers: new Map(),   // name -> {venue, inflight, calls, errors, lat: [], err: [], n: [], lastErrBin}
      flows: new Map(),     // "from\u0000to" -> count
      flowKeys: new Map(),  // from -> to -> the key in flows
      nodes: new Map(),     // prefix -> name -> prefix + name
      submitVenue: new Map(), // submit span -> venue it went to
      executed: new Set(),  // submit spans with an Execute started
      lastBin: 0,
      // Spending and trust, read from the attrs of Budget.*, Receipt.Emit and Verify.*
      // events by name (whatever else those attrs carry is left alone).
      budget: { events: 0, cap: null, committed: 0, settled: 0, refused: 0, alerts: [] },
      receipts: { count: 0, paid: 0, verdicts: new Map() },
      // Model calls answered from a cache: a replay's cassette (spans marked replayed) and
      // whatever Memory.CacheHit / CacheMiss a backend reports.
      cache: { hits: 0, misses: 0 },
      verify: { events: 0, ok: 0, rejected: 0, tiers: new Map(), subqueries: new Set() },
    };
  }

  /** Lengthen every per-bin array to nb bins (a live run's extent grew, its bin did not). */
  function grow(A, nb) {
    if (nb <= A.nb) return;
    const more = (arr) => { while (arr.length < nb) arr.push(0); };
    for (const arr of [A.dispatch, A.done, A.failed, A.tokens]) more(arr);
    for (const w of A.workers.values()) { more(w.latSum); more(w.latN); more(w.errN); }
    A.nb = nb;
  }

  /** Everything the header, the turn panel and the five views show after events [0, k).
      One tally for all of them, advanced event by event: `prev` is carried forward when
      the cursor only moved on and the bin width is unchanged (every frame of a live run),
      else the tally starts over (a seek back, a bin width that grew). */
  function aggregate(trace, k, extent, prev) {
    const binMs = niceBin(extent, 60);
    const nb = Math.max(1, Math.ceil(extent / binMs) + 1);
    let A = prev;
    if (!A || A.trace !== trace || A.t0 !== trace.t0 || A.n > k || A.binMs !== binMs) A = fresh(trace, extent);
    else grow(A, nb);
    const n = Math.min(k, trace.events.length);
    for (let i = A.n; i < n; i++) tally(A, trace.events[i]);
    A.n = Math.max(A.n, n);
    return A;
  }

  // tally's helpers, apart from it: closures made per event were a good part of a cold
  // load's garbage (20,000 events, bench/ui.py).
  function venueOf(A, name) {
    let v = A.venues.get(name);
    if (!v) { v = { inflight: 0, ok: 0, failed: 0, cancelled: 0, submitted: 0 }; A.venues.set(name, v); }
    return v;
  }

  function workerOf(A, name, vn) {
    let w = A.workers.get(name);
    if (!w) { w = perWorker(A, vn); A.workers.set(name, w); }
    if (vn && !w.venue) w.venue = vn;
    return w;
  }

  /** A flow node's name ("venue:" + name), made once per node, not per event. */
  function nodeOf(A, prefix, name) {
    let names = A.nodes.get(prefix);
    if (!names) { names = new Map(); A.nodes.set(prefix, names); }
    let node = names.get(name);
    if (node === undefined) { node = prefix + name; names.set(name, node); }
    return node;
  }

  /** Count one more move from node a to node b (a and b as "venue:x", "worker:y", ...);
      the pair's key is made once per pair, not per event. */
  function flowTo(A, a, b) {
    let to = A.flowKeys.get(a);
    if (!to) { to = new Map(); A.flowKeys.set(a, to); }
    let key = to.get(b);
    if (key === undefined) { key = a + "\u0000" + b; to.set(b, key); }
    A.flows.set(key, (A.flows.get(key) || 0) + 1);
  }

  function tally(A, r) {
    const t0 = A.t0, nb = A.nb, binMs = A.binMs;
    const name = r[F.NAME], phase = r[F.PHASE];
    const b = Math.max(0, Math.min(nb - 1, Math.floor((r[F.T] - t0) / binMs)));
    A.lastBin = b;
    A.tLast = A.tLast == null ? r[F.T] : Math.max(A.tLast, r[F.T]);
    if (A.status === "queued") A.status = "running";
    if (name === "Run.Decode" && phase === "start" && !r[F.DEPTH]) A.turns++;
    if (name === "Run.Done") {
      const attrs = r[F.ATTRS] || {};
      // The run's own figures (its row's): tokens and cost travel in the event's columns,
      // not its attributes. Read from the attributes, the header fell back to the sum of
      // every Execute span, work the run did not take included (a cancelled run: 4.9M
      // tokens against its 3.1M, a review).
      A.doneAttrs = { ...attrs, tokens_in: r[F.TIN], tokens_out: r[F.TOUT], cost: r[F.COST] };
      A.status = attrs.run_status || (r[F.STATUS] === "ok" ? "succeeded" : r[F.STATUS] === "cancelled" ? "cancelled" : "failed");
    }
    if (name === "SubQuery.Submit") {
      if (phase === "start") {
        const vn = r[F.VENUE] || "?";
        A.submitted++; A.dispatch[b]++;
        A.submitVenue.set(r[F.SPAN], vn);
        // One never sent (or a child RLM) is the conductor's: no venue holds it.
        if (FRLM.placed(vn)) {
          const v = venueOf(A, vn); v.inflight++; v.submitted++;
          flowTo(A, "conductor", nodeOf(A, "venue:", vn));
        }
      } else if (phase === "end") {
        const st = r[F.STATUS];
        const vn = A.submitVenue.get(r[F.SPAN]) || r[F.VENUE] || "?";
        const v = FRLM.placed(vn) ? venueOf(A, vn) : { cancelled: 0, failed: 0, ok: 0 };
        v.inflight = Math.max(0, (v.inflight || 0) - 1);
        if (st === "ok") { A.ok++; v.ok++; A.done[b]++; }
        else if (st === "cancelled") { A.cancelled++; v.cancelled++; A.failed[b]++; }
        else { if (st === "timeout") A.timeout++; else A.error++; v.failed++; A.failed[b]++; }
        if (!A.executed.has(r[F.SPAN])) {
          const from = FRLM.placed(vn) ? nodeOf(A, "venue:", vn) : "conductor";
          flowTo(A, from, "out:not " + (FRLM.placed(vn) ? "run" : "sent") + " (" + st + ")");
        }
        // What the run paid for the reply (the conductor's fair cost, in the Submit's end
        // columns): the run's own totals add these and its turns, never a worker's claim
        // on its Execute, nor a hedge's loser that ran on.
        A.tin += r[F.TIN] || 0; A.tout += r[F.TOUT] || 0; A.cost += r[F.COST] || 0;
        A.tokens[b] += (r[F.TIN] || 0) + (r[F.TOUT] || 0);
      }
    } else if (name === "SubQuery.Retry" && phase === "instant") {
      const attrs = r[F.ATTRS] || {};
      if (FRLM.placed(attrs.venue) && attrs.from_venue) {
        const to = venueOf(A, attrs.venue);
        if (FRLM.placed(attrs.from_venue)) {
          const from = venueOf(A, attrs.from_venue);
          from.inflight = Math.max(0, from.inflight - 1);
        }
        to.inflight++;
        A.submitVenue.set(r[F.PARENT], attrs.venue);
        A.dispatch[b]++;
        flowTo(A, "conductor", nodeOf(A, "venue:", attrs.venue));
      }
    } else if (name === "SubQuery.Execute") {
      const wn = r[F.WORKER] || "?";
      const w = workerOf(A, wn, r[F.VENUE]);
      if (phase === "start") {
        w.inflight++;
        A.executed.add(r[F.PARENT]);
        flowTo(A, nodeOf(A, "venue:", r[F.VENUE] || "?"), nodeOf(A, "worker:", wn));
      } else if (phase === "end") {
        w.inflight = Math.max(0, w.inflight - 1);
        w.calls++;
        const st = r[F.STATUS];
        if (st !== "ok") { w.errors++; w.errN[b]++; w.lastErrBin = b; }
        if (r[F.MS] != null) { w.latSum[b] += r[F.MS]; }
        w.latN[b]++;
        if ((r[F.ATTRS] || {}).replayed) A.cache.hits++;
        flowTo(A, nodeOf(A, "worker:", wn), st === "ok" ? "out:results back" : nodeOf(A, "out:", st));
      }
    } else if (name === "Memory.CacheHit") {
      A.cache.hits++;
    } else if (name === "Memory.CacheMiss") {
      A.cache.misses++;
    } else if (name === "Run.Decode" && phase === "end") {
      if ((r[F.ATTRS] || {}).replayed) A.cache.hits++;
      A.tin += r[F.TIN] || 0; A.tout += r[F.TOUT] || 0; A.cost += r[F.COST] || 0;
      A.tokens[b] += (r[F.TIN] || 0) + (r[F.TOUT] || 0);
    } else if (name.startsWith("Budget.")) {
      const a = r[F.ATTRS] || {}, B = A.budget;
      B.events++;
      if (num(a.run_cap) != null) B.cap = num(a.run_cap);
      if (num(a.run_committed) != null) B.committed = num(a.run_committed);
      if (num(a.run_settled) != null) B.settled = num(a.run_settled);
      if (name === "Budget.Reserve" && a.ok === false) { B.refused++; B.lastRefusal = a.reason || a.refused_by || "refused"; }
      if (name === "Budget.Alert") B.alerts.push(a);
    } else if (name === "Receipt.Emit") {
      const receipt = (r[F.ATTRS] || {}).receipt || {}, R = A.receipts;
      R.count++;
      R.paid += num(receipt.paid) || 0;  // what the reply earned: nothing if judged wrong
      const verdict = String(receipt.verdict || "no verdict");
      R.verdicts.set(verdict, (R.verdicts.get(verdict) || 0) + 1);
      flowTo(A, nodeOf(A, "worker:", r[F.WORKER] || receipt.worker || "?"), "out:receipts");
    } else if (name.startsWith("Verify.")) {
      const V = A.verify, tier = String((r[F.ATTRS] || {}).tier || name.slice(7).toLowerCase());
      V.events++;
      if (r[F.STATUS] === "ok") V.ok++; else V.rejected++;
      V.tiers.set(tier, (V.tiers.get(tier) || 0) + 1);
      if (r[F.PARENT]) V.subqueries.add(r[F.PARENT]);
    }
  }

  const BASE = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: C.fg, size: 10, family: "system-ui, -apple-system, Segoe UI, sans-serif" },
    margin: { l: 40, r: 10, t: 6, b: 26 }, showlegend: false,
    hoverlabel: { bgcolor: "#161b22", bordercolor: "#30363d", font: { color: C.fg } },
  };
  const AXIS = { gridcolor: C.grid, zerolinecolor: C.grid, linecolor: "#30363d", tickfont: { size: 9, color: C.muted } };
  const CONFIG = { displayModeBar: false, responsive: true };

  function layout(extra) {
    return Object.assign({}, BASE, extra);
  }

  function waiting(text) {
    return { text, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { size: 11, color: C.muted } };
  }

  // Latency: dark green (fast) through amber to red (the slowest in view). Errors: a calm
  // slate for none, then amber from the first error to red at all of them.
  const HEAT_LATENCY = [[0, "#0e4429"], [0.5, "#d6a23a"], [1, "#f85149"]];
  const HEAT_ERRORS = [[0, "#253140"], [0.001, "#9e6a03"], [0.3, "#ff8b3d"], [1, "#ff4d4d"]];

  function cursorShape(x) {
    return { type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: { color: C.cursor, width: 1 } };
  }

  class Views {
    constructor(root) {
      this.el = {};
      root.querySelectorAll("[data-view]").forEach((div) => { this.el[div.dataset.view] = div; });
      this.updates = {};
      for (const name of Object.keys(this.el)) this.updates[name] = 0;
      this.busy = false;
      this.again = null;
      this.cost = 0;      // ms the last full render took
      this.timings = {};  // ms per view, of the last render
      this.rendered = 0;
      this.onRendered = null;
    }

    /** Draw the five views from `A`, the page's tally at event index A.n (the one the
        header and the waterfall show). Flow is SVG of the page's own and is drawn at once;
        the four others wait for Plotly, which loads after the page (false: not yet).
        Each view is drawn in an animation frame of its own, so socket messages and input
        are handled between them and each frame paints one chart, not five (five Plotly
        draws and their paint in one go block the page for a fifth of a second on a big
        run). `cost` is what the last full render took, for the caller to space renders by. */
    render(A, cursorT, state) {
      if (!global.Plotly) { this.flow(A); return false; }
      if (this.busy) { this.again = [A, cursorT, state]; return true; }
      this.busy = true;
      this.A = A;
      const k = A.n;
      const xs = [];
      for (let i = 0; i < A.nb; i++) xs.push((i * A.binMs) / 1000);
      const cx = cursorT != null && isFinite(cursorT - A.t0) ? (cursorT - A.t0) / 1000 : null;
      const xEnd = Math.max(0.001, (state.extent || A.nb * A.binMs) / 1000);
      let spent = 0;
      this.timings = {};
      const steps = [
        ["pulse", () => this.pulse(A, xs, cx, xEnd)], ["fill", () => this.fill(A)], ["flow", () => this.flow(A)],
        ["heat", () => this.heat(A, xs, cx, xEnd)], ["topology", () => this.topology(A, state)],
      ];
      const next = () => {
        const step = steps.shift();
        if (!step) {
          this.busy = false;
          this.cost = spent;
          this.rendered++;
          if (this.onRendered) this.onRendered(this.rendered, k);
          if (this.again) { const args = this.again; this.again = null; this.render(...args); }
          return;
        }
        const t = performance.now();
        // One view that fails to draw must not stop the others (nor the clock).
        try { step[1](); } catch (err) { console.error("view " + step[0] + ":", err); }
        if (this.el[step[0]]) this.el[step[0]].dataset.k = String(A.n);
        this.timings[step[0]] = performance.now() - t;
        spent += this.timings[step[0]];
        global.requestAnimationFrame(next);
      };
      global.requestAnimationFrame(next);
      return true;
    }

    _draw(name, data, lay) {
      const div = this.el[name];
      if (!div) return;
      global.Plotly.react(div, data, lay, CONFIG);
      this.updates[name]++;
      div.dataset.updates = this.updates[name];
    }

    pulse(A, xs, cx, xEnd) {
      const perS = 1000 / A.binMs;
      const LINE = "scatter";
      this._draw("pulse", [
        { type: LINE, mode: "lines", name: "dispatched", x: xs, y: A.dispatch.map((v) => v * perS), line: { color: C.amber, width: 1.5 }, hovertemplate: "%{y:.1f}/s dispatched<extra></extra>" },
        { type: LINE, mode: "lines", name: "completed", x: xs, y: A.done.map((v) => v * perS), line: { color: C.ok, width: 1.5 }, hovertemplate: "%{y:.1f}/s completed<extra></extra>" },
        { type: LINE, mode: "lines", name: "failed / cancelled", x: xs, y: A.failed.map((v) => v * perS), line: { color: C.err, width: 1 }, hovertemplate: "%{y:.1f}/s failed or cancelled<extra></extra>" },
        // A filled step line, not bars: one SVG path instead of a rectangle per bin.
        { type: LINE, mode: "lines", name: "tokens", x: xs, y: A.tokens.map((v) => v * perS), yaxis: "y2", line: { color: "rgba(79,179,255,0.5)", width: 0.5, shape: "hv" }, fill: "tozeroy", fillcolor: "rgba(79,179,255,0.22)", hovertemplate: "%{y:.0f} tokens/s<extra></extra>" },
      ], layout({
        margin: { l: 40, r: 46, t: 6, b: 24 },
        xaxis: Object.assign({}, AXIS, { ticksuffix: " s", range: [0, xEnd] }),
        yaxis: Object.assign({}, AXIS, { title: { text: "per s", font: { size: 9 } }, rangemode: "tozero" }),
        yaxis2: Object.assign({}, AXIS, { overlaying: "y", side: "right", showgrid: false, rangemode: "tozero", title: { text: "tokens/s", font: { size: 9 } } }),
        shapes: cx != null ? [cursorShape(cx)] : [],
      }));
    }

    fill(A) {
      const inflight = Math.max(0, A.submitted - A.ok - A.error - A.timeout - A.cancelled);
      // In flight splits into running (a worker started it) and queued (sent to the venue,
      // not started yet): the venue's queue depth.
      const running = new Map();
      for (const w of A.workers.values()) running.set(w.venue, (running.get(w.venue) || 0) + w.inflight);
      const allRunning = Math.min(inflight, [...running.values()].reduce((a, b) => a + b, 0));
      const cats = ["all"];
      const ok = [A.ok], failed = [A.error + A.timeout], cancelled = [A.cancelled];
      const run = [allRunning], queued = [inflight - allRunning];
      for (const [name, v] of A.venues) {
        cats.push(name);
        ok.push(v.ok); failed.push(v.failed); cancelled.push(v.cancelled);
        const r = Math.min(v.inflight, running.get(name) || 0);
        run.push(r); queued.push(v.inflight - r);
      }
      const bar = (name, xs, color) => ({ type: "bar", orientation: "h", name, y: cats, x: xs, marker: { color }, hovertemplate: "%{y}: %{x} " + name + "<extra></extra>" });
      // The budget on its own strip above the fanout, in dollars: settled, reserved and not
      // yet settled, and what is left of the run's cap.
      const B = A.budget;
      const settled = B.settled, reserved = Math.max(0, B.committed - B.settled);
      const money = (name, x, color) => ({ type: "bar", orientation: "h", name, y: ["budget"], x: [x], xaxis: "x2", yaxis: "y2", marker: { color }, hovertemplate: name + " $%{x:.4f}<extra></extra>" });
      const data = [
        bar("ok", ok, C.ok), bar("failed", failed, C.err), bar("cancelled", cancelled, C.cancelled),
        bar("running", run, C.blue), bar("queued", queued, C.purple),
      ];
      // Short lines above the strip (a view is a third of the page wide): amounts, the
      // cap, then what went wrong on a line of its own (on the cap's line it ran off the
      // panel, a review).
      let budgetText;
      if (!B.events) budgetText = "no budget cap";
      else {
        data.push(money("settled", settled, C.gold), money("reserved", reserved, C.goldDim));
        budgetText = `$${fmt$(settled)} settled + $${fmt$(reserved)} reserved<br>`;
        if (B.cap != null) {
          data.push(money("left of the cap", Math.max(0, B.cap - settled - reserved), C.idle));
          budgetText += `of $${fmt$(B.cap)} cap (${Math.round((100 * (settled + reserved)) / Math.max(B.cap, 1e-12))}%)`;
        } else budgetText += "no budget cap";
        const wrong = [];
        if (B.refused) wrong.push(`${B.refused} refused`);
        if (B.alerts.length) wrong.push("alert: " + B.alerts.map((a) => `${esc(a.scope || "?")} at ${Math.round(100 * (num(a.fraction) || 0))}%`).join(", "));
        if (wrong.length) budgetText += "<br>" + wrong.join(" · ");
      }
      this._draw("fill", data, layout({
        barmode: "stack", margin: { l: 48, r: 10, t: 4, b: 22 },
        annotations: [
          {
            text: budgetText, xref: "paper", yref: "paper", x: 0, y: 1, xanchor: "left", yanchor: "top", align: "left", showarrow: false,
            font: { size: 10, color: B.alerts.length || B.refused ? C.err : B.events ? C.gold : C.muted },
          },
          {
            // Top right: below the budget text it sat on the budget's axis (a review).
            text: `${A.ok + A.error + A.timeout + A.cancelled}/${A.submitted} settled<br>tokens ${FRLM.fmtCount(A.tin + A.tout)} · cost $${A.cost.toFixed(4)}`
              + (A.cache.hits + A.cache.misses ? `<br>cache ${A.cache.hits} hit${A.cache.hits === 1 ? "" : "s"}, ${A.cache.misses} miss${A.cache.misses === 1 ? "" : "es"}` : ""),
            xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", yanchor: "top", align: "right", showarrow: false,
            font: { size: 10, color: C.fg },
          },
        ],
        xaxis: Object.assign({}, AXIS, { rangemode: "tozero" }),
        yaxis: Object.assign({}, AXIS, { autorange: "reversed", domain: [0, 0.5] }),
        xaxis2: Object.assign({}, AXIS, { anchor: "y2", rangemode: "tozero", tickprefix: "$", visible: B.events > 0, range: B.cap > 0 ? [0, B.cap] : undefined }),
        yaxis2: Object.assign({}, AXIS, { domain: [0.62, 0.68], visible: B.events > 0 }),
      }));
    }

    /** Flow: where the sub-queries went, as bands from the conductor to the venues, to
        the workers, to what came back. Drawn as SVG by the page (no sankey in the small
        Plotly bundle): each column is stacked top down, a band is as thick as its count,
        and a label is written only where its node is tall enough to hold it, the full
        name and the counts in the node's tooltip. */
    flow(A) {
      const div = this.el.flow;
      if (!div) return;
      const W = Math.max(240, div.clientWidth || 360), H = Math.max(140, div.clientHeight || 220);
      const kindOf = (key) => (key === "conductor" ? "conductor" : key.slice(0, key.indexOf(":")));
      const COL = { conductor: 0, venue: 1, worker: 2, out: 3 };
      const nodes = new Map();
      const node = (key) => {
        let n = nodes.get(key);
        if (!n) {
          const kind = kindOf(key), name = key === "conductor" ? "conductor" : key.slice(key.indexOf(":") + 1);
          n = { key, kind, name, col: COL[kind] != null ? COL[kind] : 3, vin: 0, vout: 0, inOff: 0, outOff: 0 };
          nodes.set(key, n);
        }
        return n;
      };
      const links = [];
      for (const [key, count] of A.flows) {
        const [a, b] = key.split("\u0000");
        const na = node(a), nb = node(b);
        na.vout += count; nb.vin += count;
        links.push({ a: na, b: nb, v: count });
      }
      const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      svg.setAttribute("width", W); svg.setAttribute("height", H);
      svg.setAttribute("class", "flow-svg");
      const mk = (tag, attrs, text) => {
        const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
        for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
        if (text != null) e.textContent = text;
        return e;
      };
      if (!links.length) {
        svg.append(mk("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "flow-wait" }, A.n ? "no sub-query sent yet" : "waiting for the run's first event"));
        div.replaceChildren(svg);
        this.updates.flow++; div.dataset.updates = this.updates.flow;
        return;
      }
      const cols = [[], [], [], []];
      for (const n of nodes.values()) { n.v = Math.max(n.vin, n.vout, 1); cols[n.col].push(n); }
      const ORDER = { "results back": 0, receipts: 1 };
      cols[1].sort((x, y) => FRLM.byText(x.name, y.name));
      cols[2].sort((x, y) => FRLM.byText(x.name, y.name));
      cols[3].sort((x, y) => (ORDER[x.name] ?? 2) - (ORDER[y.name] ?? 2) || FRLM.byText(x.name, y.name));
      const PAD = 4, NODE_W = 8, TOP = 4, LABEL_W = 92;
      const usable = H - 2 * TOP;
      const scale = Math.min(...cols.filter((c) => c.length).map((c) => (usable - PAD * (c.length - 1)) / c.reduce((t, n) => t + n.v, 0)));
      const colX = [4, 4 + (W - LABEL_W - 12) / 3, 4 + (2 * (W - LABEL_W - 12)) / 3, W - LABEL_W - NODE_W];
      cols.forEach((col, c) => {
        const total = col.reduce((t, n) => t + n.v * scale, 0) + PAD * Math.max(0, col.length - 1);
        let y = TOP + Math.max(0, (usable - total) / 2);
        for (const n of col) { n.x = colX[c]; n.y = y; n.h = Math.max(1, n.v * scale); y += n.h + PAD; }
      });
      const COLORS = { conductor: C.purple, venue: C.amber, worker: C.ok };
      const outColor = (name) => (name === "results back" ? C.teal : name === "receipts" ? C.gold : C.err);
      const color = (n) => (n.kind === "out" ? outColor(n.name) : COLORS[n.kind] || C.muted);
      links.sort((x, y) => x.a.y - y.a.y || x.b.y - y.b.y);
      const g = mk("g", { class: "links" });
      for (const l of links) {
        const w = Math.max(1, l.v * scale);
        const y0 = l.a.y + l.a.outOff + w / 2, y1 = l.b.y + l.b.inOff + w / 2;
        l.a.outOff += w; l.b.inOff += w;
        const x0 = l.a.x + NODE_W, x1 = l.b.x, xm = (x0 + x1) / 2;
        const path = mk("path", { d: `M${x0.toFixed(1)},${y0.toFixed(1)}C${xm.toFixed(1)},${y0.toFixed(1)} ${xm.toFixed(1)},${y1.toFixed(1)} ${x1.toFixed(1)},${y1.toFixed(1)}`, stroke: l.b.kind === "out" ? outColor(l.b.name) : "#8b949e", "stroke-width": w.toFixed(1), "stroke-opacity": l.b.kind === "out" ? 0.35 : 0.25, fill: "none" });
        path.append(mk("title", {}, `${l.a.name} → ${l.b.name}: ${FRLM.fmtCount(l.v)}`));
        g.append(path);
      }
      svg.append(g);
      // A node and its label in one group, under one tooltip: the full name and counts.
      for (const n of nodes.values()) {
        const group = mk("g", { class: "node" });
        const shown = n.kind === "worker" ? wname(n.name) : n.name;
        const who = n.kind === "worker" ? `${shown} (${wtitle(n.name)})` : n.name;
        group.append(mk("title", {}, `${n.kind === "out" ? "" : n.kind + " "}${who}: ${FRLM.fmtCount(n.vin)} in · ${FRLM.fmtCount(n.vout)} out`));
        group.append(mk("rect", { x: n.x, y: n.y.toFixed(1), width: NODE_W, height: n.h.toFixed(1), fill: color(n) }));
        svg.append(group);
        if (n.h < 9 && nodes.size > 6) continue;  // too thin to label without overlapping
        const room = n.col === 3 ? LABEL_W - 4 : colX[Math.min(3, n.col + 1)] - n.x - NODE_W - 6;
        const chars = Math.max(3, Math.floor(room / 5.6));
        // Cut in the middle: names of one swarm differ at their end (edge-edge-1 to -4
        // all read "edge-edg…", a review).
        const head = Math.ceil((chars - 1) / 2), tail = chars - 1 - head;
        const text = shown.length > chars ? shown.slice(0, head) + "…" + (tail ? shown.slice(-tail) : "") : shown;
        group.append(mk("text", { x: (n.x + NODE_W + 3).toFixed(1), y: (n.y + n.h / 2).toFixed(1), "dominant-baseline": "middle", class: "flow-label" }, text));
      }
      div.replaceChildren(svg);
      this.updates.flow++;
      div.dataset.updates = this.updates.flow;
    }

    /** Heat: latency (left) and error rate (right) per worker over time, side by side on
        one worker axis. */
    heat(A, xs, cx, xEnd) {
      const names = [...A.workers.keys()].sort((a, b) => FRLM.byText(String(wname(a)), String(wname(b))));
      const shown = names.map((id) => esc(wname(id)));
      const lat = [], err = [];
      for (const name of names) {
        const w = A.workers.get(name);
        lat.push(w.latN.map((n, i) => (n ? w.latSum[i] / n : null)));
        err.push(w.latN.map((n, i) => (n ? w.errN[i] / n : null)));
      }
      if (!names.length) {
        this._draw("heat", [], layout({ xaxis: { visible: false }, yaxis: { visible: false }, annotations: [waiting(A.submitted ? "sub-queries sent, no worker has answered yet" : "no sub-query sent yet")] }));
        return;
      }
      const half = xEnd / 2 > 0 ? [0, xEnd] : undefined;
      this._draw("heat", [
        { type: "heatmap", x: xs, y: shown, z: lat, colorscale: HEAT_LATENCY, zmin: 0, showscale: false, hoverongaps: false, xgap: 1, ygap: 1, hovertemplate: "%{y} at %{x}s: %{z:.0f} ms<extra>latency</extra>" },
        { type: "heatmap", x: xs, y: shown, z: err, xaxis: "x2", colorscale: HEAT_ERRORS, zmin: 0, zmax: 1, showscale: false, hoverongaps: false, xgap: 1, ygap: 1, hovertemplate: "%{y} at %{x}s: %{z:.0%} errors<extra>error rate</extra>" },
      ], layout({
        margin: { l: 86, r: 8, t: 16, b: 24 },
        xaxis: Object.assign({}, AXIS, { ticksuffix: " s", domain: [0, 0.49], range: half, nticks: 4 }),
        xaxis2: Object.assign({}, AXIS, { ticksuffix: " s", domain: [0.51, 1], range: half, nticks: 4, anchor: "y" }),
        yaxis: Object.assign({}, AXIS, { automargin: false }),
        annotations: [
          { text: "latency", xref: "paper", yref: "paper", x: 0, y: 1, xanchor: "left", yanchor: "bottom", yshift: 1, showarrow: false, font: { size: 9, color: C.muted } },
          { text: "error rate", xref: "paper", yref: "paper", x: 0.51, y: 1, xanchor: "left", yanchor: "bottom", yshift: 1, showarrow: false, font: { size: 9, color: C.muted } },
        ],
        shapes: cx != null ? [cursorShape(cx), Object.assign(cursorShape(cx), { xref: "x2" })] : [],
      }));
    }

    topology(A, state) {
      const venues = [...A.venues.keys()].sort();
      for (const w of A.workers.values()) if (w.venue && !A.venues.has(w.venue)) venues.push(w.venue);
      const byVenue = new Map(venues.map((v) => [v, []]));
      for (const [name, w] of A.workers) {
        if (!byVenue.has(w.venue || "?")) byVenue.set(w.venue || "?", []);
        byVenue.get(w.venue || "?").push(name);
      }
      const nodes = [{ id: "conductor", x: 0, y: 0.5, color: state.failed ? C.err : state.done ? C.ok : C.purple, size: 22, text: "conductor", hover: "conductor · " + (state.done ? "done" : "running") }];
      const ex = [], ey = [];
      const vlist = [...byVenue.keys()];
      const total = Math.max(1, [...byVenue.values()].reduce((n, ws) => n + Math.max(1, ws.length), 0));
      let slot = 0;
      vlist.forEach((vn) => {
        const ws = byVenue.get(vn).sort();
        const span = Math.max(1, ws.length);
        const vy = 1 - (slot + span / 2) / total;
        const v = A.venues.get(vn) || { inflight: 0, ok: 0, failed: 0 };
        nodes.push({ id: vn, x: 1, y: vy, color: v.inflight ? C.amber : C.idle, size: 14 + Math.min(20, v.inflight), text: esc(vn), hover: `venue ${esc(vn)} · ${v.inflight} in flight · ${v.ok} ok · ${v.failed} failed` });
        ex.push(0, 1, null); ey.push(0.5, vy, null);
        ws.forEach((wn, j) => {
          const w = A.workers.get(wn);
          const wy = 1 - (slot + j + 0.5) / total;
          const recentErr = A.lastBin - w.lastErrBin <= 2;
          const color = recentErr ? C.err : w.inflight ? C.ok : C.idle;
          nodes.push({ id: wn, x: 2, y: wy, color, size: 10 + Math.min(24, w.inflight * 3), text: esc(wname(wn)), hover: `${esc(wname(wn))} (${esc(wtitle(wn))}) · ${w.inflight} in flight · ${w.calls} done · ${w.errors} errors` });
          ex.push(1, 2, null); ey.push(vy, wy, null);
        });
        slot += span;
      });
      this._draw("topology", [
        { type: "scatter", mode: "lines", x: ex, y: ey, line: { color: "#30363d", width: 1 }, hoverinfo: "skip" },
        {
          type: "scatter", mode: "markers+text", x: nodes.map((n) => n.x), y: nodes.map((n) => n.y),
          text: nodes.map((n) => n.text), textposition: nodes.map((n) => (n.x === 2 ? "middle right" : "top center")),
          textfont: { size: 9, color: C.fg }, hovertext: nodes.map((n) => n.hover), hoverinfo: "text",
          marker: { color: nodes.map((n) => n.color), size: nodes.map((n) => n.size), line: { color: "#0d1117", width: 1 } },
        },
      ], layout({
        margin: { l: 10, r: 10, t: 10, b: 10 },
        xaxis: { visible: false, range: [-0.3, 2.9] }, yaxis: { visible: false, range: [-0.08, 1.08] },
      }));
    }
  }

  FRLM.Views = Views;
  FRLM.aggregate = aggregate;
  FRLM.plotTheme = { BASE, AXIS, CONFIG, C };
})(window);
