/* FRLM: the span panel beside the waterfall (as Jaeger, Phoenix and Langfuse show one).
   A click on a span reads /api/runs/<id>/spans/<span> (traces.views.span_detail) and shows
   it as tables: what it is (status, duration, worker by name, venue, tokens, cost), its
   attributes, and for a sub-query its prompt, reply, routing decision, attempts, verdicts
   and receipts, each with a link (#span=<id>&part=<part>) that opens the page on it.
   A folded batch shows its summary. Every text a model, a worker or a user wrote goes in
   with textContent: nothing here is parsed as HTML. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;
  const PARTS = ["prompt", "reply", "routing", "verdicts", "receipt"];
  const NESTED_MAX = 2;  // levels of an attribute's object drawn as tables; deeper is JSON

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function money(v) { return v == null ? null : "$" + Number(v).toFixed(6); }
  function count(v) { return v == null ? null : FRLM.fmtCount(Number(v)); }

  /** An attribute's value: a scalar as text, a small object or list as a nested table,
      anything deeper as wrapped JSON in a box that scrolls (never wider than the panel). */
  /** A worker's id as its registered name, the id on hover (receipts, routing scores). */
  function named(text) {
    const names = FRLM.workers;
    if (!names || !names.map.has(text)) return null;
    const e = el("span", "mono", names.label(text));
    e.title = names.title(text);
    return e;
  }

  function value(v, level) {
    if (v === null || v === undefined) return el("span", "muted", "–");
    if (typeof v === "string") return named(v) || el("span", "mono", v);
    if (typeof v !== "object") return el("span", "mono", String(v));
    const entries = Array.isArray(v) ? v.map((x, i) => [String(i), x]) : Object.entries(v);
    const simple = entries.length <= 12 && entries.every(([, x]) => x === null || typeof x !== "object" || level < NESTED_MAX);
    if (!entries.length) return el("span", "muted", Array.isArray(v) ? "[]" : "{}");
    if (!simple || level >= NESTED_MAX) return el("pre", "json", JSON.stringify(v, null, 2));
    return table(entries, level + 1);
  }

  function table(entries, level) {
    const t = el("table", "kv" + (level ? " nested" : ""));
    const body = el("tbody");
    for (const [k, v] of entries) {
      if (v === null || v === undefined || v === "") continue;
      const tr = el("tr");
      const td = el("td");
      td.append(v instanceof Node ? v : value(v, level || 0));
      const th = el("th");
      th.append(named(k) || document.createTextNode(k));
      tr.append(th, td);
      body.append(tr);
    }
    t.append(body);
    return t;
  }

  class SpanPanel {
    /** box: the panel's section (#span-detail); movie: the FRLM movie (trace, seek, wf). */
    constructor(box, movie) {
      this.box = box;
      this.movie = movie;
      this.body = box.querySelector("#detail-body");
      this.title = box.querySelector(".panel-head .hint");
      const close = box.querySelector("[data-act=close-span]");
      if (close) close.addEventListener("click", () => this.close());
      this.current = null;
    }

    close() {
      this.current = null;
      this.box.classList.remove("open");
      this.movie.root.classList.remove("span-open");
      if (this.movie.wf) { this.movie.wf.selected = null; this.movie.wf.draw(); }
      if (location.hash.startsWith("#span=")) history.replaceState(null, "", location.pathname + location.search);
    }

    _open() {
      this.box.classList.add("open");
      this.movie.root.classList.add("span-open");
    }

    /** Open the span named by the address (#span=<id>&part=<part>), once the trace has it. */
    fromAddress() {
      const m = /^#span=([^&]+)(?:&part=(\w+))?/.exec(location.hash);
      if (!m) return;
      const s = this.movie.trace.spans.get(decodeURIComponent(m[1]));
      if (!s) return;
      this.movie.wf.reveal(s);
      this.show(s, m[2]);
    }

    _seekButton(nav, label, act, t) {
      if (t == null) return;
      const b = el("button", "linkish", label);
      b.type = "button";
      b.dataset.seek = act;
      b.addEventListener("click", () => {
        this.movie.playing = false;
        this.movie.playBtn.classList.remove("on");
        this.movie.seek(t);
      });
      nav.append(b);
    }

    _jumpButton(nav, label, id) {
      const target = this.movie.trace.spans.get(id);
      const b = el("button", "linkish", label);
      b.type = "button";
      b.disabled = !target;
      b.addEventListener("click", () => { if (target) { this.movie.wf.reveal(target); this.show(target); } });
      nav.append(b);
    }

    /** A folded batch: its figures, computed here from the trace. */
    showBatch(b) {
      this._open();
      this.current = b;
      const sum = b.summary || FRLM.WaterfallRows.batchSummary(b, this.movie.trace.events.length);
      const head = el("div", "detail-head");
      head.append(el("span", "span-name", `batch ${b.number}`), el("span", "muted", `${FRLM.fmtCount(sum.count)} sub-queries`));
      const workers = new Map();
      for (const s of b.members) for (const kid of s.kids) if (kid.worker) workers.set(kid.worker, (workers.get(kid.worker) || 0) + 1);
      const names = FRLM.workers;
      const byWorker = [...workers].sort((x, y) => y[1] - x[1]).slice(0, 20).map(([id, n]) => {
        const e = el("span", "mono", `${names ? names.label(id) : id} × ${n}`);
        e.title = names ? names.title(id) : id;
        return e;
      });
      const list = el("div", "who-list");
      list.append(...byWorker);
      const facts = table([
        ["sub-queries", count(sum.count)], ["done", count(sum.done)], ["failed", count(sum.failed)],
        ["cut", sum.cut ? count(sum.cut) : null],
        ["open", count(sum.open)], ["p50", sum.p50 != null ? FRLM.fmtMs(sum.p50) : null],
        ["p95", sum.p95 != null ? FRLM.fmtMs(sum.p95) : null], ["cost", sum.cost ? money(sum.cost) : null],
        ["workers", byWorker.length ? list : null],
      ]);
      this.body.replaceChildren(head, el("p", "small muted", "Click the row's ▸ to list its sub-queries, then one of them for its prompt, reply, routing, verdicts and receipt."), facts);
      this.body.scrollTop = 0;
      this.movie.root.dataset.selected = b.id;
    }

    async show(s, part) {
      if (s.batch) { this.showBatch(s); return; }
      this._open();
      this.current = s;
      this.body.replaceChildren(el("p", "muted", "Loading " + s.name + "…"));
      let d;
      try {
        const url = this.movie.d.spanUrl.replace("__span__", encodeURIComponent(s.id));
        const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!r.ok) throw new Error(`span ${s.id}: HTTP ${r.status}`);
        d = await r.json();
      } catch (err) {
        this.body.replaceChildren(el("p", "err", err.message));
        return;
      }
      if (this.current !== s) return;  // another click came first
      this.body.replaceChildren(...this._render(d));
      this.body.scrollTop = 0;
      this.movie.root.dataset.selected = s.id;
      history.replaceState(null, "", `${location.pathname}${location.search}#span=${encodeURIComponent(s.id)}`);
      if (part) this.goTo(part);
    }

    /** Scroll the panel to one part (prompt, reply, routing, verdicts, receipt). */
    goTo(part) {
      // Within the panel only: the page itself stays where the reader has it.
      const target = this.body.querySelector(`[data-part="${part}"]`);
      if (target) this.body.scrollTop += target.getBoundingClientRect().top - this.body.getBoundingClientRect().top;
    }

    _render(d) {
      const T = this.movie.trace, names = FRLM.workers;
      const head = el("div", "detail-head");
      head.append(el("span", "span-name", d.name), el("span", "pill st-" + d.status, d.status));
      if (d.ms != null) head.append(el("span", "mono", FRLM.fmtMs(d.ms)));
      const nav = el("div", "detail-nav");
      if (d.parent_id) this._jumpButton(nav, "↑ parent", d.parent_id);
      for (const link of d.links || []) this._jumpButton(nav, "→ linked " + link.slice(0, 8), link);
      this._seekButton(nav, "clock to its start", "start", d.start_ms);
      this._seekButton(nav, "clock to its end", "end", d.status !== "open" ? d.end_ms : null);
      const sq = d.subquery;
      const parts = this._parts(d, sq);
      const jumps = el("nav", "part-links");
      jumps.append(el("span", "muted small", "go to"));
      for (const p of PARTS) {
        const a = el("a", "part-link", p);
        a.href = `#span=${encodeURIComponent(d.span_id)}&part=${p}`;
        a.dataset.goto = p;
        if (!parts[p]) { a.classList.add("absent"); a.title = `this span has no ${p}`; }
        a.addEventListener("click", (e) => { e.preventDefault(); history.replaceState(null, "", a.href); this.goTo(p); });
        jumps.append(a);
      }
      // A Submit span carries no tokens or cost itself: its attempts (Execute spans) do.
      const spent = { tin: d.tokens_in, tout: d.tokens_out, cost: d.cost };
      if (sq && d.tokens_in == null && sq.attempts.some((a) => a.tokens_in != null)) {
        spent.tin = spent.tout = spent.cost = 0;
        for (const a of sq.attempts) { spent.tin += a.tokens_in || 0; spent.tout += a.tokens_out || 0; spent.cost += a.cost || 0; }
      }
      const worker = d.worker_id ? el("a", "mono", names ? names.label(d.worker_id) : d.worker_id) : null;
      if (worker) { worker.href = "/workers/" + encodeURIComponent(d.worker_id); worker.title = names ? names.title(d.worker_id) : d.worker_id; }
      const overview = table([
        ["status", d.status],
        ["duration", d.ms != null ? FRLM.fmtMs(d.ms) : (d.end_ms != null && d.start_ms != null ? FRLM.fmtMs(d.end_ms - d.start_ms) : null)],
        ["start", d.start_ms != null ? "+" + FRLM.fmtMs(d.start_ms - T.t0) : null],
        ["worker", worker],
        ["venue", d.venue],
        ["tokens in", count(spent.tin)],
        ["tokens out", count(spent.tout)],
        ["cost", money(spent.cost)],
        ["depth", d.depth],
        ["span", d.span_id],
        ["parent", d.parent_id],
      ]);
      overview.classList.add("overview");
      const out = [head, nav, jumps, overview];
      const attrs = Object.entries(d.attrs || {}).filter(([k, v]) => v !== null && !(sq && k === "routing"));
      if (attrs.length) out.push(this._section("attributes", "Attributes", table(attrs.sort((a, b) => FRLM.byText(a[0], b[0])), 0)));
      for (const p of PARTS) if (parts[p]) out.push(parts[p]);
      if (sq && sq.attempts.length) out.push(this._section("attempts", "Attempts", this._attempts(sq.attempts)));
      if (sq && sq.budget.length) out.push(this._section("budget", "Budget", this._instants(sq.budget)));
      const own = (d.events || []).filter((ev) => !(sq && (ev.name.startsWith("Verify.") || ev.name === "Receipt.Emit" || ev.name.startsWith("Budget."))));
      if (own.length) out.push(this._section("events", "Events on this span", this._instants(own)));
      return out;
    }

    /** The five parts a span links to, where it has them. */
    _parts(d, sq) {
      const parts = {};
      const text = (label, payload, cls) => {
        const box = el("div", "payload");
        const h = el("div", "payload-head");
        h.append(el("span", "muted small", `${FRLM.fmtCount(payload.chars)} chars${payload.truncated ? " (first " + FRLM.fmtCount(payload.text.length) + " shown)" : ""}`));
        box.append(h, el("pre", "payload-text " + cls, payload.text == null ? "(not in the blob store)" : payload.text));
        return box;
      };
      const prompt = sq ? sq.prompt : d.input;
      const reply = sq && sq.reply ? sq.reply : d.output;
      const [inLabel, outLabel] = d.labels || ["input", "output"];
      if (prompt) parts.prompt = this._section("prompt", sq ? "Prompt" : inLabel, text("prompt", prompt, sq ? "prompt" : inLabel));
      if (reply) parts.reply = this._section("reply", sq ? "Reply" : outLabel, text("reply", reply, sq ? "reply" : outLabel));
      if (sq && sq.routing) {
        const r = sq.routing;
        const names = FRLM.workers;
        const decision = r.decision && typeof r.decision === "object" ? Object.entries(r.decision) : [["decision", r.decision]];
        parts.routing = this._section("routing", "Routing decision", table([
          ["route", r.route], ["venue", r.venue],
          ["worker", r.worker_id ? (names ? names.label(r.worker_id) + " (" + r.worker_id + ")" : r.worker_id) : null],
          ...decision,
        ], 0));
      }
      if (sq && sq.verdicts.length) parts.verdicts = this._section("verdicts", "Verdicts", this._instants(sq.verdicts));
      if (sq && sq.receipts.length) {
        const box = el("div");
        for (const rc of sq.receipts) box.append(table(Object.entries(rc.attrs).sort((a, b) => FRLM.byText(a[0], b[0])), 0));
        parts.receipt = this._section("receipt", sq.receipts.length > 1 ? `Receipts (${sq.receipts.length})` : "Receipt", box);
      }
      return parts;
    }

    _section(part, title, content) {
      const sec = el("section", "sp-section");
      sec.dataset.part = part;
      sec.append(el("h3", null, title), content);
      return sec;
    }

    _attempts(rows) {
      const names = FRLM.workers;
      const t = el("table", "grid attempts");
      const head = el("tr");
      for (const h of ["worker", "venue", "status", "time", "tokens", "cost"]) head.append(el("th", null, h));
      const thead = el("thead");
      thead.append(head);
      t.append(thead);
      const body = el("tbody");
      for (const a of rows) {
        const tr = el("tr");
        const who = el("td", "mono", a.worker_id ? (names ? names.label(a.worker_id) : a.worker_id) : "–");
        if (a.worker_id) who.title = names ? names.title(a.worker_id) : a.worker_id;
        const st = el("td");
        st.append(el("span", "pill st-" + a.status, a.status));
        tr.append(who, el("td", null, a.venue || "–"), st, el("td", "mono", a.ms != null ? FRLM.fmtMs(a.ms) : "–"),
          el("td", "mono", a.tokens_in != null ? `${count(a.tokens_in)} / ${count(a.tokens_out)}` : "–"),
          el("td", "mono", a.cost != null ? money(a.cost) : "–"));
        tr.addEventListener("click", () => { const s = this.movie.trace.spans.get(a.span_id); if (s) { this.movie.wf.reveal(s); this.show(s); } });
        body.append(tr);
      }
      t.append(body);
      return t;
    }

    /** Instants (verdicts, budget, retries...): a row each, with its attributes as a table. */
    _instants(list) {
      const names = FRLM.workers, T = this.movie.trace;
      const ul = el("ul", "instants");
      for (const ev of list.slice(0, 100)) {
        const li = el("li");
        const line = el("div", "instant-head");
        line.append(el("span", "mono muted", "+" + FRLM.fmtMs(ev.t_ms - T.t0)), el("span", "pill st-" + ev.status, ev.name));
        if (ev.worker_id) {
          const w = el("span", "mono small", names ? names.label(ev.worker_id) : ev.worker_id);
          w.title = names ? names.title(ev.worker_id) : ev.worker_id;
          line.append(w);
        }
        line.title = "put the clock on this event";
        line.addEventListener("click", () => { this.movie.playing = false; this.movie.playBtn.classList.remove("on"); this.movie.seek(ev.t_ms); });
        li.append(line);
        const attrs = Object.entries(ev.attrs || {}).filter(([, v]) => v !== null);
        if (attrs.length) li.append(table(attrs, 0));
        ul.append(li);
      }
      return ul;
    }
  }

  FRLM.SpanPanel = SpanPanel;
})(window);
