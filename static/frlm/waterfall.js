/* FRLM: the span waterfall, drawn on one canvas. Only the rows in view are drawn (a tall
   empty spacer gives the scrollbar its length), so a trace of 10,000 or 100,000 spans
   costs what its visible 40 rows cost; there is no DOM node per span. */
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
    }

    /** rows: spans in display order; view: {tStart, tEnd, cursor (time or null), k}.
        `now`: the caller is inside an animation frame, so draw in it rather than the next
        (a frame later is 16 ms more before a live event shows). */
    set(rows, view, now) {
      this.rows = rows;
      this.view = Object.assign(this.view, view);
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
      ax.fillText(this.rows.length.toLocaleString() + " spans" + (this.zoom ? "  · zoomed (double-click: fit)" : ""), 6, axisH / 2);

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
      for (let r = firstRow; r < last; r++) {
        const s = this.rows[r];
        const y = r * rowH - top;
        const isOpen = !(s.i1 >= 0 && s.i1 < k);
        if (s === this.selected) {
          ctx.fillStyle = "#1f2a38";
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
        // label
        const indent = 6 + Math.min(s.lvl, 12) * 10;
        ctx.fillStyle = "#59636e";
        if (s.kids.length) ctx.fillText(this.collapsed && this.collapsed.has(s.id) ? "▸" : "▾", indent - 1, y + rowH / 2);
        ctx.fillStyle = isOpen ? "#e6edf3" : "#c9d1d9";
        const label = s.name + (s.worker ? "  " + s.worker : s.venue && s.venue !== "conductor" ? "  " + s.venue : "");
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
            const c = MARKS[ev[FRLM.F.NAME]];
            if (!c) continue;
            const mx = this.x(ev[FRLM.F.T], w);
            ctx.fillStyle = c;
            ctx.beginPath();
            ctx.moveTo(mx, y + 2); ctx.lineTo(mx + 4, y + rowH / 2); ctx.lineTo(mx, y + rowH - 2); ctx.lineTo(mx - 4, y + rowH / 2);
            ctx.fill();
          }
        }
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

    _rowAt(e) {
      const rect = this.canvas.getBoundingClientRect();
      const r = Math.floor((e.clientY - rect.top + this.scroll.scrollTop) / this.opts.rowH);
      return { r, s: this.rows[r], x: e.clientX - rect.left };
    }

    _hover(e) {
      const { s } = this._rowAt(e);
      if (!s) { this.tip.hidden = true; return; }
      const k = this.view.k;
      const isOpen = !(s.i1 >= 0 && s.i1 < k);
      const lines = [
        s.name + (isOpen ? " (open)" : " · " + s.status),
        isOpen ? "started +" + fmtMs(s.t0 - this.view.tStart) : fmtMs(s.ms != null ? s.ms : s.t1 - s.t0) + " from +" + fmtMs(s.t0 - this.view.tStart),
      ];
      if (s.venue || s.worker) lines.push([s.venue, s.worker].filter(Boolean).join(" / "));
      if (!isOpen && (s.tin || s.tout)) lines.push("tokens " + (s.tin || 0) + " in / " + (s.tout || 0) + " out");
      if (!isOpen && s.cost) lines.push("cost $" + s.cost.toFixed(6));
      if (s.attrs && s.attrs.turn != null) lines.push("turn " + s.attrs.turn + (s.attrs.cell != null ? " cell " + s.attrs.cell : ""));
      this.tip.textContent = lines.join("\n");
      const box = this.el.getBoundingClientRect();
      this.tip.style.left = Math.min(e.clientX - box.left + 14, box.width - 240) + "px";
      this.tip.style.top = (e.clientY - box.top + 14) + "px";
      this.tip.hidden = false;
    }

    _click(e) {
      const { s, x } = this._rowAt(e);
      if (!s) return;
      const indent = 6 + Math.min(s.lvl, 12) * 10;
      if (s.kids.length && x < indent + 9 && this.opts.onToggle) { this.opts.onToggle(s); return; }
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
      const r = this.rows.indexOf(s);
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
