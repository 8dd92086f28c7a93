/* FRLM: latency (p50, p95) and error-rate history per worker, drawn by Plotly from the
   JSON endpoint named by #history's data-src (the venues page: every worker; a worker's
   page: that one). Also shows the .js-time cells in the viewer's clock. */
(function (global) {
  "use strict";

  function localTimes() {
    document.querySelectorAll(".js-time").forEach((td) => {
      const d = new Date(Number(td.dataset.t));
      td.textContent = d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
      td.title = d.toISOString();
    });
  }

  async function drawHistory(div) {
    const data = await (await fetch(div.dataset.src, { credentials: "same-origin" })).json();
    const palette = ["#4fb3ff", "#3fb950", "#d6a23a", "#a371f7", "#39c5cf", "#ff8b3d", "#f778ba", "#8b949e"];
    const traces = [];
    // Plotly reads a few HTML tags in its texts: a worker's id goes in as entities.
    const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    const names = data.names || {};
    Object.entries(data.workers).forEach(([raw, s], i) => {
      // Its registered name (the id on hover), "departed" once it is lost or deregistered.
      const known = names[raw];
      const name = esc(known ? known.name + (known.departed ? " (departed)" : "") : raw);
      const hover = "%{y:.0f} ms · " + esc(raw) + "<extra>" + name + "</extra>";
      const color = palette[i % palette.length];
      const x = s.t_ms.map((t) => new Date(t));
      traces.push({ type: "scatter", mode: "lines+markers", name: name + " p50", x, y: s.p50_ms, line: { color, width: 1.5 }, marker: { size: 6 }, legendgroup: name, hovertemplate: hover });
      traces.push({ type: "scatter", mode: "lines+markers", name: name + " p95", x, y: s.p95_ms, line: { color, width: 1, dash: "dot" }, marker: { size: 5, symbol: "circle-open" }, legendgroup: name, showlegend: false, hovertemplate: hover });
      traces.push({ type: "bar", name: name + " errors", x, y: s.error_rate, yaxis: "y2", marker: { color }, opacity: 0.6, legendgroup: name, showlegend: false });
    });
    const axis = { gridcolor: "#1d242d", zerolinecolor: "#1d242d", tickfont: { size: 9, color: "#7d8896" } };
    // A short history (one run of a few seconds) still gets a readable minute-wide axis.
    const all = traces.flatMap((t) => t.x.map(Number));
    if (!all.length) {
      div.textContent = "No sub-queries in your recent runs yet.";
      div.dataset.ready = "1";
      return;
    }
    let range;
    const lo = Math.min(...all), hi = Math.max(...all);
    if (hi - lo < 60000) range = [new Date(lo - 30000), new Date(hi + 30000)];
    global.Plotly.react(div, traces, {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: "#c9d1d9", size: 10 },
      margin: { l: 50, r: 10, t: 6, b: 30 }, legend: { orientation: "h", y: 1.08, font: { size: 9 } },
      xaxis: Object.assign({}, axis, { type: "date", range }),
      yaxis: Object.assign({}, axis, { domain: [0.34, 1], title: { text: "latency ms", font: { size: 9 } }, rangemode: "tozero" }),
      yaxis2: Object.assign({}, axis, { domain: [0, 0.26], title: { text: "errors", font: { size: 9 } }, tickformat: ".0%", rangemode: "tozero" }),
      barmode: "group",
    }, { displayModeBar: false, responsive: true });
    div.dataset.ready = "1";
  }

  function boot() {
    localTimes();
    const div = document.getElementById("history");
    if (div) drawHistory(div);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})(window);
