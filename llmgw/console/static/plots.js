// The Plots view (#plots/MODEL): a model over a window of the log, drawn with uPlot (uPlot.iife.min.js,
// MIT, see uPlot.LICENSE): ready and desired replicas, requests/s, requests queued and in flight, time to
// first token p50/p90, the prefix-hit ratio, tokens/s, every owner's GPUs, and the model's tokens/s per owner. The data is the server's
// (/api/plots: recorded from the fold as it follows the log, llmgw/console/series.py), never Prometheus.
// The slider's point is a line across every chart; a click on a chart moves the slider there; a drag
// narrows the window (for the timeline too); "Whole log" widens it again.
"use strict";

const plotsView = (() => {
  const charts = {};  // id -> uPlot: their .data is what is drawn (the tests read it)
  const span = {from: null, to: null};  // the window chosen by a drag (null: the whole log)
  const CHARTS = [
    {id: "replicas", title: "Replicas", series: [["ready", "ready", "#16a34a"], ["desired", "desired", "#6b7280", [6, 4]]]},
    {id: "requests", title: "Requests/s", series: [["requests_s", "requests/s", "#2563eb"]]},
    {id: "queued", title: "Requests queued and in flight", series: [["queued", "queued", "#dc2626"], ["in_flight", "in flight", "#2563eb"]]},
    // (Where nothing was answered these two have a gap, not a zero: a lone bucket is drawn as a dot.)
    {id: "ttft", title: "Time to first token", series: [["ttft_p50", "p50", "#0891b2"], ["ttft_p90", "p90", "#9333ea"]], dots: true,
     values: (u, vals) => vals.map((v) => (v >= 1 ? `${+v.toFixed(2)} s` : `${+(v * 1000).toFixed(1)} ms`))},
    {id: "prefix", title: "Prefix-hit ratio (cached / prompt tokens)", series: [["prefix_hit", "prefix hit", "#d97706"]], dots: true},
    {id: "tokens", title: "Tokens/s", series: [["tokens_in_s", "prompt", "#65a30d"], ["tokens_out_s", "completion", "#db2777"]]},
  ];
  const HEIGHT = 150;

  function windowQuery() {
    return [span.from !== null ? `from=${span.from}` : "", span.to !== null ? `to=${span.to}` : ""].filter(Boolean).join("&");
  }
  function query(model) {
    return [model ? `model=${encodeURIComponent(model)}` : "", windowQuery()].filter(Boolean).join("&");
  }
  function html(data) {
    const figs = CHARTS.map((c) => `<figure class="plot" data-plot="${c.id}"><figcaption>${esc(c.title)}</figcaption><div class="chart"></div></figure>`);
    figs.push(`<figure class="plot" data-plot="owners"><figcaption>GPUs held per owner (the whole fleet)</figcaption><div class="chart"></div></figure>`);
    figs.push(`<figure class="plot" data-plot="usage"><figcaption>Tokens/s per owner (the gateways' usage reports)</figcaption><div class="chart"></div></figure>`);
    const whole = span.from === null && span.to === null;
    return `<h2>Plots${data.model ? ": " + esc(data.model) : ""}</h2>` +
      `<div class="filters"><label>model <select id="p-model">${options(data.models, data.model, data.models.length ? "choose a model" : "no model yet")}</select></label>` +
      `<span class="muted" id="p-window"></span>` +  // (said in draw: the same HTML keeps the charts as the log moves)
      (whole ? `<span class="muted">drag across a chart to look closer; click to travel there</span>` : `<button type="button" id="p-whole">Whole log</button>`) +
      `</div>` + (data.model ? `<div class="plots">${figs.join("")}</div>` : `<p class="muted">No model in the log yet.</p>`);
  }
  function cursorAt(data) {
    return data.past ? data.at : null;
  }
  function options_(c, width, data) {
    return {
      width, height: HEIGHT, legend: {show: true}, cursor: {drag: {x: true, y: false, setScale: false}},
      scales: {x: {time: true}, y: c.id === "prefix" ? {range: [0, 1]} : {range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1]}},
      axes: [{size: 30}, c.values ? {size: 60, values: c.values} : {size: 52}],
      series: [{}, ...c.series.map(([, label, stroke, dash]) => ({label, stroke, width: 1.5, dash, spanGaps: false,
        points: c.dots ? {show: true, size: 5, fill: stroke} : {show: false}}))],
      hooks: {
        draw: [(u) => drawCursor(u)],
        setSelect: [(u) => chose(u)],
      },
    };
  }
  function drawCursor(u) {
    // The slider's point: a line across the chart.
    if (u.llmgwAt === null || u.llmgwAt === undefined) return;
    const x = u.valToPos(u.llmgwAt, "x", true);
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#b45309";
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.restore();
  }
  function chose(u) {
    // A drag: that stretch becomes the window. (A click alone selects nothing: it travels, below.)
    if (u.select.width < 3) return;
    const from = u.posToVal(u.select.left, "x"), to = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
    u.llmgwDragged = true;
    span.from = Math.round(from * 1000) / 1000;
    span.to = Math.round(to * 1000) / 1000;
    render();
  }
  function travel(u) {
    if (u.llmgwDragged) { u.llmgwDragged = false; return; }
    const left = u.cursor.left;
    if (left === undefined || left < 0) return;
    const t = u.posToVal(left, "x");
    $("#atbox").value = when(t);
    setAt({time: Math.round(t * 1000) / 1000});
  }
  function columns(data, c) {
    return [data.x, ...c.series.map(([key]) => data.series[key])];
  }
  function ownerChart(data, id = "owners") {
    const owners = Object.keys(data[id] || {});
    return {id, series: owners.map((o) => [o, o, colour(o)]), owners};
  }
  function draw(data) {
    if (!data.model) return;
    $("#p-window").textContent = `${when(data.from)} to ${when(data.to)}`;
    const defs = [...CHARTS, ownerChart(data), ownerChart(data, "usage")];
    for (const c of defs) {
      const box = document.querySelector(`figure[data-plot="${c.id}"] .chart`);
      if (!box) continue;
      const perOwner = c.id === "owners" || c.id === "usage";
      const cols = perOwner ? [data.x, ...c.owners.map((o) => data[c.id][o])] : columns(data, c);
      let u = charts[c.id];
      const same = u && box.contains(u.root) && (!perOwner || u.series.length === cols.length);
      if (!same) {
        if (u) u.destroy();
        box.textContent = "";
        u = charts[c.id] = new uPlot(options_(c, Math.max(240, box.clientWidth), data), cols, box);
        u.over.addEventListener("click", () => travel(u));
        u.root.dataset.plot = c.id;
      }
      u.llmgwAt = cursorAt(data);
      if (same) u.setData(cols);
      else u.redraw(false);
    }
  }
  document.addEventListener("change", (e) => {
    if (e.target.id === "p-model") location.hash = `#plots/${encodeURIComponent(e.target.value)}`;
  });
  document.addEventListener("click", (e) => {
    if (e.target.id === "p-whole" || e.target.id === "t-whole") { span.from = span.to = null; render(); }
  });
  return {html, draw, query, windowQuery, charts, span};
})();
window.llmgwCharts = plotsView.charts;
