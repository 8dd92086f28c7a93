/* FRLM: the run page's execution movie. One clock drives everything: a cursor time, and
   from it k = how many of the trace's events have happened. The waterfall redraws each
   frame the cursor moves; the five Plotly views at most a few times a second.

   Live: the stored events come over HTTP, then a WebSocket sends the rest; on a reconnect
   the socket is opened with ?after_seq=<the last seq this page holds>, the server sends
   what was stored after it and then the live batches, and Trace.add drops any seq it has:
   no gap, no duplicate. */
(function (global) {
  "use strict";
  const FRLM = global.FRLM;
  const F = FRLM.F;
  const VIEW_INTERVAL_MS = 300;
  const LIVE_VIEWS_MIN_MS = 300;
  const LIVE_VIEWS_MAX_MS = 2500;
  // How long after Run.Done the page reads late events while spans are still open.
  const LATE_EVENTS_MAX_MS = 120000;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  const num = (v) => {
    const n = typeof v === "string" && v.trim() !== "" ? Number(v) : v;
    return typeof n === "number" && isFinite(n) ? n : null;
  };

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then((r) => {
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return r.json();
    });
  }

  /** The trace the page's head asked for ({ok, status, text}: templates/runs/run.html), or,
      without one, asked for now. */
  function storedTrace(url, asked) {
    if (!asked) return getJSON(url);
    return asked.then((a) => {
      if (!a.ok) throw new Error(url + ": HTTP " + a.status);
      return JSON.parse(a.text);
    });
  }

  class Movie {
    constructor(root) {
      this.root = root;
      this.d = root.dataset;
      this.trace = new FRLM.Trace();
      this.live = this.d.live === "1";
      this.following = true;     // the cursor follows the newest event (live) or sits at the end
      this.playing = false;
      this.speed = 1;
      this.cursor = null;        // time (epoch ms); null: the end
      this.collapsed = new Set();
      this.offset = Infinity;    // browser clock minus server clock, as seen on arrivals
      this.lastViews = 0;
      this.viewsDirty = true;
      this.stats = { liveBatches: 0, liveEvents: 0, catchUps: 0, reconnects: 0 };
      this.listeners = [];       // functions(rows, receivedAt): for the benchmark
      this.ready = false;

      this.wf = new FRLM.Waterfall(document.getElementById("waterfall"), {
        onSelect: (s) => this.select(s),
        onToggle: (s) => { if (this.collapsed.has(s.id)) this.collapsed.delete(s.id); else this.collapsed.add(s.id); this.frame(true); },
      });
      this.wf.collapsed = this.collapsed;
      this.wf.trace = this.trace;  // its filters list the trace's workers and venues
      this.panel = new FRLM.SpanPanel(document.getElementById("span-detail"), this);
      this.views = new FRLM.Views(root);
      this.A = null;             // the run at the cursor: header, views and turn panel read it
      // The views wait until the stored trace is in and the waterfall painted (start):
      // the first full render after that is when all five show the run (bench/ui.py).
      this.viewsHeld = true;
      this.views.onRendered = (n) => {
        this.root.dataset.viewsDrawn = String(n);
        if (this.root.dataset.viewsReady == null) this.root.dataset.viewsReady = performance.now().toFixed(0);
      };
      this.scrubber = document.getElementById("scrubber");
      this.clock = document.getElementById("clock");
      this.liveBadge = document.getElementById("live-badge");
      this.conn = document.getElementById("conn");
      this.counts = document.getElementById("counts");
      this.wfInfo = document.getElementById("wf-info");
      this.playBtn = root.querySelector("[data-act=play]");
      this._wireTransport();
      // The header is swapped in anew when the run ends (its buttons follow the run: Cancel
      // goes, Replay comes): its figures are filled again from the cursor's state.
      document.body.addEventListener("htmx:afterSwap", () => { this.lastHeader = null; this.updateHeader(); });
      // Names a live run's new workers registered arrive after their events: relabel the views.
      if (FRLM.workers) FRLM.workers.listeners.push(() => { this.viewsDirty = true; this.frame(true); });
      this.turnsTimer = null;
      this.turnsRetries = 0;  // fetches of a stored trace that lagged the live one
    }

    // --- loading ---------------------------------------------------------------------
    async start() {
      try {
        // Asked for by the page's head (templates/runs/run.html) while the scripts loaded.
        const asked = global.FRLM_EVENTS;
        global.FRLM_EVENTS = null;
        const data = await storedTrace(this.d.eventsUrl, asked);
        performance.mark("frlm:trace-parsed");
        this.receive(data.events, false);
        performance.mark("frlm:trace-indexed");
      } catch (err) {
        this.conn.textContent = "could not load the trace: " + err.message;
      }
      this.frame(true);
      performance.mark("frlm:first-frame");
      this.loadTurns();
      if (this.live && !this.trace.done) { this.setLive(true); this.connect(); }
      else {
        const missed = this.live && this.trace.done;  // it ended while the page loaded
        this.setLive(false);
        // A short run that ended while its page was loading is shown moving all the same:
        // played from its start, in at most three seconds.
        if (missed) {
          const extent = this.endTime() - this.trace.t0;
          this.speed = Math.max(1, extent / 3000);
          this.play();
        }
      }
      this.ready = true;
      this.panel.fromAddress();
      this.root.dataset.ready = "1";
      // Drawn and painted, the main thread free: when the page answers input (bench/ui.py).
      // Then the views: Plotly's first draws of a big run take a few frames, which the
      // header and the waterfall do not wait for.
      global.requestAnimationFrame(() => setTimeout(() => {
        this.root.dataset.interactive = performance.now().toFixed(0);
        this.viewsHeld = false;
        this.viewsDirty = true;
        this.frame(true);
        this.awaitPlotly();
      }, 0));
      global.requestAnimationFrame((t) => this.tick(t));
    }

    /** Run Plotly now that the header and the waterfall are on screen, and draw the views
        once it has run. The page's head fetched the bundle once the trace had come
        (templates/runs/run.html); run as soon as it came, it held the main thread for up
        to a second of a cold load on a slow machine, and the waterfall waited for it
        (bench/ui.py). Flow, SVG of the page's own, is drawn without it. */
    awaitPlotly() {
      const link = document.getElementById("plotly-js");
      if (global.Plotly || !link) return;
      const script = document.createElement("script");
      script.src = link.content;
      script.addEventListener("load", () => {
        performance.mark("frlm:plotly-ran");
        this.viewsDirty = true;
        this.frame(true);
      });
      document.head.appendChild(script);
    }

    receive(rows, isLive) {
      const now = Date.now();
      const before = this.trace.lastSeq;
      const added = this.trace.add(rows);
      if (!added) return;
      const newest = this.trace.events[this.trace.events.length - 1][F.T];
      this.offset = Math.min(this.offset, now - newest);
      if (isLive) { this.stats.liveBatches++; this.stats.liveEvents += added; }
      for (const fn of this.listeners) fn(rows, now, before);
      this.viewsDirty = true;
      let turnsChanged = false;
      for (const r of rows) {
        const name = r[F.NAME];
        if ((name === "Repl.Exec" || name === "Run.Decode") && r[F.PHASE] !== "progress") turnsChanged = true;
        if (name === "Run.Done") this.onDone(r);
        if (name === "Env.LoadFragment" && !r[F.DEPTH]) this.onSandbox(r[F.ATTRS] || {});
      }
      if (turnsChanged && this.ready) this.loadTurnsSoon();
      this.root.dataset.lastSeq = this.trace.lastSeq;
      this.root.dataset.events = this.trace.events.length;
    }

    connect() {
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      const url = `${proto}//${location.host}${this.d.wsPath}?after_seq=${this.trace.lastSeq}`;
      const ws = new WebSocket(url);
      this.ws = ws;
      this.setConn("connecting…");
      ws.onopen = () => { this.setConn("live"); this.backoff = 500; };
      ws.onmessage = (msg) => {
        const data = JSON.parse(msg.data);
        if (data.type === "events") this.receive(data.events, !data.catch_up);
        else if (data.type === "caught_up") this.stats.catchUps++;
        this.root.dataset.liveBatches = this.stats.liveBatches;
      };
      ws.onclose = (e) => {
        this.ws = null;
        if (e.code === 4401) { this.setConn("signed out: reload to sign in"); return; }
        if (e.code === 4403) { this.setConn("not allowed to watch this run"); return; }
        if (this.finished) { this.setConn(""); return; }
        this.stats.reconnects++;
        this.setConn("reconnecting…");
        this.backoff = Math.min(5000, (this.backoff || 500) * 1.6);
        setTimeout(() => this.connect(), this.backoff);
      };
    }

    setConn(text) { this.conn.textContent = text; }

    /** The root REPL holds the context: its sandbox is known now (the header, drawn before
        it started, said "not started yet" until the run ended). */
    onSandbox(attrs) {
      const shown = document.getElementById("run-isolation");
      if (shown && attrs.isolation && shown.textContent !== attrs.isolation) {
        shown.textContent = attrs.isolation;
      }
    }

    onDone(r) {
      // The run row is written before Run.Done is emitted: the header can be fetched now.
      if (this.finished) return;
      this.finished = true;
      const attrs = r[F.ATTRS] || {};
      const answer = document.getElementById("run-answer");
      if (answer && attrs.answer) answer.textContent = attrs.answer;
      // A header the server drew for a finished run is already final: fetching it again
      // would swap it under a user who has opened its Replay form (and lose what they
      // typed). Only a header drawn while the run was running is fetched again.
      const header = document.getElementById("run-header");
      const stale = !header || header.dataset.done !== "1";
      setTimeout(() => {
        if (global.htmx && stale) {
          global.htmx.ajax("GET", this.d.headerUrl, { target: "#run-header", swap: "outerHTML" });
        }
        if (this.ws) this.ws.close(1000);
        this.setLive(false);
        this.loadTurns();
        this.collectRest(0);
      }, 400);
    }

    /** After Run.Done the run's last events may still be on their way: its root span's
        end, and the work that ends after the run (a hedge's loser, a cancelled run's jobs
        its workers finish). Read them from the store, as a reload would, until no span is
        left open (the page then ends as a reload draws it, every worker idle), or
        LATE_EVENTS_MAX_MS has passed. `data-complete` is set once the root spans have
        ended. */
    async collectRest(attempt, since = Date.now()) {
      try {
        const url = this.d.eventsUrl + "?after_seq=" + this.trace.lastSeq;
        this.receive((await getJSON(url)).events, false);
      } catch (err) { /* the next attempt tries again */ }
      const T = this.trace;
      const rootsOpen = T.roots.some((s) => s.i1 < 0);
      if (!rootsOpen || attempt >= 10) this.root.dataset.complete = "1";
      if (!T.open || Date.now() - since > LATE_EVENTS_MAX_MS) return;
      const wait = Math.min(300 * (attempt + 1), 3000);
      setTimeout(() => this.collectRest(attempt + 1, since), wait);
    }

    setLive(on) {
      this.live = on;
      this.liveBadge.hidden = !on;
      this.root.classList.toggle("is-live", on);
    }

    // --- the clock -------------------------------------------------------------------
    /** The latest moment of the run: now (server clock) while live, else the last event. */
    endTime() {
      const T = this.trace;
      if (T.empty) return 0;
      if (this.live && isFinite(this.offset)) return Math.max(T.t1, Date.now() - this.offset);
      return T.t1;
    }

    cursorTime() {
      return this.following || this.cursor == null ? this.endTime() : this.cursor;
    }

    seek(t, follow) {
      const T = this.trace;
      if (T.empty) return;
      const end = this.endTime();
      this.cursor = Math.max(T.t0, Math.min(end, t));
      this.following = !!follow || (!this.live && this.cursor >= end);
      if (this.following) this.cursor = null;
      this.viewsDirty = true;
      this.frame(true);
    }

    play() {
      if (this.trace.empty) return;
      if (this.following && !this.live) this.cursor = this.trace.t0;   // replay from the start
      else if (this.following) this.cursor = this.endTime();
      this.following = false;
      this.playing = true;
      this.playBtn.classList.add("on");
      this.root.dataset.playing = "1";
    }

    pause() {
      this.playing = false;
      this.playBtn.classList.remove("on");
      this.root.dataset.playing = "0";
      if (this.following) { this.cursor = this.endTime(); this.following = false; }
      this.frame(true);
    }

    tick(ts) {
      const dt = this.lastTs != null ? Math.min(250, ts - this.lastTs) : 0;
      this.lastTs = ts;
      if (this.playing && !this.following) {
        this.cursor += dt * this.speed;
        const end = this.endTime();
        if (this.cursor >= end) {
          if (this.live) { this.following = true; this.cursor = null; this.playing = false; this.playBtn.classList.remove("on"); }
          else { this.cursor = end; this.pause(); this.following = true; this.cursor = null; }
        }
        this.viewsDirty = true;
      }
      this.frame(false, true);
      global.requestAnimationFrame((t) => this.tick(t));
    }

    /** Draw at the cursor: the waterfall now, the views when due (or `force`).
        `inFrame`: called from an animation frame, where the waterfall is drawn at once. */
    frame(force, inFrame) {
      const T = this.trace;
      const end = this.endTime();
      const t = this.cursorTime();
      const k = this.following ? T.events.length : T.indexAt(t);
      const moving = this.live || this.playing;
      const idle = !moving && k === this.lastK && T.version === this.lastVersion;
      if (!force && idle && !this.viewsDirty) return;
      const rowsChanged = k !== this.lastK || T.version !== this.lastVersion || force;
      const now = performance.now();
      // Following a live run, the waterfall is redrawn in the frame after events come (that
      // is when a user sees them: the target is 100 ms from emission), and 10 times a second
      // when only the open spans grow.
      if (!force && this.live && this.following && !this.playing && !rowsChanged) {
        if (now - (this.lastWfDraw || 0) < 100) return;
      }
      this.lastWfDraw = now;
      this.lastK = k;
      this.lastVersion = T.version;
      if (rowsChanged) this.rows = T.rows(k, this.collapsed);
      const extent = Math.max(1, end - T.t0);
      if (rowsChanged || !this.A) this.A = FRLM.aggregate(T, k, extent, this.A);
      const cursorMark = this.following && !this.live ? null : t;
      this.wf.follow = this.live && this.following;
      this.wf.set(this.rows || [], {
        tStart: T.t0, tEnd: Math.max(end, T.t0 + 1), cursor: cursorMark, k, events: T.events, origin: T.t0,
      }, inFrame);
      if (!T.empty) {
        this.scrubber.max = Math.ceil(extent);
        if (!this.dragging) this.scrubber.value = Math.round(t - T.t0);
        this.setText(this.clock, ((t - T.t0) / 1000).toFixed(3) + " s / " + (extent / 1000).toFixed(3) + " s");
      }
      // Views are redrawn at most every VIEW_INTERVAL_MS, and spaced further on a big run:
      // while live, drawing them takes about a twentieth of the page's time (so fewer than
      // one event in twenty waits behind a chart before it shows), but they are never older
      // than LIVE_VIEWS_MAX_MS.
      const interval = this.live
        ? Math.min(LIVE_VIEWS_MAX_MS, Math.max(LIVE_VIEWS_MIN_MS, 20 * this.views.cost))
        : Math.max(VIEW_INTERVAL_MS, 4 * this.views.cost);
      if (this.viewsDirty && !this.viewsHeld && (force || now - this.lastViews > interval)) {
        this.viewsDirty = false;
        this.lastViews = now;
        const done = T.done && k > T.doneIndex;
        const failed = done && T.events[T.doneIndex][F.STATUS] !== "ok";
        this.A = FRLM.aggregate(T, k, extent, this.A);
        // Plotly still loading: Flow is drawn, the others once it has run (awaitPlotly).
        this.views.render(this.A, this.following ? null : t, { done, failed, extent });
        this.markTurns(t);
      }
      this.updateHeader(t);
      if (rowsChanged) {
        this.setText(this.counts, `${FRLM.fmtCount(T.events.length)} events · ${FRLM.fmtCount(T.spans.size)} spans`);
        this.setText(this.wfInfo, `${FRLM.fmtCount((this.rows || []).length)} shown`);
      }
    }

    /** Write a text only when it changed: each write costs the page a layout. */
    setText(element, text) {
      if (element && element.textContent !== text) element.textContent = text;
    }

    /** The header at the cursor, from the same tally as the views and the same k as the
        waterfall: status, wall so far, sub-queries settled / sent, turns, tokens, cost.
        After Run.Done its own figures (those the run's row holds) are shown. */
    updateHeader(t) {
      const A = this.A;
      if (!A || this.trace.empty) return;
      const T = this.trace;
      const at = t != null ? t : this.cursorTime();
      const D = A.doneAttrs;
      const wallMs = D && num(D.wall_ms) != null ? num(D.wall_ms) : Math.max(0, at - T.t0);
      const tin = D && num(D.tokens_in) != null ? num(D.tokens_in) : A.tin;
      const tout = D && num(D.tokens_out) != null ? num(D.tokens_out) : A.tout;
      const cost = D && num(D.cost) != null ? num(D.cost) : A.cost;
      const settled = A.ok + A.error + A.timeout + A.cancelled;
      // Once done, the run's own counts, as frlm_run and the dashboard say them: a
      // sub-query cut off at the quorum is cancelled by design, not failed.
      const total = D && num(D.subqueries) != null ? num(D.subqueries) : settled;
      const failed = D && num(D.subqueries_failed) != null ? num(D.subqueries_failed) : A.error + A.timeout + A.cancelled;
      const cut = D && num(D.subqueries_cut) != null ? num(D.subqueries_cut) : 0;
      const cancelled = D && num(D.subqueries_cancelled) != null ? num(D.subqueries_cancelled) : 0;
      const notes = [
        failed ? `${FRLM.fmtCount(failed)} failed` : "",
        cut ? `${FRLM.fmtCount(cut)} cut off at the quorum` : "",
        cancelled ? `${FRLM.fmtCount(cancelled)} cancelled with the run` : "",
      ].filter(Boolean);
      const key = [A.n, A.status, Math.round(wallMs / 100)].join("|");
      if (key === this.lastHeader) return;
      this.lastHeader = key;
      const set = (name, text) => this.setText(document.querySelector(`[data-metric=${name}]`), text);
      set("wall", FRLM.fmtMs(wallMs));
      set("subqueries", D ? FRLM.fmtCount(total) + (notes.length ? ` (${notes.join(", ")})` : "") : `${FRLM.fmtCount(settled)}/${FRLM.fmtCount(A.submitted)}`);
      set("turns", FRLM.fmtCount(A.turns));
      set("tokens", `${FRLM.fmtCount(Math.round(tin))} / ${FRLM.fmtCount(Math.round(tout))}`);
      set("cost", "$" + cost.toFixed(4));
      const pill = document.getElementById("run-status");
      if (pill && pill.dataset.status !== A.status) {
        pill.dataset.status = A.status;
        pill.className = "pill st-" + A.status;
        const live = A.status === "running" || A.status === "queued";
        pill.replaceChildren();
        if (live) { const dot = el("i", "dot"); pill.append(dot); }
        pill.append(document.createTextNode(A.status));
      }
      const header = document.getElementById("run-header");
      if (header) {
        header.dataset.k = String(A.n);
        header.dataset.settled = String(settled);
        header.dataset.submitted = String(A.submitted);
      }
      this.updateTrust();
    }

    /** Receipts (count, paid, verdicts) and verification (share of sub-queries checked,
        outcomes, tiers) at the cursor, from the views' last aggregation: live and in
        playback alike. Whatever a worker or conductor wrote goes in as text. */
    updateTrust() {
      const A = this.A;
      if (!A) return;
      const set = (key, text, title) => {
        const e = document.querySelector(`[data-metric=${key}]`);
        this.setText(e, text);
        if (e && title != null && e.title !== title) e.title = title;
      };
      const R = A.receipts, V = A.verify;
      const verdicts = [...R.verdicts].map(([v, n]) => `${n} ${v}`).join(" · ");
      set("receipts", R.count ? FRLM.fmtCount(R.count) : "none");
      const paid = R.count ? `$${R.paid.toFixed(4)} paid${verdicts ? " · " + verdicts : ""}` : "";
      set("receipt-detail", paid, paid);
      if (!V.events) {
        set("verified", "none");
        set("verify-detail", "");
      } else {
        const checked = V.subqueries.size, of = Math.max(A.submitted, checked);
        const tiers = [...V.tiers].map(([t, n]) => `${t} ${n}`).join(", ");
        set("verified", `${Math.round((100 * checked) / Math.max(1, of))}%`, `${checked} of ${of} sub-queries checked`);
        const detail = `${checked}/${of} sub-queries · ${V.ok} ok · ${V.rejected} rejected · ${tiers}`;
        set("verify-detail", detail, detail);
      }
    }

    _wireTransport() {
      const tr = document.getElementById("transport");
      tr.addEventListener("click", (e) => {
        const button = e.target.closest("button[data-act]");
        const act = button && button.dataset.act;
        const T = this.trace;
        if (!act || T.empty) return;
        const t = this.cursorTime();
        if (act === "play") (this.playing ? this.pause() : this.play());
        else if (act === "start") { this.seek(T.t0); }
        else if (act === "end") { this.playing = false; this.playBtn.classList.remove("on"); this.seek(this.endTime(), true); }
        else if (act === "prev") {
          const before = T.turnStarts.filter((s) => s < t - 50);
          this.seek(before.length ? before[before.length - 1] : T.t0);
        } else if (act === "next") {
          const after = T.turnStarts.find((s) => s > t + 1);
          if (after != null) this.seek(after); else this.seek(this.endTime(), true);
        }
      });
      tr.querySelector("[data-act=speed]").addEventListener("change", (e) => { this.speed = Number(e.target.value) || 1; });
      this.scrubber.addEventListener("input", () => {
        this.dragging = true;
        const T = this.trace;
        this.seek(T.t0 + Number(this.scrubber.value), false);
        this.following = false;
        if (this.cursor == null) this.cursor = this.endTime();
      });
      this.scrubber.addEventListener("change", () => { this.dragging = false; this.viewsDirty = true; this.frame(true); });
      document.addEventListener("keydown", (e) => {
        if (e.target.closest("input, select, textarea")) return;
        if (e.key === " ") { e.preventDefault(); (this.playing ? this.pause() : this.play()); }
        else if (e.key === "Home") this.seek(this.trace.t0);
        else if (e.key === "End") this.seek(this.endTime(), true);
      });
    }

    // --- a span's detail: static/frlm/spanpanel.js ---------------------------------
    select(s) { this.panel.show(s); }

    // --- the root model's code per turn ----------------------------------------------
    loadTurnsSoon() {
      clearTimeout(this.turnsTimer);
      this.turnsTimer = setTimeout(() => this.loadTurns(), 500);
    }

    async loadTurns() {
      let data;
      try { data = await getJSON(this.d.turnsUrl); } catch (err) { return; }
      const box = document.getElementById("turns");
      const parts = [];
      for (const turn of data.turns) {
        const sec = el("section", "turn");
        sec.dataset.t = turn.t_ms;
        const h = el("header", "turn-head");
        h.append(el("span", "turn-no", (turn.depth ? "child RLM depth " + turn.depth + " · " : "") + "turn " + turn.turn));
        if (turn.decode) {
          h.append(el("span", "pill st-" + turn.decode.status, turn.decode.status));
          if (turn.decode.ms != null) h.append(el("span", "mono muted", FRLM.fmtMs(turn.decode.ms)));
          if (turn.decode.tokens_in != null) h.append(el("span", "muted small", `${turn.decode.tokens_in} in / ${turn.decode.tokens_out} out tokens`));
        }
        sec.append(h);
        for (const cell of turn.cells) {
          const c = el("div", "cell");
          const ch = el("div", "cell-head");
          ch.append(el("span", "k", "cell " + (cell.cell != null ? cell.cell : "")), el("span", "pill st-" + cell.status, cell.status));
          if (cell.ms != null) ch.append(el("span", "mono muted", FRLM.fmtMs(cell.ms)));
          if (cell.error) ch.append(el("span", "err small", cell.error));
          c.append(ch, el("pre", "code", cell.code && cell.code.text != null ? cell.code.text : ""));
          if (cell.output) c.append(el("pre", "out", cell.output.text != null ? cell.output.text : ""));
          sec.append(c);
        }
        if (turn.decode && turn.decode.reply && turn.decode.reply.text != null) {
          const det = el("details", "reply");
          det.append(el("summary", null, "model reply"), el("pre", "reply-text", turn.decode.reply.text));
          sec.append(det);
        }
        parts.push(sec);
      }
      if (!parts.length) {
        // The stored turns lag the live events a little: say what the trace already shows.
        const T = this.trace, turns = T.totals.turns;
        const cell = T.rows(T.events.length).some((s) => s.name === "Repl.Exec");
        let text = "No root-model turns in this trace.";
        if (this.live && !turns && !cell) text = "The root model has not answered yet.";
        else if (this.live) {
          text = `Turn ${Math.max(1, turns)} is under way: ${cell ? "its code is running" : "the root model is writing"}; it shows here in a moment.`;
          this.loadTurnsSoon();
        }
        parts.push(el("p", "muted", text));
      }
      box.replaceChildren(...parts);
      this.markTurns(this.cursorTime());
      // The stored trace may lag the live one (the recorder writes in batches): while it
      // holds fewer turns or cells than the page has seen, ask again, for a while.
      const T = this.trace;
      const rootTurns = data.turns.filter((t) => !t.depth).length;
      const cellsHere = data.turns.reduce((n, t) => n + t.cells.length, 0);
      const cellsSeen = T.rows(T.events.length).filter((s) => s.name === "Repl.Exec").length;
      if ((rootTurns < T.totals.turns || cellsHere < cellsSeen) && this.turnsRetries++ < 20) {
        this.loadTurnsSoon();
      }
    }

    markTurns(t) {
      document.querySelectorAll("#turns section.turn").forEach((sec) => {
        sec.classList.toggle("future", Number(sec.dataset.t) > t + 0.5);
      });
    }
  }

  function boot() {
    const root = document.getElementById("movie");
    if (!root) return;
    const movie = new Movie(root);
    global.frlmMovie = movie;
    movie.start();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})(window);
