/* FRLM: the diff page's two waterfalls, on one time axis (milliseconds from each run's
   start), with the first divergence marked on both. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;

  async function load(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    const trace = new FRLM.Trace();
    trace.add((await r.json()).events);
    return trace;
  }

  /** The spans of a condensed diff path ("Run.Init|Repl.Exec[turn=2 cell=2]|SubQuery.Submit[…]"):
      by name, and by turn and cell where the path names them (a prompt template in
      brackets is not checked: every sibling of that name is taken). */
  function spansOfPath(trace, path) {
    let level = trace.roots;
    let found = [];
    for (const part of path) {
      const m = /^([^\[]+)(?:\[(.*)\])?$/.exec(part) || [null, part, ""];
      const name = m[1], want = {};
      for (const kv of (m[2] || "").matchAll(/(turn|cell)=(-?\d+)/g)) want[kv[1]] = Number(kv[2]);
      found = level.filter((s) => s.name === name && Object.entries(want).every(([k, v]) => s.attrs && s.attrs[k] === v));
      level = found.flatMap((s) => s.kids);
    }
    return new Set(found);
  }

  async function boot() {
    const root = document.getElementById("diff-movie");
    if (!root) return;
    const d = root.dataset;
    const [a, b] = await Promise.all([load(d.aUrl), load(d.bUrl)]);
    const span = Math.max(1, a.empty ? 0 : a.t1 - a.t0, b.empty ? 0 : b.t1 - b.t0);
    const path = (d.divPath || "").split("|").filter(Boolean);
    const sides = [[a, "wf-a", d.divA], [b, "wf-b", d.divB]];
    const falls = [];
    for (const [trace, id, div] of sides) {
      const el = document.getElementById(id);
      if (trace.empty) { el.textContent = "No stored events."; continue; }
      const at = div !== undefined && div !== "" ? trace.t0 + Number(div) : null;
      const wf = new FRLM.Waterfall(el, { labelW: 240 });
      // Ring the spans of the node where the runs first diverge.
      const ringed = path.length ? spansOfPath(trace, path) : new Set();
      wf.highlight = ringed.size ? (s) => ringed.has(s) : null;
      el.dataset.ringed = ringed.size;
      wf.set(trace.rows(trace.events.length), {
        tStart: trace.t0, tEnd: trace.t0 + span, cursor: null, k: trace.events.length,
        events: trace.events, origin: trace.t0, marks: at == null ? [] : [{ t: at, color: "#ffa600" }],
      });
      falls.push(wf);
    }
    // One time axis: zooming one zooms both (the same offsets from each start).
    falls.forEach((wf, i) => {
      wf.canvas.addEventListener("wheel", () => {
        const other = falls[1 - i];
        if (!other) return;
        const z = wf.zoom;
        other.zoom = z ? [other.view.tStart + (z[0] - wf.view.tStart), other.view.tStart + (z[1] - wf.view.tStart)] : null;
        other.draw();
      });
    });
    root.dataset.ready = "1";
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})(window);
