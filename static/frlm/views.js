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
  const fmt$ = (v) => (v >= 100 ? v.toFixed(2) : v.toFixed(4));
  const STATUS_COLOR = { ok: C.ok, error: C.err, timeout: C.timeout, cancelled: C.cancelled, rejected: C.err, abandoned: C.err };

  const hasWebGL = (function () {
    try {
      const c = document.createElement("canvas");
      return !!(global.WebGLRenderingContext && (c.getContext("webgl") || c.getContext("experimental-webgl")));
    } catch (e) { return false; }
  })();
  // WebGL pays off for thousands of points; a binned series has tens, and SVG draws those
  // several times faster than WebGL set-up (in software rendering, most of all).
  const lineType = (points) => (points > 2000 && hasWebGL ? "scattergl" : "scatter");

  function niceBin(range, target) {
    const raw = Math.max(1, range / target);
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  /** One pass over events [0, k): everything the five views show at that moment. */
  function aggregate(trace, k, extent) {
    const ev = trace.events;
    const t0 = trace.t0;
    const binMs = niceBin(extent, 60);
    const nb = Math.max(1, Math.ceil(extent / binMs) + 1);
    const zeros = () => new Array(nb).fill(0);
    const A = {
      binMs, nb, t0,
      dispatch: zeros(), done: zeros(), failed: zeros(), tokens: zeros(),
      submitted: 0, ok: 0, error: 0, timeout: 0, cancelled: 0, tin: 0, tout: 0, cost: 0,
      venues: new Map(),    // name -> {inflight, ok, failed, cancelled, submitted}
      workers: new Map(),   // name -> {venue, inflight, calls, errors, lat: [], err: [], n: [], lastErrBin}
      flows: new Map(),     // "from\u0000to" -> count
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
    const venue = (name) => {
      let v = A.venues.get(name);
      if (!v) { v = { inflight: 0, ok: 0, failed: 0, cancelled: 0, submitted: 0 }; A.venues.set(name, v); }
      return v;
    };
    const worker = (name, vn) => {
      let w = A.workers.get(name);
      if (!w) {
        w = { venue: vn, inflight: 0, calls: 0, errors: 0, latSum: zeros(), latN: zeros(), errN: zeros(), lastErrBin: -99 };
        A.workers.set(name, w);
      }
      if (vn && !w.venue) w.venue = vn;
      return w;
    };
    const flow = (a, b) => { const key = a + "\u0000" + b; A.flows.set(key, (A.flows.get(key) || 0) + 1); };
    const n = Math.min(k, ev.length);
    for (let i = 0; i < n; i++) {
      const r = ev[i];
      const name = r[F.NAME], phase = r[F.PHASE];
      const b = Math.max(0, Math.min(nb - 1, Math.floor((r[F.T] - t0) / binMs)));
      A.lastBin = b;
      if (name === "SubQuery.Submit") {
        if (phase === "start") {
          const vn = r[F.VENUE] || "?";
          A.submitted++; A.dispatch[b]++;
          A.submitVenue.set(r[F.SPAN], vn);
          const v = venue(vn); v.inflight++; v.submitted++;
          flow("conductor", "venue:" + vn);
        } else if (phase === "end") {
          const st = r[F.STATUS];
          const vn = A.submitVenue.get(r[F.SPAN]) || r[F.VENUE] || "?";
          const v = venue(vn); v.inflight = Math.max(0, v.inflight - 1);
          if (st === "ok") { A.ok++; v.ok++; A.done[b]++; }
          else if (st === "cancelled") { A.cancelled++; v.cancelled++; A.failed[b]++; }
          else { if (st === "timeout") A.timeout++; else A.error++; v.failed++; A.failed[b]++; }
          if (!A.executed.has(r[F.SPAN])) flow("venue:" + vn, "out:not run (" + st + ")");
        }
      } else if (name === "SubQuery.Retry" && phase === "instant") {
        const attrs = r[F.ATTRS] || {};
        if (attrs.venue && attrs.from_venue) {
          const from = venue(attrs.from_venue), to = venue(attrs.venue);
          from.inflight = Math.max(0, from.inflight - 1); to.inflight++;
          A.submitVenue.set(r[F.PARENT], attrs.venue);
          A.dispatch[b]++;
          flow("conductor", "venue:" + attrs.venue);
        }
      } else if (name === "SubQuery.Execute") {
        const wn = r[F.WORKER] || "?";
        const w = worker(wn, r[F.VENUE]);
        if (phase === "start") {
          w.inflight++;
          A.executed.add(r[F.PARENT]);
          flow("venue:" + (r[F.VENUE] || "?"), "worker:" + wn);
        } else if (phase === "end") {
          w.inflight = Math.max(0, w.inflight - 1);
          w.calls++;
          const st = r[F.STATUS];
          if (st !== "ok") { w.errors++; w.errN[b]++; w.lastErrBin = b; }
          if (r[F.MS] != null) { w.latSum[b] += r[F.MS]; }
          w.latN[b]++;
          A.tin += r[F.TIN] || 0; A.tout += r[F.TOUT] || 0; A.cost += r[F.COST] || 0;
          A.tokens[b] += (r[F.TIN] || 0) + (r[F.TOUT] || 0);
          if ((r[F.ATTRS] || {}).replayed) A.cache.hits++;
          flow("worker:" + wn, "out:" + (st === "ok" ? "results back" : st));
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
        flow("worker:" + (r[F.WORKER] || receipt.worker || "?"), "out:receipts");
      } else if (name.startsWith("Verify.")) {
        const V = A.verify, tier = String((r[F.ATTRS] || {}).tier || name.slice(7).toLowerCase());
        V.events++;
        if (r[F.STATUS] === "ok") V.ok++; else V.rejected++;
        V.tiers.set(tier, (V.tiers.get(tier) || 0) + 1);
        if (r[F.PARENT]) V.subqueries.add(r[F.PARENT]);
      }
    }
    return A;
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

    /** Draw the five views at event index k. The aggregation runs now; each view is then
        drawn in an animation frame of its own, so socket messages and input are handled
        between them and each frame paints one chart, not five (five Plotly draws and their
        paint in one go block the page for a fifth of a second on a big run). `cost` is
        what the last full render took, for the caller to space renders by. */
    render(trace, k, cursorT, extent, state) {
      if (!global.Plotly) return false;
      if (this.busy) { this.again = [trace, k, cursorT, extent, state]; return true; }
      this.busy = true;
      const started = performance.now();
      const A = aggregate(trace, k, extent);
      this.A = A;  // the run's figures at k, for the page's summary strip (same clock)
      const xs = [];
      for (let i = 0; i < A.nb; i++) xs.push((i * A.binMs) / 1000);
      const cx = cursorT != null ? (cursorT - trace.t0) / 1000 : null;
      let spent = performance.now() - started;
      this.timings = { aggregate: spent };
      const steps = [
        ["pulse", () => this.pulse(A, xs, cx)], ["fill", () => this.fill(A)], ["flow", () => this.flow(A)],
        ["heat", () => this.heat(A, xs, cx)], ["topology", () => this.topology(A, state)],
      ];
      const next = () => {
        const step = steps.shift();
        if (!step) {
          this.busy = false;
          this.cost = spent;
          this.rendered++;
          if (this.onRendered) this.onRendered(this.rendered);
          if (this.again) { const args = this.again; this.again = null; this.render(...args); }
          return;
        }
        const t = performance.now();
        // One view that fails to draw must not stop the others (nor the clock).
        try { step[1](); } catch (err) { console.error("view " + step[0] + ":", err); }
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

    pulse(A, xs, cx) {
      const perS = 1000 / A.binMs;
      const LINE = lineType(xs.length);
      this._draw("pulse", [
        { type: LINE, mode: "lines", name: "dispatched", x: xs, y: A.dispatch.map((v) => v * perS), line: { color: C.amber, width: 1.5 }, hovertemplate: "%{y:.1f}/s dispatched<extra></extra>" },
        { type: LINE, mode: "lines", name: "completed", x: xs, y: A.done.map((v) => v * perS), line: { color: C.ok, width: 1.5 }, hovertemplate: "%{y:.1f}/s completed<extra></extra>" },
        { type: LINE, mode: "lines", name: "failed / cancelled", x: xs, y: A.failed.map((v) => v * perS), line: { color: C.err, width: 1 }, hovertemplate: "%{y:.1f}/s failed or cancelled<extra></extra>" },
        // A filled step line, not bars: one SVG path instead of a rectangle per bin.
        { type: LINE, mode: "lines", name: "tokens", x: xs, y: A.tokens.map((v) => v * perS), yaxis: "y2", line: { color: "rgba(79,179,255,0.5)", width: 0.5, shape: "hv" }, fill: "tozeroy", fillcolor: "rgba(79,179,255,0.22)", hovertemplate: "%{y:.0f} tokens/s<extra></extra>" },
      ], layout({
        margin: { l: 40, r: 46, t: 6, b: 24 },
        xaxis: Object.assign({}, AXIS, { ticksuffix: " s" }),
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
      // Two short lines above the strip (a view is a third of the page wide): amounts,
      // then the cap and what went wrong.
      let budgetText;
      if (!B.events) budgetText = "no budget cap";
      else {
        data.push(money("settled", settled, C.gold), money("reserved", reserved, C.goldDim));
        budgetText = `$${fmt$(settled)} settled + $${fmt$(reserved)} reserved<br>`;
        if (B.cap != null) {
          data.push(money("left of the cap", Math.max(0, B.cap - settled - reserved), C.idle));
          budgetText += `of $${fmt$(B.cap)} cap (${Math.round((100 * (settled + reserved)) / Math.max(B.cap, 1e-12))}%)`;
        } else budgetText += "no budget cap";
        if (B.refused) budgetText += ` · ${B.refused} refused`;
        if (B.alerts.length) budgetText += " · alert: " + B.alerts.map((a) => `${esc(a.scope || "?")} at ${Math.round(100 * (num(a.fraction) || 0))}%`).join(", ");
      }
      this._draw("fill", data, layout({
        barmode: "stack", margin: { l: 48, r: 10, t: 4, b: 22 },
        annotations: [
          {
            text: budgetText, xref: "paper", yref: "paper", x: 0, y: 1, xanchor: "left", yanchor: "top", align: "left", showarrow: false,
            font: { size: 10, color: B.alerts.length || B.refused ? C.err : B.events ? C.gold : C.muted },
          },
          {
            text: `${A.ok + A.error + A.timeout + A.cancelled}/${A.submitted} settled · tokens ${(A.tin + A.tout).toLocaleString()} · cost $${A.cost.toFixed(4)}`
              + (A.cache.hits + A.cache.misses ? `<br>cache ${A.cache.hits} hit${A.cache.hits === 1 ? "" : "s"}, ${A.cache.misses} miss${A.cache.misses === 1 ? "" : "es"}` : ""),
            xref: "paper", yref: "paper", x: 1, y: 0.57, xanchor: "right", yanchor: "bottom", showarrow: false,
            font: { size: 10, color: C.fg },
          },
        ],
        xaxis: Object.assign({}, AXIS, { rangemode: "tozero" }),
        yaxis: Object.assign({}, AXIS, { autorange: "reversed", domain: [0, 0.55] }),
        xaxis2: Object.assign({}, AXIS, { anchor: "y2", rangemode: "tozero", tickprefix: "$", visible: B.events > 0, range: B.cap != null ? [0, B.cap] : undefined }),
        yaxis2: Object.assign({}, AXIS, { domain: [0.7, 0.8], visible: B.events > 0 }),
      }));
    }

    flow(A) {
      const labels = [], index = new Map(), colors = [];
      const node = (key) => {
        if (!index.has(key)) {
          index.set(key, labels.length);
          const [kind, name] = key.includes(":") ? key.split(/:(.*)/s) : ["conductor", key];
          labels.push(kind === "conductor" ? "conductor" : esc(name));
          colors.push(kind === "venue" ? C.amber : kind === "worker" ? C.ok : kind === "out" ? (name === "results back" ? C.teal : name === "receipts" ? C.gold : C.err) : C.purple);
        }
        return index.get(key);
      };
      const source = [], target = [], value = [], lcolor = [];
      for (const [key, count] of A.flows) {
        const [a, b] = key.split("\u0000");
        source.push(node(a)); target.push(node(b)); value.push(count);
        lcolor.push(b === "out:receipts" ? "rgba(227,179,65,0.30)" : b.startsWith("out:") && b !== "out:results back" ? "rgba(248,81,73,0.35)" : b === "out:results back" ? "rgba(57,197,207,0.30)" : "rgba(139,148,158,0.25)");
      }
      if (!value.length) {
        this._draw("flow", [], layout({ xaxis: { visible: false }, yaxis: { visible: false }, annotations: [waiting("no sub-queries yet")] }));
        return;
      }
      this._draw("flow", [{
        type: "sankey", arrangement: "snap", valueformat: "d",
        node: { label: labels, color: colors, pad: 10, thickness: 10, line: { color: "#0d1117", width: 0.5 } },
        link: { source, target, value, color: lcolor },
      }], layout({ margin: { l: 4, r: 4, t: 6, b: 6 }, font: { color: C.fg, size: 9 } }));
    }

    heat(A, xs, cx) {
      const names = [...A.workers.keys()].sort();
      const shown = names.map(esc);
      const lat = [], err = [];
      for (const name of names) {
        const w = A.workers.get(name);
        lat.push(w.latN.map((n, i) => (n ? w.latSum[i] / n : null)));
        err.push(w.latN.map((n, i) => (n ? w.errN[i] / n : null)));
      }
      if (!names.length) {
        this._draw("heat", [], layout({ xaxis: { visible: false }, yaxis: { visible: false }, annotations: [waiting("no worker has answered yet")] }));
        return;
      }
      this._draw("heat", [
        { type: "heatmap", x: xs, y: shown, z: lat, colorscale: [[0, "#0e4429"], [0.5, "#d6a23a"], [1, "#f85149"]], zmin: 0, showscale: false, hoverongaps: false, xgap: 1, ygap: 1, hovertemplate: "%{y} at %{x}s: %{z:.0f} ms<extra>latency</extra>" },
        { type: "heatmap", x: xs, y: shown, z: err, yaxis: "y2", colorscale: [[0, "#161b22"], [1, "#f85149"]], zmin: 0, zmax: 1, showscale: false, hoverongaps: false, xgap: 1, ygap: 1, hovertemplate: "%{y} at %{x}s: %{z:.0%} errors<extra>error rate</extra>" },
      ], layout({
        margin: { l: 86, r: 8, t: 14, b: 24 },
        xaxis: Object.assign({}, AXIS, { ticksuffix: " s" }),
        yaxis: Object.assign({}, AXIS, { domain: [0.54, 1] }),
        yaxis2: Object.assign({}, AXIS, { domain: [0, 0.46] }),
        annotations: [
          { text: "latency", xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", yanchor: "bottom", showarrow: false, font: { size: 9, color: C.muted } },
          { text: "error rate", xref: "paper", yref: "paper", x: 1, y: 0.46, xanchor: "right", yanchor: "bottom", showarrow: false, font: { size: 9, color: C.muted } },
        ],
        shapes: cx != null ? [cursorShape(cx)] : [],
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
          nodes.push({ id: wn, x: 2, y: wy, color, size: 10 + Math.min(24, w.inflight * 3), text: esc(wn), hover: `${esc(wn)} · ${w.inflight} in flight · ${w.calls} done · ${w.errors} errors` });
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
  FRLM.plotTheme = { BASE, AXIS, CONFIG, C, lineType };
})(window);
