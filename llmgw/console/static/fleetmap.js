// The console's Map view (#map, #map/site=par1/rack=r4): a heat map per
// domain, a cell per node coloured by how much of its GPUs is in use (a
// CPU-only node: of its cores), that zooms into a domain on a click. Below
// a few dozen nodes, every node is also shown as a card: its GPUs by model
// and the models that run on its CPU alone.
//
// WHY canvases: 2,000 nodes as elements cost hundreds of milliseconds of
// layout; a domain's cells drawn on one canvas cost a few. The page's HTML
// names the tiles; draw() paints them once the HTML is in place (and again
// on every render: the HTML may be the same while the use changed).
// The data's shape is llmgw/console/fleetmap.py's.
"use strict";

const fleetMap = (() => {
  const CARDS_MAX = 48;      // nodes in view up to which each gets a card (beside the heat maps)
  const GAP = 1;             // pixels between cells
  const FREE = "#e5e7eb", LOST = "#111827", STRAY = "#9ca3af";  // STRAY: a GPU a shard no replica claims holds
  const GPU_LOW = [191, 219, 254], GPU_HIGH = [29, 78, 216];   // a GPU node: 1% used .. all used
  const CPU_LOW = [233, 213, 255], CPU_HIGH = [126, 34, 206];  // a CPU-only node: by its cores
  let shown = null;          // {data, groups: [[node rows]]}: what the canvases show, for hover and click

  function mix(lo, hi, f) {
    return `rgb(${lo.map((v, i) => Math.round(v + (hi[i] - v) * f)).join(",")})`;
  }
  function node(data, row) {
    // [name, place, state, gpus, cpu_used, cpu_cores, mem_used, mem_gb, cpu_models]
    const [name, place, state, gpus, cpuUsed, cpuCores, memUsed, memGb, cpuModels] = row;
    const used = gpus.reduce((s, m) => s + (m !== -1), 0);  // -1 free, -2 a stray's (fleetmap.py)
    return {name, loc: data.places[place], state: data.states[state], gpus, used, cpuUsed, cpuCores, memUsed, memGb, cpuModels};
  }
  function fill(n) {
    if (n.state === "lost") return LOST;
    if (n.gpus.length) return n.used ? mix(GPU_LOW, GPU_HIGH, n.used / n.gpus.length) : FREE;
    return n.cpuUsed && n.cpuCores ? mix(CPU_LOW, CPU_HIGH, Math.min(1, n.cpuUsed / n.cpuCores)) : FREE;
  }
  function parseZoom(param) {
    // "site=par1/rack=r4" -> [["site", "par1"], ["rack", "r4"]]
    return (param || "").split("/").filter(Boolean).map((p) => {
      const i = p.indexOf("=");
      return [p.slice(0, i), decodeURIComponent(p.slice(i + 1))];
    }).filter(([k]) => KINDS.includes(k));
  }
  function zoomHash(pairs) {
    return "#map" + pairs.map(([k, v]) => `/${k}=${encodeURIComponent(v)}`).join("");
  }
  function words(n, data) {
    // A node's cell in words (its title): use, and the models on it.
    const count = {};
    for (const m of n.gpus) if (m >= 0) count[data.models[m]] = (count[data.models[m]] || 0) + 1;
    const on = Object.entries(count).map(([m, c]) => `${m} ×${c}`).concat(n.cpuModels.map((m) => `${data.models[m]} (CPU)`));
    return `${n.name}${n.state !== "ready" ? " (" + n.state + ")" : ""}: ` +
      (n.gpus.length ? `GPUs ${n.used}/${n.gpus.length}` : "no GPU") + ` · cpu ${n.cpuUsed}/${n.cpuCores}` +
      ` · mem ${gb(n.memUsed)}/${gb(n.memGb)}G` + (on.length ? ` · ${on.join(", ")}` : "");
  }
  function totals(nodes) {
    const t = {nodes: nodes.length, gpus: 0, used: 0, cpu: 0, cpuUsed: 0, cpuOnly: 0, lost: 0};
    for (const n of nodes) {
      t.gpus += n.gpus.length; t.used += n.used; t.cpu += n.cpuCores; t.cpuUsed += n.cpuUsed;
      t.cpuOnly += !n.gpus.length; t.lost += n.state === "lost";
    }
    return t;
  }
  function said(t) {
    const pct = t.gpus ? ` (${Math.round((100 * t.used) / t.gpus)}%)` : "";
    return `${t.nodes} node(s) · GPUs ${t.used}/${t.gpus}${pct} · cpu ${t.cpuUsed}/${t.cpu}` +
      (t.cpuOnly ? ` · ${t.cpuOnly} CPU-only` : "") + (t.lost ? ` · <span class="fm-lost">${t.lost} lost</span>` : "");
  }
  function card(n, data) {
    const gpus = n.gpus.map((m, i) => `<i style="background:${m >= 0 ? colour(data.models[m]) : m === -1 ? FREE : STRAY}" ` +
      `title="GPU ${i}: ${esc(m >= 0 ? data.models[m] : m === -1 ? "free" : "a shard no replica claims")}"></i>`).join("");
    const on = {};
    for (const m of n.gpus) if (m >= 0) on[data.models[m]] = (on[data.models[m]] || 0) + 1;
    const models = Object.entries(on).map(([m, c]) => `<span class="fm-model" data-model="${esc(m)}"><i style="background:${colour(m)}"></i>${esc(m)} ×${c} GPU</span>`)
      .concat(n.cpuModels.map((i) => data.models[i]).map((m) => `<span class="fm-model fm-cpu-model" data-model="${esc(m)}"><i style="background:${colour(m)}"></i>${esc(m)} (CPU)</span>`));
    return `<div class="fm-card${n.state === "lost" ? " lost" : ""}" data-node="${esc(n.name)}" data-gpus-used="${n.used}" data-gpus="${n.gpus.length}">` +
      `<a href="#node/${encodeURIComponent(n.name)}">${esc(n.name)}</a>` +
      (n.gpus.length ? `<span class="fm-gpus">${gpus}</span>` : `<span class="fm-nogpu">no GPU</span>`) +
      `<span class="fm-res">cpu ${n.cpuUsed}/${n.cpuCores} · mem ${gb(n.memUsed)}/${gb(n.memGb)}G</span>${models.join("")}</div>`;
  }

  function html(data, param) {
    const zoom = parseZoom(param);
    const all = data.nodes.map((row) => node(data, row));
    const inView = all.filter((n) => zoom.every(([k, v]) => n.loc[KINDS.indexOf(k)] === v));
    // Group by the first kind below the zoom whose names differ among the nodes in view; the kinds
    // they all share are said in the heading (one site, one room: no click through them).
    const shared = [];
    let by = -1;
    for (let k = 0; k < KINDS.length; k++) {
      if (zoom.some(([z]) => z === KINDS[k])) continue;
      const names = new Set(inView.map((n) => n.loc[k]));
      if (names.size > 1) { by = k; break; }
      const only = inView.length ? inView[0].loc[k] : "";
      if (only) shared.push(`${KINDS[k]} ${only}`);
    }
    const groups = new Map();
    if (by >= 0) for (const n of inView) { const g = n.loc[by]; if (!groups.has(g)) groups.set(g, []); groups.get(g).push(n); }
    else groups.set(null, inView);
    const keys = [...groups.keys()].sort((a, b) => (a === "" ? 1 : b === "" ? -1 : a < b ? -1 : a > b ? 1 : 0));
    shown = {data, groups: keys.map((g) => groups.get(g))};
    const held = data.held || {};
    const tiles = keys.map((g, i) => {
      const nodes = groups.get(g);
      const domain = g === null ? "" : g === "" ? "" : `${KINDS[by]}/${g}`;
      const title = g === null ? (shared.join(" · ") || "these nodes") : g === "" ? `no ${KINDS[by]}` : `${KINDS[by]} ${g}`;
      const isHeld = domain && held[domain] !== undefined;
      const power = domain && data.power[domain];
      const draw = power ? ` · draw ${Math.round(power[0])}${power[1] ? " / cap " + Math.round(power[1]) : ""} W` : "";
      const zoomTo = g === null ? "" : zoomHash(zoom.concat([[KINDS[by], g]]));
      return `<div class="fm-tile${isHeld ? " held" : ""}" data-group="${i}"${domain ? ` data-domain="${esc(domain)}"` : ""}` +
        `${zoomTo && g !== "" ? ` data-zoom="${esc(zoomTo)}"` : ""}><div class="fm-head"><b>${esc(title)}</b>` +
        `${isHeld ? ` <span class="held">HELD${held[domain][0] ? " (drain)" : ""}</span>` : ""}` +
        `<span class="muted">${said(totals(nodes))}${draw}</span></div><canvas class="fm-cells" data-group="${i}" role="img" ` +
        `aria-label="${esc(title)}: ${nodes.length} node(s)"></canvas></div>`;
    }).join("");
    const crumbs = [`<a href="#map">all</a>`].concat(zoom.map(([k, v], i) =>
      i === zoom.length - 1 ? `<b>${esc(k)} ${esc(v)}</b>` : `<a href="${esc(zoomHash(zoom.slice(0, i + 1)))}">${esc(k)} ${esc(v)}</a>`)).join(" › ");
    // Every model that runs in view, on GPUs or on CPUs alone.
    const use = new Map();
    for (const n of inView) {
      for (const m of n.gpus) if (m >= 0) { const u = use.get(m) || [0, 0]; u[0]++; use.set(m, u); }
      for (const m of n.cpuModels) { const u = use.get(m) || [0, 0]; u[1]++; use.set(m, u); }
    }
    const models = [...use.entries()].sort((a, b) => (data.models[a[0]] < data.models[b[0]] ? -1 : 1)).map(([m, [g, c]]) =>
      `<span class="fm-model${g ? "" : " fm-cpu-model"}" data-model="${esc(data.models[m])}"><i style="background:${colour(data.models[m])}"></i>` +
      `${esc(data.models[m])} <span class="muted">${[g ? `${g} GPU(s)` : "", c ? `CPU on ${c} node(s)` : ""].filter(Boolean).join(", ")}</span></span>`).join("");
    const cards = inView.length <= CARDS_MAX
      ? `<h3>Nodes</h3><div class="fm-cards">${inView.map((n) => card(n, data)).join("")}</div>` : "";
    const t = totals(inView);
    return `<h2>Map: ${said(t)}</h2><div class="fm-crumbs" aria-label="zoom">${crumbs}` +
      `${shared.length && by >= 0 ? ` <span class="muted">(${esc(shared.join(" · "))})</span>` : ""}</div>` +
      `<div class="fm-legend"><span>GPU use <i class="fm-scale fm-gpu"></i></span><span>CPU-only node, cores used <i class="fm-scale fm-cpu"></i></span>` +
      `<span><i style="background:${FREE}"></i>idle</span><span><i style="background:${LOST}"></i>lost</span></div>` +
      `<div class="fm-models">${models || '<span class="muted">no model runs here</span>'}</div>` +
      `<div id="fleetmap" class="fm-tiles${keys.length === 1 ? " one" : ""}" data-by="${by >= 0 ? KINDS[by] : ""}" data-zoom-at="${esc(zoomHash(zoom))}">${tiles}</div>${cards}`;
  }

  function draw() {
    if (!shown) return;
    const ratio = window.devicePixelRatio || 1;
    document.querySelectorAll("#fleetmap canvas.fm-cells").forEach((canvas) => {
      const nodes = shown.groups[Number(canvas.dataset.group)] || [];
      const size = nodes.length <= 64 ? 16 : nodes.length <= 400 ? 10 : 7;
      const width = Math.max(size, canvas.clientWidth || canvas.parentNode.clientWidth || 200);
      const cols = Math.max(1, Math.floor((width + GAP) / (size + GAP)));
      const rows = Math.ceil(nodes.length / cols);
      canvas.style.height = `${rows * (size + GAP)}px`;
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(rows * (size + GAP) * ratio);
      const cx = canvas.getContext("2d");
      cx.scale(ratio, ratio);
      nodes.forEach((n, i) => {
        cx.fillStyle = fill(n);
        cx.fillRect((i % cols) * (size + GAP), Math.floor(i / cols) * (size + GAP), size, size);
      });
      canvas.dataset.cols = String(cols);
      canvas.dataset.size = String(size);
      canvas.dataset.nodes = nodes.map((n) => n.name).join(" ");  // what the tests and tools read back
    });
  }

  function at(canvas, event) {
    // The node under the pointer, if any.
    const size = Number(canvas.dataset.size), cols = Number(canvas.dataset.cols);
    const r = canvas.getBoundingClientRect();
    const col = Math.floor((event.clientX - r.left) / (size + GAP)), row = Math.floor((event.clientY - r.top) / (size + GAP));
    const nodes = shown ? shown.groups[Number(canvas.dataset.group)] || [] : [];
    return col < cols ? nodes[row * cols + col] : undefined;
  }
  document.addEventListener("mousemove", (e) => {
    const canvas = e.target.closest && e.target.closest("canvas.fm-cells");
    if (!canvas || !shown) return;
    const n = at(canvas, e);
    canvas.title = n ? words(n, shown.data) : "";
  });
  document.addEventListener("click", (e) => {
    const tile = e.target.closest && e.target.closest(".fm-tile");
    if (!tile) return;
    if (tile.dataset.zoom) { location.hash = tile.dataset.zoom; return; }
    // A tile that cannot zoom further: its node under the pointer opens.
    const canvas = e.target.closest("canvas.fm-cells");
    const n = canvas && at(canvas, e);
    if (n) location.hash = `#node/${encodeURIComponent(n.name)}`;
  });
  window.addEventListener("resize", () => { if (document.querySelector("#fleetmap")) draw(); });
  return {html, draw};
})();
