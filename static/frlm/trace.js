/* FRLM: a run's trace in the browser. Events arrive as short arrays (traces/live.py
   WIRE_FIELDS) from the HTTP catch-up and the live socket; `Trace.add` keeps them in seq
   order, drops any seq it already has, and indexes spans as they open and close. Every
   view reads the same `Trace` at the same cursor (an index into `events`). */
(function (global) {
  "use strict";

  const F = {
    SEQ: 0, SPAN: 1, PARENT: 2, NAME: 3, PHASE: 4, T: 5, STATUS: 6, VENUE: 7, WORKER: 8,
    DEPTH: 9, MS: 10, TIN: 11, TOUT: 12, COST: 13, REF: 14, ATTRS: 15, LINKS: 16,
  };

  /** Whether a venue name is a venue: the conductor stamps its own events, a child RLM's
      Submit and a sub-query it never sent (a budget stop, a cancel) "conductor", which the
      views drew as a venue holding hundreds of failures (a review). */
  const placed = (venue) => !!venue && venue !== "conductor";

  class Trace {
    constructor() {
      this.events = [];
      this.tmax = [];          // running maximum of event time: cursor time -> index
      this.lastSeq = 0;
      this.spans = new Map();
      this.roots = [];
      this.orphans = new Map(); // parent id -> spans whose parent has not arrived yet
      this.t0 = Infinity;
      this.t1 = -Infinity;
      this.version = 0;
      this.doneIndex = -1;
      this.turnStarts = [];    // times of the root's turns (Run.Decode at depth 0)
      this.totals = { submitted: 0, settled: 0, failed: 0, turns: 0 };
      this.open = 0;           // spans started and not ended yet
      this.duplicates = 0;
      this.workerIds = new Set();  // every worker and venue named so far (the filters' choices)
      this.venues = new Set();
    }

    /** Append events in seq order; returns how many were new. */
    add(rows) {
      let added = 0;
      for (let n = 0; n < rows.length; n++) {
        const r = rows[n];
        const seq = r[F.SEQ];
        if (seq <= this.lastSeq) { this.duplicates++; continue; }
        this.lastSeq = seq;
        const i = this.events.length;
        this.events.push(r);
        const t = r[F.T];
        if (t < this.t0) this.t0 = t;
        if (t > this.t1) this.t1 = t;
        this.tmax.push(i ? Math.max(this.tmax[i - 1], t) : t);
        this._index(r, i);
        added++;
      }
      if (added) this.version++;
      return added;
    }

    _index(r, i) {
      const phase = r[F.PHASE], name = r[F.NAME];
      const wid = r[F.WORKER], venue = r[F.VENUE];
      if (wid && !this.workerIds.has(wid)) { this.workerIds.add(wid); if (FRLM.workers) FRLM.workers.meet(wid); }
      // "conductor" too: the filter shows the conductor's own spans (root, turns, cells).
      if (venue && !this.venues.has(venue)) this.venues.add(venue);
      if (phase === "progress") return;
      if (phase === "instant") {
        const parent = this.spans.get(r[F.PARENT]);
        if (parent) (parent.marks || (parent.marks = [])).push(i);
        if (name === "Run.Done") this.doneIndex = i;
        return;
      }
      let s = this.spans.get(r[F.SPAN]);
      if (!s) {
        s = {
          id: r[F.SPAN], parent: r[F.PARENT], name, i0: i, t0: r[F.T], i1: -1, t1: null,
          status: "open", venue: r[F.VENUE], worker: r[F.WORKER], depth: r[F.DEPTH],
          ms: null, tin: null, tout: null, cost: null, attrs: r[F.ATTRS] || null,
          kids: [], lvl: 0, marks: null, started: false,
        };
        this.spans.set(s.id, s);
        const parent = s.parent ? this.spans.get(s.parent) : null;
        if (parent) { s.lvl = parent.lvl + 1; parent.kids.push(s); }
        else if (s.parent) {
          const waiting = this.orphans.get(s.parent) || [];
          waiting.push(s);
          this.orphans.set(s.parent, waiting);
        } else this.roots.push(s);
        const adopted = this.orphans.get(s.id);
        if (adopted) {
          this.orphans.delete(s.id);
          for (const kid of adopted) { kid.lvl = s.lvl + 1; s.kids.push(kid); }
        }
        if (name === "SubQuery.Submit" && phase === "start") this.totals.submitted++;
        if (name === "Run.Decode" && s.depth === 0) { this.turnStarts.push(s.t0); this.totals.turns++; }
      }
      if (phase === "start") {
        if (s.i1 < 0 && !s.started) { s.started = true; this.open++; }
        s.i0 = i; s.t0 = r[F.T];
        // A span made from this event holds its attrs already (not copied onto themselves).
        const attrs = r[F.ATTRS];
        if (attrs && attrs !== s.attrs) s.attrs = Object.assign(s.attrs || {}, attrs);
      } else if (phase === "end") {
        if (s.started && s.i1 < 0) this.open--;
        s.i1 = i; s.t1 = r[F.T]; s.status = r[F.STATUS];
        if (r[F.VENUE]) s.venue = r[F.VENUE];
        if (r[F.WORKER]) s.worker = r[F.WORKER];
        s.ms = r[F.MS]; s.tin = r[F.TIN]; s.tout = r[F.TOUT]; s.cost = r[F.COST];
        if (r[F.ATTRS]) s.attrs = Object.assign(s.attrs || {}, r[F.ATTRS]);
        const T = this.totals;
        // One cut off (the batch's quorum, the run's cancel) is not a failure.
        if (name === "SubQuery.Submit") { T.settled++; if (s.status !== "ok" && !(s.attrs && s.attrs.cut)) T.failed++; }
      }
    }

    get empty() { return this.events.length === 0; }
    get done() { return this.doneIndex >= 0; }

    /** How many events have happened by time t (events are in seq order, times nearly so). */
    indexAt(t) {
      const a = this.tmax;
      let lo = 0, hi = a.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (a[mid] <= t) lo = mid + 1; else hi = mid;
      }
      return lo;
    }

    /** Spans started before event index k, depth first, children in start order. */
    rows(k, collapsed) {
      const out = [];
      const stack = [];
      for (let n = this.roots.length - 1; n >= 0; n--) stack.push(this.roots[n]);
      while (stack.length) {
        const s = stack.pop();
        if (s.i0 >= k) continue;
        out.push(s);
        if (collapsed && collapsed.has(s.id)) continue;
        const kids = s.kids;
        for (let n = kids.length - 1; n >= 0; n--) stack.push(kids[n]);
      }
      return out;
    }
  }

  /** One name per worker on the page: the name it registered ("edge-edge-1"), its id on
      hover. The page starts with {id: {name, venue, departed}} (#run-workers, from
      workers.selectors.worker_names); an id met later in a live run is asked of
      /api/worker-names once. `listeners` are told when names arrive (the waterfall and
      the views redraw their labels). */
  class WorkerNames {
    constructor(map, url) {
      this.map = new Map(Object.entries(map || {}));
      this.url = url;
      this.asked = new Set(this.map.keys());
      this.waiting = new Set();
      this.timer = null;
      this.listeners = [];
    }

    /** The registered name, or the id when the worker never registered one here. */
    name(id) { const w = id && this.map.get(id); return w ? w.name : (id || ""); }

    /** The name, marked when the worker has departed (lost or deregistered). */
    label(id) { const w = id && this.map.get(id); return w ? w.name + (w.departed ? " (departed)" : "") : (id || ""); }

    /** What a hover says: the id, and the venue it registered with. */
    title(id) { const w = id && this.map.get(id); return w ? `${id} · venue ${w.venue}${w.departed ? " · departed" : ""}` : (id || ""); }

    departed(id) { const w = id && this.map.get(id); return !!(w && w.departed); }

    meet(id) {
      if (!this.url || this.asked.has(id)) return;
      this.asked.add(id);
      this.waiting.add(id);
      // One request for the ids a burst of events brings, not one per event.
      if (!this.timer) this.timer = setTimeout(() => this._ask(), 150);
    }

    async _ask() {
      this.timer = null;
      const ids = [...this.waiting].slice(0, 200);
      ids.forEach((id) => this.waiting.delete(id));
      if (this.waiting.size) this.timer = setTimeout(() => this._ask(), 150);
      const q = ids.map((id) => "id=" + encodeURIComponent(id)).join("&");
      let data;
      try {
        const r = await fetch(this.url + "?" + q, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!r.ok) return;
        data = await r.json();
      } catch (err) { return; }
      let added = 0;
      for (const [id, w] of Object.entries(data.workers || {})) { this.map.set(id, w); added++; }
      if (added) for (const fn of this.listeners) fn();
    }
  }

  function readWorkers() {
    const el = document.getElementById("run-workers");
    let map = {};
    if (el) { try { map = JSON.parse(el.textContent); } catch (err) { map = {}; } }
    return new WorkerNames(map, el && el.parentElement ? el.parentElement.dataset.namesUrl : null);
  }

  /** A count with thousands separators ("12,345"), as toLocaleString writes it in English,
      and a text order by code point, case folded first. Not the browser's own: the first
      toLocaleString or localeCompare of a page loads ICU's data, 25-45 ms of a cold load
      of the run page before its waterfall showed (bench/ui.py). */
  function fmtCount(n) {
    if (typeof n !== "number" || !Number.isFinite(n)) return String(n);
    const [whole, frac] = String(Math.abs(Math.round(n * 1000) / 1000)).split(".");
    const grouped = whole.length > 3 && !whole.includes("e") ? whole.replace(/\B(?=(\d{3})+$)/g, ",") : whole;
    return (n < 0 ? "-" : "") + grouped + (frac ? "." + frac : "");
  }

  function byText(a, b) {
    const x = a.toLowerCase(), y = b.toLowerCase();
    if (x !== y) return x < y ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }

  global.FRLM = global.FRLM || {};
  const FRLM = global.FRLM;
  FRLM.F = F;
  FRLM.placed = placed;
  FRLM.fmtCount = fmtCount;
  FRLM.byText = byText;
  FRLM.Trace = Trace;
  FRLM.WorkerNames = WorkerNames;
  FRLM.workers = readWorkers();
})(window);
