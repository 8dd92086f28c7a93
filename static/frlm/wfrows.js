/* FRLM: which rows the waterfall shows. From the trace's rows at the cursor (depth first,
   FRLM.Trace.rows) it makes either
   - the tree, where the sub-queries of one batch (siblings under one parent sharing
     attrs.batch: one llm_query_batched, one fanout) fold into one batch row with a summary
     until it is expanded; or
   - with a search or a filter, only the spans that match, in tree order.
   One pass over the rows: a 10,000-span trace costs about a millisecond. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;
  const BATCH_MIN = 2;  // siblings that make a batch row
  const FAILED = new Set(["error", "timeout", "cancelled", "rejected", "abandoned"]);

  function isClosed(s, k) { return s.i1 >= 0 && s.i1 < k; }
  function duration(s) { return s.ms != null ? s.ms : s.t1 - s.t0; }

  function quantile(sorted, q) {
    if (!sorted.length) return null;
    const at = (sorted.length - 1) * q, lo = Math.floor(at), hi = Math.ceil(at);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo);
  }

  /** p95 of the duration of each span name among spans closed by event k. */
  function p95ByName(source, k) {
    const by = new Map();
    for (const s of source) {
      if (!isClosed(s, k)) continue;
      let list = by.get(s.name);
      if (!list) by.set(s.name, (list = []));
      list.push(duration(s));
    }
    const out = new Map();
    for (const [name, list] of by) out.set(name, quantile(list.sort((a, b) => a - b), 0.95));
    return out;
  }

  /** What a search matches in a span: its name, id, status, venue, worker id and name,
      and its attributes' text. Kept on the span until it ends (its attributes change). */
  function haystack(s) {
    if (s._hay != null && s._hayAt === s.i1) return s._hay;
    const names = FRLM.workers;
    let attrs = "";
    if (s.attrs) { try { attrs = JSON.stringify(s.attrs); } catch (err) { attrs = ""; } }
    s._hay = [s.name, s.id, s.status, s.venue || "", s.worker || "", names ? names.name(s.worker) : "", attrs].join("\u0001").toLowerCase();
    s._hayAt = s.i1;
    return s._hay;
  }

  /** A filter as the toolbar sets it; `active` says whether any part is set. */
  function matcher(f, source, k) {
    const q = (f.text || "").trim().toLowerCase();
    const slow = f.slow ? p95ByName(source, k) : null;
    const test = (s) => {
      const closed = isClosed(s, k);
      const status = closed ? s.status : "open";
      if (f.status && status !== f.status) return false;
      if (f.errors && !(closed && FAILED.has(s.status))) return false;
      if (f.worker && s.worker !== f.worker) return false;
      if (f.venue && s.venue !== f.venue) return false;
      if (slow) {
        const p95 = slow.get(s.name);
        if (!closed || p95 == null || !(duration(s) > p95)) return false;
      }
      if (q && haystack(s).indexOf(q) < 0) return false;
      return true;
    };
    return test;
  }

  function filterActive(f) {
    return !!(f && ((f.text && f.text.trim()) || f.status || f.errors || f.worker || f.venue || f.slow));
  }

  function batchKey(s) {
    if (s.name !== "SubQuery.Submit" || !s.attrs || s.attrs.batch == null) return null;
    return (s.parent || "") + "#" + s.attrs.batch;
  }

  /** The tree with each batch folded (unless its id is in `expanded`). */
  function grouped(source, expanded, batches) {
    const out = [];
    let g = null;
    const close = () => {
      if (!g) return;
      if (g.members.length < BATCH_MIN) { for (const s of g.inside) out.push(s); g = null; return; }
      let b = batches.get(g.key);
      if (!b) {
        b = { batch: true, id: "batch:" + g.key, key: g.key, name: "batch", lvl: g.lvl, members: [], kids: [], parent: g.members[0].parent, number: g.members[0].attrs.batch };
        batches.set(g.key, b);
      }
      b.members = g.members;
      b.kids = g.members;
      b.lvl = g.lvl;
      b.t0 = g.members[0].t0;
      out.push(b);
      if (expanded.has(b.id)) for (const s of g.inside) out.push(s);
      g = null;
    };
    for (const s of source) {
      if (g && s.lvl > g.lvl) { g.inside.push(s); continue; }
      const key = batchKey(s);
      if (g && key === g.key && s.lvl === g.lvl) { g.members.push(s); g.inside.push(s); continue; }
      close();
      if (key != null) { g = { key, lvl: s.lvl, members: [s], inside: [s] }; continue; }
      out.push(s);
    }
    close();
    return out;
  }

  /** The root and the root model's current turn (its latest decode and REPL cell) among
      the shown rows: what the live mode keeps in view. */
  function pinnedOf(rows) {
    let root = null, decode = null, cell = null;
    for (const s of rows) {
      if (s.batch || s.depth !== 0) continue;
      if (!root && !s.parent) root = s;
      else if (s.name === "Run.Decode") decode = s;
      else if (s.name === "Repl.Exec") cell = s;
    }
    return [root, decode, cell].filter(Boolean);
  }

  /** Rows to draw: {rows, pinned, matched (null when no filter), total}. */
  function display(source, k, state) {
    if (filterActive(state.filter)) {
      const test = matcher(state.filter, source, k);
      const rows = source.filter(test);
      return { rows, pinned: pinnedOf(source), matched: rows.length, total: source.length };
    }
    const rows = state.group ? grouped(source, state.expanded, state.batches) : source;
    return { rows, pinned: pinnedOf(source), matched: null, total: source.length };
  }

  /** A batch row's figures at event k: count, done (ok), failed, cut (cancelled by the
      batch's quorum or the run's cancel, not failures: the header counts them apart), open,
      p50/p95 of the finished ones that were sent, what the run paid for them, and the span
      of time they cover. */
  function batchSummary(b, k) {
    let done = 0, failed = 0, cut = 0, open = 0, cost = 0, t1 = -Infinity;
    const ms = [];
    for (const s of b.members) {
      if (s.i0 >= k) continue;
      if (!isClosed(s, k)) { open++; continue; }
      if (s.status === "ok") done++; else if (s.attrs && s.attrs.cut) cut++; else failed++;
      // One never sent took no time: its 0 ms made a budget-stopped batch's p50 0 (a review).
      if (FRLM.placed(s.venue) || s.status === "ok") ms.push(duration(s));
      if (s.t1 > t1) t1 = s.t1;
      // What the run paid for it (its Submit's end), as the header counts: not what its
      // executions claimed, a hedge's loser included.
      cost += s.cost || 0;
    }
    ms.sort((a, x) => a - x);
    const count = done + failed + cut + open;
    return { count, done, failed, cut, open, cost, t1: open ? null : t1, p50: quantile(ms, 0.5), p95: quantile(ms, 0.95) };
  }

  FRLM.WaterfallRows = { display, batchSummary, p95ByName, filterActive, FAILED };
})(window);
