// The decisions as a timeline (#timeline): a lane per model, a mark per replica placed, ready, drained,
// preempted or failed, its reason on hover (and in the box below the lanes, for touch screens); the
// slider's point is a line across the lanes, and a click on a mark moves the slider to that event.
// And each node's page: what its GPUs held, over the same window (/api/gpus/NODE).
// Plain elements positioned in percent of the window: a few thousand marks lay out in milliseconds.
"use strict";

const timelineView = (() => {
  const KIND_COLOUR = {placed: "#2563eb", ready: "#16a34a", drained: "#6b7280", preempted: "#dc2626", failed: "#b45309"};

  function pos(t, data) {
    return Math.min(100, Math.max(0, ((t - data.from) / (data.to - data.from)) * 100)).toFixed(3);
  }
  function cursor(data) {
    return data.past ? `<div class="tl-cursor" style="left:${pos(data.at, data)}%" title="the slider: event ${data.seq}"></div>` : "";
  }
  function axis(data) {
    // The window's times under the lanes: its start, middle and end.
    const ticks = [0, 0.5, 1].map((f) => {
      const t = data.from + f * (data.to - data.from);
      return `<span style="left:${f * 100}%">${esc(when(t).slice(11))}</span>`;
    }).join("");
    return `<div class="tl-lane tl-axis"><div class="tl-name muted">${esc(when(data.from).slice(0, 10))}</div><div class="tl-track">${ticks}</div></div>`;
  }
  function who(m) {
    // "placed chat-3 on gpu-1", or "placed 200 replicas: a-1, a-2, … on n1, n2, …" (a mark is all those of its kind
    // within a thousandth of the window: llmgw/console/series.py).
    const more = (shown, n) => (n > shown.length ? ", …" : "");
    const names = m.replicas.join(", ") + more(m.replicas, m.n);
    const nodes = m.nodes.length ? ` on ${m.nodes.join(", ")}${m.nodes.length >= 8 ? ", …" : ""}` : "";
    return `${m.kind} ${m.n > 1 ? `${m.n} replicas: ` : ""}${names}${nodes}`;
  }
  function html(data) {
    const whole = plotsView.span.from === null && plotsView.span.to === null;
    const legend = Object.entries(KIND_COLOUR).map(([k, c]) => `<span><i style="background:${c}"></i>${k}</span>`).join("");
    const lanes = data.lanes.map((lane) => {
      // (No title per mark: 10,000 of them doubled the page; the box below says it on hover.)
      const marks = lane.marks.map((m, i) => `<span class="tl-mark${m.n > 1 ? " many" : ""}${m.voided.length ? " voided" : ""}" style="left:${pos(m.t, data)}%;` +
        `background:${KIND_COLOUR[m.kind] || "#111827"}" data-kind="${m.kind}" data-seq="${m.seq}" data-n="${m.n}" data-i="${i}"></span>`).join("");
      const cut = lane.groups > lane.marks.length ? ` <span class="muted">(the last ${lane.marks.length} of ${lane.groups})</span>` : "";
      return `<div class="tl-lane" data-lane="${esc(lane.model)}"><div class="tl-name"><a href="#plots/${encodeURIComponent(lane.model)}">${esc(lane.model)}</a>${cut}</div>` +
        `<div class="tl-track">${marks}${cursor(data)}</div></div>`;
    }).join("");
    return `<h2>Timeline: decisions per model</h2><div class="filters"><span class="muted">${esc(when(data.from))} to ${esc(when(data.to))}</span>` +
      (whole ? "" : `<button type="button" id="t-whole">Whole log</button>`) + `</div>` +
      `<div class="legend">${legend}</div><div class="tl">${lanes ? lanes + axis(data) : '<p class="muted">No model in the log yet.</p>'}</div>` +
      (tipSaid ? `<div id="tl-tip" class="tl-tip" data-seq="${tipSaid.seq}">${tipSaid.html}</div>`  // kept as the log moves
        : `<div id="tl-tip" class="tl-tip muted">Point at a mark for what happened and why; click it to travel there.</div>`);
  }
  let shown = null;  // the data drawn: a mark's details are read from it
  let tipSaid = null;  // what the box says of the last mark pointed at: {seq, html}
  function draw(data) { shown = data; }
  function markOf(el) {
    const lane = shown && shown.lanes.find((l) => l.model === el.closest(".tl-lane").dataset.lane);
    return lane ? lane.marks[Number(el.dataset.i)] : null;
  }
  document.addEventListener("mouseover", (e) => {
    const el = e.target.closest && e.target.closest(".tl-mark");
    if (!el || !$("#tl-tip")) return;
    const m = markOf(el);
    if (!m) return;
    const tip = $("#tl-tip");
    tip.className = "tl-tip";
    tip.dataset.seq = m.seq;
    tip.innerHTML = `<b style="color:${KIND_COLOUR[m.kind] || "inherit"}">${esc(m.kind)}</b> ${esc(who(m).slice(m.kind.length + 1))}` +
      ` · ${esc(when(m.t))} · event ${m.seq}` + m.reasons.map((r) => `<div class="tl-reason">${esc(r)}</div>`).join("") +
      m.voided.map((v) => `<div class="voided">voided: ${esc(v)}</div>`).join("");
    tipSaid = {seq: m.seq, html: tip.innerHTML};
  });
  document.addEventListener("click", (e) => {
    const el = e.target.closest && e.target.closest(".tl-mark");
    if (!el) return;
    $("#atbox").value = el.dataset.seq;
    setAt({seq: Number(el.dataset.seq)});
  });

  // ------------------------------------------------------------------ a node's GPUs over time

  let nodeAsked = 0;
  async function node(name) {
    // Added under the node's page (drawn by app.js) once its data comes; kept while the page is.
    const asked = ++nodeAsked;
    let data;
    try {
      data = await api(`gpus/${encodeURIComponent(name)}`, plotsView.windowQuery());
    } catch (e) { return; }
    if (asked !== nodeAsked || $("#main").dataset.view !== "node") return;
    let box = $("#gputimeline");
    if (!box) {
      // Right under its GPUs as they are now (or at the end of the page, if it has none).
      const html = `<h3>What its GPUs held</h3><div id="gputimeline" class="tl"></div>`;
      const gpus = $("#main .gpus");
      if (gpus) gpus.insertAdjacentHTML("afterend", html);
      else $("#main").insertAdjacentHTML("beforeend", html);
      box = $("#gputimeline");
    }
    box.dataset.node = name;
    box.innerHTML = data.gpus.map((g) => `<div class="tl-lane" data-gpu="${g.index}"><div class="tl-name">GPU ${g.index}</div><div class="tl-track">` +
      g.segments.map((s) => `<span class="tl-seg" style="left:${pos(s.from, data)}%;width:${Math.max(0.3, pos(s.to, data) - pos(s.from, data)).toFixed(3)}%;` +
        `background:${colour(s.model)}" data-replica="${esc(s.replica)}" data-model="${esc(s.model)}" data-from="${s.from}" data-to="${s.to}"` +
        ` title="${esc(`${s.replica} (${s.model}) from ${when(s.from)} to ${when(s.to)}`)}"></span>`).join("") +
      `${cursor(data)}</div></div>`).join("") + axis(data);
    // Its first paint, as app.js marks each view's (benchmarks/console.py reads it).
    requestAnimationFrame(() => requestAnimationFrame(() => {
      if (!performance.getEntriesByName("llmgw-painted-node-gpus").length) performance.mark("llmgw-painted-node-gpus");
      box.dataset.painted = "1";
    }));
  }
  return {html, draw, node};
})();
