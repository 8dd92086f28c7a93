/* FRLM: the span waterfall, drawn on one canvas. Only the rows in view are drawn (a tall
   empty spacer gives the scrollbar its length), so a trace of 10,000 or 100,000 spans
   costs what its visible 40 rows cost; there is no DOM node per span. Above it a toolbar
   searches and filters the spans and folds batches (static/frlm/wfrows.js says which rows
   show); the root and the current turn stay pinned on top while they are scrolled away. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;

  const COLORS = {
    "Run.Init": "#a371f7", "Run.Decode": "#4fb3ff", "Repl.Exec": "#39c5cf",
    "SubQuery.Submit": "#d6a23a", "SubQuery.Execute": "#3fb950",
  };
  // abandoned: its process died before ending it; whoever noticed closed it.
  const STATUS_COLORS = { error: "#f85149", timeout: "#ff8b3d", cancelled: "#6e7681", rejected: "#f85149", abandoned: "#a0525a" };
  const MARKS = {
    "SubQuery.Cancel": "#8b949e", "SubQuery.Timeout": "#ff8b3d", "SubQuery.Retry": "#d2a8ff",
    "SubQuery.Hedge": "#d2a8ff", "Run.Done": "#e6edf3", "Worker.Lost": "#f85149",
  };

  function colorOf(s) {
    if (s.status && STATUS_COLORS[s.status]) return STATUS_COLORS[s.status];
    return COLORS[s.name] || "#8b949e";
  }

  function fmtMs(ms) {
    if (ms == null) return "–";
    if (ms < 1) return ms.toFixed(2) + " ms";
    if (ms < 1000) return ms.toFixed(0) + " ms";
    return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  }

  function niceStep(range, target) {
    const raw = range / Math.max(1, target);
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  /** A batch's summary in one line: "118 done · 2 failed · 5 cut · 3 open · p50 1.2 s · p95 3.4 s · $0.0123". */
  function batchText(sum) {
    const parts = [FRLM.fmtCount(sum.done) + " done"];
    if (sum.failed) parts.push(FRLM.fmtCount(sum.failed) + " failed");
    if (sum.cut) parts.push(FRLM.fmtCount(sum.cut) + " cut");
    if (sum.open) parts.push(FRLM.fmtCount(sum.open) + " open");
    if (sum.p50 != null) parts.push("p50 " + fmtMs(sum.p50), "p95 " + fmtMs(sum.p95));
    if (sum.cost) parts.push("$" + sum.cost.toFixed(4));
    return parts.join(" · ");
  }

  class Waterfall {
    /** el: an empty element; opts: {rowH, labelW, onSelect(span), onToggle(span), tooltip} */
    constructor(el, opts) {
      this.opts = Object.assign({ rowH: 16, labelW: 280, axisH: 22 }, opts || {});
      this.el = el;
      el.classList.add("wf");
      this.axis = document.createElement("canvas");
      this.axis.className = "wf-axis";
      // Sized before the first draw: a canvas's default 300x150 would stretch to the
      // container's width and take its whole height.
      this.axis.style.height = this.opts.axisH + "px";
      this.scroll = document.createElement("div");
      this.scroll.className = "wf-scroll";
      this.spacer = document.createElement("div");
      this.spacer.className = "wf-spacer";
      this.canvas = document.createElement("canvas");
      this.canvas.className = "wf-canvas";
      this.scroll.appendChild(this.canvas);
      this.scroll.appendChild(this.spacer);
      this.tip = document.createElement("div");
      this.tip.className = "wf-tip";
      this.tip.hidden = true;
      this.source = [];        // the trace's rows at the cursor, as the caller gave them
      this.filter = { text: "", status: "", worker: "", venue: "", errors: false, slow: false };
      this.group = true;       // fold each batch into one row
      this.pin = true;         // keep the root and the current turn in view
      this.expanded = new Set();
      this.batches = new Map();
      this.pinned = [];
      this.matched = null;
      this.tools = this._toolbar();
      el.appendChild(this.tools);
      el.appendChild(this.axis);
      el.appendChild(this.scroll);
      el.appendChild(this.tip);
      this.rows = [];
      this.view = { tStart: 0, tEnd: 1, cursor: null, k: 0, marks: [] };
      this.selected = null;
      this.highlight = null;  // a predicate: spans to ring (the diff's divergence)
      this.zoom = null;       // [tStart, tEnd] chosen by the user, or null to fit
      this.follow = false;    // keep the last rows in view while they grow (a live run)
      // A scroll this waterfall made itself (following the end) has been drawn already.
      this.scroll.addEventListener("scroll", () => { if (this.scroll.scrollTop !== this._drawnTop) this.draw(); }, { passive: true });
      this.canvas.addEventListener("mousemove", (e) => this._hover(e));
      this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
      this.canvas.addEventListener("click", (e) => this._click(e));
      this.canvas.addEventListener("wheel", (e) => this._wheel(e), { passive: false });
      this.canvas.addEventListener("dblclick", () => { this.zoom = null; this.draw(); });
      new ResizeObserver(() => this.draw()).observe(this.scroll);
      if (FRLM.workers) FRLM.workers.listeners.push(() => { this._workerOptions(true); this.draw(); });
    }

    // --- the toolbar: search, filters, batches, pinning ---------------------------------
    _toolbar() {
      const bar = document.createElement("div");
      bar.className = "wf-tools";
      const input = (type, cls, attrs) => {
        const e = document.createElement(type);
        e.className = cls;
        for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
        return e;
      };
      const search = input("input", "wf-search", { type: "search", placeholder: "search: name, worker, venue, id, attribute", "aria-label": "search spans" });
      let typing = null;
      search.addEventListener("input", () => {
        clearTimeout(typing);
        typing = setTimeout(() => this.setFilter({ text: search.value }), 120);
      });
      const select = (cls, label, options) => {
        const e = input("select", cls, { "aria-label": label, title: label });
        for (const [value, text] of options) e.append(new Option(text, value));
        return e;
      };
      const status = select("wf-status", "status", [["", "any status"], ["ok", "ok"], ["open", "open"], ["error", "error"], ["timeout", "timeout"], ["cancelled", "cancelled"], ["rejected", "rejected"], ["abandoned", "abandoned"]]);
      status.addEventListener("change", () => this.setFilter({ status: status.value }));
      this.workerSel = select("wf-worker", "worker", [["", "any worker"]]);
      this.workerSel.addEventListener("change", () => this.setFilter({ worker: this.workerSel.value }));
      this.venueSel = select("wf-venue", "venue", [["", "any venue"]]);
      this.venueSel.addEventListener("change", () => this.setFilter({ venue: this.venueSel.value }));
      const check = (cls, text, title, on, fn) => {
        const label = input("label", "wf-check " + cls, { title });
        const box = input("input", "", { type: "checkbox" });
        box.checked = on;
        box.addEventListener("change", () => fn(box.checked));
        label.append(box, document.createTextNode(text));
        return label;
      };
      const errors = check("wf-errors", "errors", "only spans that failed, timed out, were cancelled, rejected or abandoned", false, (on) => this.setFilter({ errors: on }));
      const slow = check("wf-slow", "> p95", "only spans slower than the 95th percentile of their kind", false, (on) => this.setFilter({ slow: on }));
      const group = check("wf-group", "batches", "fold the sub-queries of one batch into one row", true, (on) => { this.group = on; this._rebuild(); this.draw(); });
      const pin = check("wf-pin", "pin", "keep the root and the current turn on top while rows stream in", true, (on) => { this.pin = on; this.draw(); });
      this.countEl = input("span", "wf-count small muted", { "aria-live": "polite" });
      bar.append(search, status, this.workerSel, this.venueSel, errors, slow, group, pin, this.countEl);
      return bar;
    }

    /** Change part of the filter (keys of this.filter) and show the rows it leaves. */
    setFilter(part) {
      Object.assign(this.filter, part);
      this.scroll.scrollTop = 0;
      this._rebuild();
      this.draw();
    }

    /** The worker and venue choices: every one the trace has named so far, by name. */
    _workerOptions(renamed) {
      const T = this.trace;
      if (!T) return;
      const fill = (sel, values, text, title) => {
        if (!renamed && sel.options.length === values.size + 1) return;
        const current = sel.value;
        const opts = [...values].map((v) => [v, text(v)]).sort((a, b) => FRLM.byText(a[1], b[1]));
        sel.replaceChildren(sel.options[0]);
        for (const [v, t] of opts) { const o = new Option(t, v); if (title) o.title = title(v); sel.append(o); }
        sel.value = current;
      };
      const names = FRLM.workers;
      fill(this.workerSel, T.workerIds, (id) => (names ? names.label(id) : id), (id) => (names ? names.title(id) : id));
      fill(this.venueSel, T.venues, (v) => v);
    }

    _rebuild() {
      const out = FRLM.WaterfallRows.display(this.source, this.view.k, {
        filter: this.filter, group: this.group, expanded: this.expanded, batches: this.batches,
      });
      this.rows = out.rows;
      this.pinned = out.pinned;
      this.matched = out.matched;
      const text = out.matched == null
        ? (out.rows.length === out.total ? "" : `${FRLM.fmtCount(out.rows.length)} rows · ${FRLM.fmtCount(out.total)} spans`)
        : `${FRLM.fmtCount(out.matched)} of ${FRLM.fmtCount(out.total)} spans match`;
      if (this.countEl.textContent !== text) this.countEl.textContent = text;
      this.el.dataset.shown = String(this.rows.length);
    }

    /** Open or fold a batch row. */
    toggleBatch(b) {
      if (this.expanded.has(b.id)) this.expanded.delete(b.id); else this.expanded.add(b.id);
      this._rebuild();
      this.draw();
    }

    /** The name to show for a span's worker (FRLM.workers), or its venue. */
    _who(s) {
      if (s.worker) return FRLM.workers ? FRLM.workers.name(s.worker) : s.worker;
      return s.venue && s.venue !== "conductor" ? s.venue : "";
    }

    /** rows: spans in display order; view: {tStart, tEnd, cursor (time or null), k}.
        `now`: the caller is inside an animation frame, so draw in it rather than the next
        (a frame later is 16 ms more before a live event shows). */
    set(rows, view, now) {
      const k = this.view.k;
      this.view = Object.assign(this.view, view);
      if (rows !== this.source || this.view.k !== k || this._dirty) {
        this.source = rows;
        this._dirty = false;
        this._rebuild();
        this._workerOptions(false);
      }
      if (now) this._draw(); else this.draw();
    }

    _range() {
      return this.zoom || [this.view.tStart, Math.max(this.view.tEnd, this.view.tStart + 1)];
    }

    _sizeCanvas(canvas, w, h) {
      const dpr = global.devicePixelRatio || 1;
      if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
        canvas.width = Math.round(w * dpr);
        canvas.height = Math.round(h * dpr);
        canvas.style.width = w + "px";
        canvas.style.height = h + "px";
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      return ctx;
    }

    x(t, w) {
      const [a, b] = this._range();
      const L = this.opts.labelW + 6, W = w - L - 10;
      return L + ((t - a) / (b - a)) * W;
    }

    draw() {
      if (this._pending) return;
      this._pending = true;
      global.requestAnimationFrame(() => { this._pending = false; this._draw(); });
    }

    drawNow() { this._draw(); }

    _draw() {
      const w = this.scroll.clientWidth, h = this.scroll.clientHeight;
      if (!w || !h) return;
      const { rowH, labelW, axisH } = this.opts;
      const [a, b] = this._range();
      const cursor = this.view.cursor;
      const k = this.view.k;

      // axis
      const ax = this._sizeCanvas(this.axis, w, axisH);
      ax.clearRect(0, 0, w, axisH);
      ax.fillStyle = "#0d1117";
      ax.fillRect(0, 0, w, axisH);
      ax.font = "10px ui-monospace, SFMono-Regular, Menlo, monospace";
      ax.fillStyle = "#7d8896";
      ax.textBaseline = "middle";
      const step = niceStep(b - a, Math.max(2, (w - labelW) / 90));
      const origin = this.view.origin != null ? this.view.origin : this.view.tStart;
      const first = Math.ceil((a - origin) / step) * step + origin;
      ax.strokeStyle = "#2a323c";
      for (let t = first; t <= b; t += step) {
        const x = this.x(t, w);
        ax.beginPath(); ax.moveTo(x + 0.5, axisH - 6); ax.lineTo(x + 0.5, axisH); ax.stroke();
        ax.fillText(fmtMs(t - origin), x + 3, axisH / 2 - 1);
      }
      ax.fillStyle = "#7d8896";
      ax.fillText(FRLM.fmtCount(this.source.length) + " spans" + (this.zoom ? "  · zoomed (double-click: fit)" : ""), 6, axisH / 2);

      // rows in view: the canvas sticks to the top of the scroller; the spacer under it
      // makes up the rest of the rows' height.
      const spacerH = Math.max(0, this.rows.length * rowH - h) + "px";
      // Following the end: a reader scrolled to the last row keeps seeing the newest rows
      // as a live run adds them (as a log tail does); scrolling up stops following.
      const atEnd = this.follow && this.scroll.scrollTop + h >= this.scroll.scrollHeight - rowH;
      if (this.spacer.style.height !== spacerH) {
        this.spacer.style.height = spacerH;
        if (atEnd) this.scroll.scrollTop = this.scroll.scrollHeight;
      }
      const ctx = this._sizeCanvas(this.canvas, w, h);
      ctx.clearRect(0, 0, w, h);
      const top = this.scroll.scrollTop;
      this._drawnTop = top;
      const firstRow = Math.floor(top / rowH);
      const last = Math.min(this.rows.length, firstRow + Math.ceil(h / rowH) + 1);
      ctx.font = "11px system-ui, -apple-system, Segoe UI, sans-serif";
      ctx.textBaseline = "middle";
      // grid lines
      ctx.strokeStyle = "#161b22";
      for (let t = first; t <= b; t += step) {
        const x = Math.round(this.x(t, w)) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, h); ctx.stroke();
      }
      const events = this.view.events;
      const ctxRow = { ctx, w, k, cursor, events, labelW, rowH };
      for (let r = firstRow; r < last; r++) this._row(ctxRow, this.rows[r], r * rowH - top, r);
      // The root and the current turn, when scrolled away above: pinned on top.
      const band = this._band(firstRow);
      this._bandRows = band;
      if (band.length) {
        ctx.fillStyle = "#0d1117";
        ctx.fillRect(0, 0, w, band.length * rowH + 2);
        band.forEach((s, n) => this._row(ctxRow, s, n * rowH, n, true));
        ctx.fillStyle = "#30363d";
        ctx.fillRect(0, band.length * rowH, w, 2);
      }
      // label gutter edge, and the clock's cursor
      ctx.fillStyle = "#1f2933";
      ctx.fillRect(labelW, 0, 1, h);
      const lines = (this.view.marks || []).slice();
      if (cursor != null) lines.push({ t: cursor, color: "#ffd33d" });
      for (const m of lines) {
        const cx = Math.round(this.x(m.t, w)) + 0.5;
        if (cx < labelW) continue;
        ctx.strokeStyle = m.color;
        ctx.beginPath(); ctx.moveTo(cx, 0); ctx.lineTo(cx, h); ctx.stroke();
        ax.strokeStyle = m.color;
        ax.beginPath(); ax.moveTo(cx, 0); ax.lineTo(cx, axisH); ax.stroke();
      }
    }

    /** The pinned rows to draw over the top of the view: those of the root and the
        current turn that are scrolled above the rows the band would leave visible. */
    _band(firstRow) {
      if (!this.pin || !this.pinned.length) return [];
      const index = this._pinIndex || (this._pinIndex = new Map());
      if (this._pinRows !== this.rows) { index.clear(); this._pinRows = this.rows; }
      const above = [];
      for (const s of this.pinned) {
        let r = index.get(s);
        if (r == null) { r = this.rows.indexOf(s); index.set(s, r); }
        if (r >= 0 ? r < firstRow + this.pinned.length : this.matched == null) above.push(s);
      }
      return above.length && firstRow > 0 ? above : [];
    }

    _row(c, s, y, r, pinned) {
      const { ctx, w, k, cursor, events, labelW, rowH } = c;
      if (s.batch) { this._batchRow(c, s, y, r); return; }
      const isOpen = !(s.i1 >= 0 && s.i1 < k);
      if (s === this.selected) {
        ctx.fillStyle = "#1f2a38";
        ctx.fillRect(0, y, w, rowH);
      } else if (pinned) {
        ctx.fillStyle = "#141c26";
        ctx.fillRect(0, y, w, rowH);
      } else if (r % 2) {
        ctx.fillStyle = "#0f141a";
        ctx.fillRect(0, y, w, rowH);
      }
      const hl = this.highlight && this.highlight(s);
      if (hl) {
        ctx.fillStyle = "rgba(255, 166, 0, 0.16)";
        ctx.fillRect(0, y, w, rowH);
      }
      // label (flat when filtered: the matches are listed, not the tree)
      const indent = 6 + (this.matched == null ? Math.min(s.lvl, 12) * 10 : 0);
      ctx.fillStyle = "#59636e";
      if (s.kids.length && this.matched == null) ctx.fillText(this.collapsed && this.collapsed.has(s.id) ? "▸" : "▾", indent - 1, y + rowH / 2);
      ctx.fillStyle = isOpen ? "#e6edf3" : "#c9d1d9";
      const who = this._who(s);
      const label = s.name + (who ? "  " + who : "");
      ctx.save();
      ctx.beginPath(); ctx.rect(0, y, labelW, rowH); ctx.clip();
      ctx.fillText(label, indent + 10, y + rowH / 2);
      ctx.restore();
      // bar
      const color = isOpen ? (COLORS[s.name] || "#8b949e") : colorOf(s);
      const x0 = this.x(s.t0, w);
      const tEnd = isOpen ? (cursor != null ? cursor : this.view.tEnd) : s.t1;
      const x1 = Math.max(x0 + 1.5, this.x(tEnd, w));
      ctx.fillStyle = color;
      ctx.globalAlpha = isOpen ? 0.45 : 0.9;
      ctx.fillRect(x0, y + 3, x1 - x0, rowH - 6);
      ctx.globalAlpha = 1;
      if (isOpen) {
        ctx.fillStyle = color;
        ctx.fillRect(x1 - 2, y + 2, 2, rowH - 4);
      }
      if (hl) {
        ctx.strokeStyle = "#ffa600";
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x0 - 1, y + 2, x1 - x0 + 2, rowH - 4);
        ctx.lineWidth = 1;
      }
      if (x1 - x0 > 60 && !isOpen) {
        ctx.fillStyle = "#0d1117";
        ctx.fillText(fmtMs(s.ms != null ? s.ms : s.t1 - s.t0), x0 + 3, y + rowH / 2);
      } else if (!isOpen || x1 < w - 70) {
        ctx.fillStyle = "#7d8896";
        ctx.fillText(isOpen ? "open" : fmtMs(s.ms != null ? s.ms : s.t1 - s.t0), x1 + 4, y + rowH / 2);
      }
      // instants on the span: cancels, timeouts, retries
      if (s.marks && events) {
        for (const i of s.marks) {
          if (i >= k) break;
          const ev = events[i];
          const mc = MARKS[ev[FRLM.F.NAME]];
          if (!mc) continue;
          const mx = this.x(ev[FRLM.F.T], w);
          ctx.fillStyle = mc;
          ctx.beginPath();
          ctx.moveTo(mx, y + 2); ctx.lineTo(mx + 4, y + rowH / 2); ctx.lineTo(mx, y + rowH - 2); ctx.lineTo(mx - 4, y + rowH / 2);
          ctx.fill();
        }
      }
    }

    /** A folded batch: one bar from its first start to its last end, the share that failed
        in red, and its summary (count, done, failed, p50/p95, cost) as text. */
    _batchRow(c, b, y, r) {
      const { ctx, w, k, cursor, labelW, rowH } = c;
      const sum = FRLM.WaterfallRows.batchSummary(b, k);
      b.summary = sum;
      ctx.fillStyle = b === this.selected ? "#1f2a38" : "#131a22";
      ctx.fillRect(0, y, w, rowH);
      const indent = 6 + Math.min(b.lvl, 12) * 10;
      ctx.fillStyle = "#59636e";
      ctx.fillText(this.expanded.has(b.id) ? "▾" : "▸", indent - 1, y + rowH / 2);
      ctx.fillStyle = "#e6edf3";
      ctx.save();
      ctx.beginPath(); ctx.rect(0, y, labelW, rowH); ctx.clip();
      ctx.fillText(`batch ${b.number} · ${FRLM.fmtCount(sum.count)} sub-queries`, indent + 10, y + rowH / 2);
      ctx.restore();
      const x0 = this.x(b.t0, w);
      const end = sum.t1 != null ? sum.t1 : (cursor != null ? cursor : this.view.tEnd);
      const x1 = Math.max(x0 + 2, this.x(end, w));
      ctx.fillStyle = COLORS["SubQuery.Submit"];
      ctx.globalAlpha = sum.open ? 0.45 : 0.8;
      ctx.fillRect(x0, y + 3, x1 - x0, rowH - 6);
      if (sum.failed && sum.count) {
        ctx.fillStyle = STATUS_COLORS.error;
        ctx.fillRect(x0, y + rowH - 6, (x1 - x0) * (sum.failed / sum.count), 3);
      }
      ctx.globalAlpha = 1;
      const text = batchText(sum);
      const tw = ctx.measureText(text).width;
      ctx.fillStyle = "#c9d1d9";
      ctx.fillText(text, x1 + 4 + tw < w ? x1 + 4 : Math.max(labelW + 8, x0 + 3), y + rowH / 2);
    }

    _rowAt(e) {
      const rect = this.canvas.getBoundingClientRect();
      const y = e.clientY - rect.top, rowH = this.opts.rowH;
      const band = this._bandRows || [];
      if (y < band.length * rowH) return { r: -1, s: band[Math.floor(y / rowH)], x: e.clientX - rect.left };
      const r = Math.floor((y + this.scroll.scrollTop) / rowH);
      return { r, s: this.rows[r], x: e.clientX - rect.left };
    }

    _hover(e) {
      const { s } = this._rowAt(e);
      if (!s) { this.tip.hidden = true; return; }
      const k = this.view.k;
      if (s.batch) { this._tipAt(e, [`batch ${s.number}: ${s.summary ? s.summary.count : s.members.length} sub-queries`, s.summary ? batchText(s.summary) : "", "click to open or fold"]); return; }
      const isOpen = !(s.i1 >= 0 && s.i1 < k);
      const lines = [
        s.name + (isOpen ? " (open)" : " · " + s.status),
        isOpen ? "started +" + fmtMs(s.t0 - this.view.tStart) : fmtMs(s.ms != null ? s.ms : s.t1 - s.t0) + " from +" + fmtMs(s.t0 - this.view.tStart),
      ];
      if (s.worker) lines.push("worker " + this._who(s) + " (" + (FRLM.workers ? FRLM.workers.title(s.worker) : s.worker) + ")");
      if (s.venue) lines.push("venue " + s.venue);
      if (!isOpen && (s.tin || s.tout)) lines.push("tokens " + (s.tin || 0) + " in / " + (s.tout || 0) + " out");
      if (!isOpen && s.cost) lines.push("cost $" + s.cost.toFixed(6));
      if (s.attrs && s.attrs.turn != null) lines.push("turn " + s.attrs.turn + (s.attrs.cell != null ? " cell " + s.attrs.cell : ""));
      this._tipAt(e, lines);
    }

    _tipAt(e, lines) {
      this.tip.textContent = lines.filter(Boolean).join("\n");
      const box = this.el.getBoundingClientRect();
      this.tip.style.left = Math.min(e.clientX - box.left + 14, box.width - 240) + "px";
      this.tip.style.top = (e.clientY - box.top + 14) + "px";
      this.tip.hidden = false;
    }

    _click(e) {
      const { s, x } = this._rowAt(e);
      if (!s) return;
      if (s.batch) {
        this.toggleBatch(s);
        this.selected = s;
        if (this.opts.onSelect) this.opts.onSelect(s);
        return;
      }
      const indent = 6 + Math.min(s.lvl, 12) * 10;
      if (s.kids.length && this.matched == null && x < indent + 9 && this.opts.onToggle) { this.opts.onToggle(s); return; }
      this.selected = s;
      this.draw();
      if (this.opts.onSelect) this.opts.onSelect(s);
    }

    _wheel(e) {
      if (!(e.ctrlKey || e.altKey)) return;  // plain wheel scrolls the rows
      e.preventDefault();
      const w = this.scroll.clientWidth;
      const [a, b] = this._range();
      const rect = this.canvas.getBoundingClientRect();
      const px = e.clientX - rect.left;
      const L = this.opts.labelW + 6, W = w - L - 10;
      const at = a + Math.max(0, Math.min(1, (px - L) / W)) * (b - a);
      const f = e.deltaY > 0 ? 1.25 : 0.8;
      const na = at - (at - a) * f, nb = at + (b - at) * f;
      this.zoom = nb - na >= (this.view.tEnd - this.view.tStart) ? null : [na, nb];
      this.draw();
    }

    /** Scroll so that span s is in view, and select it. */
    reveal(s) {
      let r = this.rows.indexOf(s);
      if (r < 0 && s.parent) {
        // Inside a folded batch: open it.
        for (const b of this.batches.values()) {
          if (b.members.includes(s) || b.members.some((m) => m.kids.includes(s))) this.expanded.add(b.id);
        }
        this._rebuild();
        r = this.rows.indexOf(s);
      }
      if (r < 0) return;
      const h = this.scroll.clientHeight, y = r * this.opts.rowH;
      if (y < this.scroll.scrollTop || y > this.scroll.scrollTop + h - this.opts.rowH) {
        this.scroll.scrollTop = Math.max(0, y - h / 3);
      }
      this.selected = s;
      this.draw();
    }
  }

  FRLM.Waterfall = Waterfall;
  FRLM.fmtMs = fmtMs;
  FRLM.spanColors = COLORS;
})(window);
