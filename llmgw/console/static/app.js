// The llmgw console: one page, a view per hash (#map, the landing view; #fleet, #node/NAME, ...).
// Plain JavaScript, no build step: what ships is this file.
"use strict";

const KINDS = ["site", "room", "row", "rack", "pdu"];
const PALETTE = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#65a30d", "#db2777",
                 "#4f46e5", "#ca8a04", "#0d9488", "#7c3aed", "#ea580c", "#0284c7", "#be123c", "#15803d"];
const app = {
  at: null,          // null: live; else {seq: N} or {time: T}
  last: 0,           // the log's last event, as the server last said
  filters: {model: "", owner: "", state: ""},
  decisionFilters: {model: "", replica: "", node: ""},
  pending: null,     // the sequence of the last action published, until a decision follows it
  refreshTimer: null,
  rendered: {},      // view -> ms from navigation start to its first paint (benchmarks/console.py)
};

const $ = (sel) => document.querySelector(sel);
function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function when(at) {
  if (!at) return "";
  return new Date(at * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}
function colour(model) {
  let h = 0;
  for (const c of model) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}
function atQuery() {
  if (!app.at) return "";
  return app.at.seq !== undefined ? `seq=${app.at.seq}` : `time=${app.at.time}`;
}
async function api(path, params) {
  const q = [atQuery(), params || ""].filter(Boolean).join("&");
  const r = await fetch(`/api/${path}${q ? (path.includes("?") ? "&" : "?") + q : ""}`, {credentials: "same-origin"});
  const body = await r.json().catch(() => ({error: `${r.status}`}));
  if (!r.ok) throw new Error(body.error || `${r.status}`);
  app.last = Math.max(app.last, body.last || 0);
  performance.mark("llmgw-data");  // where a view's time goes (benchmarks/console.py): its data parsed
  return body;
}
async function act(verb, args) {
  const box = $("#actionsaid");
  box.hidden = false;
  box.className = "";
  box.innerHTML = `Publishing ${esc(verb)}…`;
  try {
    const r = await fetch(`/api/action/${verb}`, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-LLMGW-Console": "1"}, body: JSON.stringify(args),
    });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || `${r.status}`);
    app.pending = {seq: body.seq, said: `${body.event} published as event ${body.seq}: ${body.summary}`};
    box.innerHTML = `<span data-action-seq="${body.seq}">${esc(app.pending.said)}</span>; <span class="pending">looking at what follows…</span>`;
    followAction();
    scheduleRefresh(0);
  } catch (e) {
    box.className = "bad";
    box.textContent = `${verb} refused: ${e.message}`;
  }
}
const FOLLOW_POLL_MS = 1000;  // how often the banner asks again while a decision is due (the log may be quiet)
const FOLLOW_GIVE_UP_MS = 120000;  // a console whose fold never reaches the event: the banner stops asking
async function followAction() {
  // What followed the action's event (llmgw/console/followup.py): the decision that took it into
  // account, or that none needs to follow; asked of the live fold, whatever point the page shows.
  if (!app.pending) return;
  const p = app.pending;
  try {
    const f = await fetch(`/api/followed?event=${p.seq}`, {credentials: "same-origin"}).then((r) => r.json());
    if (app.pending !== p) return;
    const head = `<span data-action-seq="${p.seq}">${esc(p.said)}</span>. `;
    p.since = p.since || Date.now();
    if (f.status === "pending" && Date.now() - p.since > FOLLOW_GIVE_UP_MS) {
      $("#actionsaid").innerHTML = head + `<span data-follow="unknown">Still ${esc(f.said)} after ${FOLLOW_GIVE_UP_MS / 1000} s: see Decisions.</span>`;
      app.pending = null;
      return;
    }
    if (f.status === "pending") {
      $("#actionsaid").innerHTML = head + `<span class="pending" data-follow="pending">${esc(f.said)}…</span>`;
      clearTimeout(app.followTimer);
      app.followTimer = setTimeout(followAction, FOLLOW_POLL_MS);
      return;
    }
    const acts = f.actions.map((a) => `<li class="${f.status === "followed" ? "followed" : "due"}">${esc(a)}</li>`).join("");
    $("#actionsaid").innerHTML = head + `<span data-follow="${esc(f.status)}">${esc(f.said[0].toUpperCase() + f.said.slice(1))}` +
      `${acts ? ":" : "."}</span>` + (acts ? `<ul>${acts}</ul>` : "");
    app.pending = null;
  } catch (e) { /* the next move of the log tries again */ }
}

// ------------------------------------------------------------------ time travel

function setAt(at) {
  app.at = at;
  document.body.classList.toggle("past", !!at);
  render();
}
function showTravel(data) {
  const s = $("#slider");
  s.max = Math.max(1, data.last);
  if (!app.at) s.value = data.last;
  else s.value = data.seq;
  const live = $("#live");
  live.textContent = app.at ? `at event ${data.seq} of ${data.last}` : `live: event ${data.last}`;
  live.classList.toggle("past", !!app.at);
  $("#atsaid").textContent = app.at
    ? `the fleet as it stood at event ${data.seq} (${when(data.at)})`
    : `now (event ${data.seq}${data.at ? ", " + when(data.at) : ""})`;
  showPointDecision();
}
async function showPointDecision() {
  const box = $("#pointdecision");
  if (!app.at) { box.hidden = true; return; }
  try {
    const d = (await api("decision")).decision;
    box.hidden = false;
    if (!d) { box.innerHTML = "No decision yet at this point of the log."; return; }
    const facts = d.facts.map((f) => `<li>${f.seq} ${esc(when(f.at))} ${esc(f.summary)}</li>`).join("");
    box.innerHTML = `<b>The decision at this point</b>: event ${d.seq} (${esc(when(d.at))}), taken on the state at event ${d.basis}` +
      `${d.leader ? " by " + esc(d.leader) : ""}<ul class="acts">` + d.actions.map((a) => `<li>${esc(a)}</li>`).join("") + "</ul>" +
      (d.voided.length ? `<div class="voided">voided: ${d.voided.map((v) => esc(v.action + ": " + v.reason)).join("; ")}</div>` : "") +
      `<details><summary>the facts it was taken on (${d.facts_total} event(s) since the pass before)</summary><ul>${facts || "<li>(none)</li>"}</ul></details>`;
  } catch (e) { box.hidden = false; box.textContent = e.message; }
}
function sliderSays(v) {
  // The box says where the slider is (the end of the log: live, the box empty).
  $("#atbox").value = v >= app.last ? "" : String(v);
}
$("#slider").addEventListener("input", (e) => sliderSays(Number(e.target.value)));
$("#slider").addEventListener("change", (e) => {
  const v = Number(e.target.value);
  sliderSays(v);
  setAt(v >= app.last ? null : {seq: v});
});
$("#atform").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("#atbox").value.trim();
  if (!text) return setAt(null);
  if (/^\d+$/.test(text)) return setAt({seq: Number(text)});
  const t = /^\d+\.\d*$/.test(text) ? Number(text) : Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(text) ? text : text + "Z") / 1000;
  if (Number.isNaN(t)) { $("#atsaid").textContent = `${text}: give a sequence number or a time`; return; }
  setAt({time: t});
});
$("#golive").addEventListener("click", () => { $("#atbox").value = ""; setAt(null); });

// ------------------------------------------------------------------ views

const ROWS_SHOWN = 500;  // a table draws this many rows until asked for all: 5,000 rows take seconds to lay out
// Rows (a table's, the Fleet view's nodes) in the first paint; the rest come in the frame after it,
// from a <template> (parsed with the page, laid out only once moved in: afterPaint). 500 rows of a
// table took 300 to 600 ms of layout before anything showed, on a busy machine (benchmarks/console.py).
const FIRST_ROWS = 100;
function later(id, html) {
  return html ? `<template class="later" data-into="${id}">${html}</template>` : "";
}
function table(head, rows, total) {
  // `total`: the rows there are, where the server sent the first ROWS_SHOWN only (the replicas).
  total = Math.max(total || 0, rows.length);
  const cut = !app.allRows && total > ROWS_SHOWN;
  const shown = cut ? rows.slice(0, ROWS_SHOWN) : rows;
  const id = `rows-${++app.tables}`;  // the same in every render of a view: its HTML compares equal
  return `<div class="scroll"><table><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody id="${id}">` +
    (shown.length ? shown.slice(0, FIRST_ROWS).join("") : `<tr><td colspan="${head.length}" class="muted">(none)</td></tr>`) +
    "</tbody></table>" + later(id, shown.slice(FIRST_ROWS).join("")) + "</div>" +
    (cut ? `<p class="muted">${total - ROWS_SHOWN} more row(s) <button data-all-rows="1">show all ${total}</button></p>` : "");
}
function options(values, chosen, all) {
  return `<option value="">${esc(all)}</option>` +
    values.map((v) => `<option${v === chosen ? " selected" : ""}>${esc(v)}</option>`).join("");
}
function gb(x) { return Math.round(x * 10) / 10; }

function domainLine(d, level, nodesShown) {
  if (!d) return "";
  const cap = d.cap_w ? ` · draw ${Math.round(d.draw_w)} / cap ${Math.round(d.cap_w)} W` + (d.draw_w > d.cap_w ? ' <span class="over">over</span>' : "")
                      : d.draw_w ? ` · draw ${Math.round(d.draw_w)} W` : "";
  const held = d.held ? ` <span class="held">HELD${d.drain ? " (drain)" : ""}</span>${d.hold_reason ? " " + esc(d.hold_reason) : ""}` : "";
  const buttons = app.at ? "" : d.held
    ? `<button data-release="${esc(d.domain)}">release</button>`
    : `<button data-hold="${esc(d.domain)}">hold</button><button data-hold-drain="${esc(d.domain)}">hold + drain</button>`;
  return `<div class="dom l${level}${d.held ? " held" : ""}" data-domain="${esc(d.domain)}"><b>${esc(d.kind)} ${esc(d.name)}</b>` +
    `<span>${d.nodes} node(s) · GPUs ${d.gpus_used} used, ${d.gpus_free} free${cap}</span>${held} ${buttons}</div>`;
}

function fleetData(data) {
  // The map's data (llmgw/console/fleetmap.py) in the shape this view draws: a node with its location
  // by kind and a model name per GPU ("?" a stray's), and each domain's counts summed here.
  const nodes = data.nodes.map(([name, place, state, gpus, cpuUsed, cpuCores, memUsed, memGb, cpuModels]) => {
    const loc = {};
    data.places[place].forEach((v, i) => { if (v) loc[KINDS[i]] = v; });
    return {name, state: data.states[state], loc, gpus: gpus.map((m) => (m >= 0 ? data.models[m] : m === -1 ? "" : "?")),
            cpu: [cpuUsed, cpuCores], mem: [memUsed, memGb], cpu_models: cpuModels.map((m) => data.models[m]),
            owners: [...new Set(gpus.filter((m) => m >= 0).map((m) => data.owners[m]).filter(Boolean))]};
  });
  const domains = new Map();
  const domain = (d) => {
    let r = domains.get(d);
    if (!r) { const i = d.indexOf("/"); domains.set(d, r = {domain: d, kind: d.slice(0, i), name: d.slice(i + 1), nodes: 0, gpus_used: 0, gpus_free: 0}); }
    return r;
  };
  for (const n of nodes) {  // as facility_facts.domain_rows counts: a lost node's GPUs neither used nor free
    const used = n.state === "ready" ? n.gpus.filter(Boolean).length : 0;
    const free = n.state === "ready" ? n.gpus.length - used : 0;
    for (const k of KINDS) if (n.loc[k]) { const r = domain(`${k}/${n.loc[k]}`); r.nodes++; r.gpus_used += used; r.gpus_free += free; }
  }
  for (const [d, [draw, cap]] of Object.entries(data.power)) Object.assign(domain(d), {draw_w: draw, cap_w: cap});
  for (const [d, [drain, reason]] of Object.entries(data.held)) Object.assign(domain(d), {held: true, drain, hold_reason: reason});
  const owners = [...new Set(data.owners.filter(Boolean))].sort();
  return {...data, nodes, domains: [...domains.values()], models: data.models.slice().sort(), owners};
}

function renderFleet(raw) {
  const data = fleetData(raw);
  const f = app.filters;
  const domains = new Map(data.domains.map((d) => [d.domain, d]));
  const heldKinds = data.domains.filter((d) => d.held).map((d) => d.domain);
  const isHeld = (n) => KINDS.some((k) => n.loc[k] && heldKinds.includes(`${k}/${n.loc[k]}`));
  const nodes = data.nodes.filter((n) =>
    (!f.model || n.gpus.includes(f.model) || n.cpu_models.includes(f.model)) && (!f.owner || n.owners.includes(f.owner)) &&
    (!f.state || (f.state === "held" ? isHeld(n) : n.state === f.state)));
  const key = (n) => KINDS.map((k) => n.loc[k] || "");
  nodes.sort((a, b) => { const x = key(a).join("\u0001"), y = key(b).join("\u0001"); return x < y ? -1 : x > y ? 1 : a.name < b.name ? -1 : 1; });
  const models = new Set();
  const out = [];
  let prev = null, group = [];
  let first = -1;  // the end of the first paint's part of `out` (FIRST_ROWS nodes)
  const flush = () => {
    if (group.length) out.push(`<div class="nodes">${group.join("")}</div>`);
    group = [];
    if (first < 0 && drawn >= FIRST_ROWS) first = out.length;
  };
  let drawn = 0;
  // The first ROWS_SHOWN nodes until asked for all, as a table's rows: 2,000 nodes and their
  // 3,000 domain lines cost most of a second to build and lay out (the Map shows them all).
  const cut = !app.allRows && nodes.length > ROWS_SHOWN;
  for (const n of nodes) for (const m of n.gpus) if (m) models.add(m);  // the legend: every node shown or not
  for (const n of cut ? nodes.slice(0, ROWS_SHOWN) : nodes) {
    const k = key(n);
    if (!prev || k.join("\u0001") !== prev.join("\u0001")) {
      flush();
      let i = 0;
      while (prev && i < KINDS.length && k[i] === prev[i]) i++;
      for (; i < KINDS.length; i++) {
        if (k[i]) out.push(domainLine(domains.get(`${KINDS[i]}/${k[i]}`), i));
        else if (i === 0 && !k.some(Boolean)) out.push(`<div class="dom l0"><b>no location</b><span class="muted">nodes without site, room, row, rack or pdu labels</span></div>`);
      }
      prev = k;
    }
    // One element per node, a stripe per GPU (a gradient): 16,000 cells as elements cost seconds of layout.
    // A run of GPUs of one model is one stripe, and the title is made on hover (the mouseover listener): the page's
    // HTML for 2,000 nodes is a third of what a stop per GPU and a title per node made.
    const step = 100 / Math.max(1, n.gpus.length);
    const stops = [];
    for (let i = 0, j; i < n.gpus.length; i = j) {
      const m = n.gpus[i];
      for (j = i + 1; j < n.gpus.length && n.gpus[j] === m;) j++;
      stops.push(`${m ? colour(m) : "#e5e7eb"} ${Math.round(i * step)}% ${Math.round(j * step)}%`);
    }
    const cells = n.gpus.length ? `<span class="g" style="width:${n.gpus.length * 8}px;background:linear-gradient(to right,${stops.join(",")})"` +
      ` data-gpus="${esc(n.gpus.join("|"))}"></span>` : "";
    const cpu = n.cpu[1] ? ` cpu ${n.cpu[0]}/${n.cpu[1]}` : "";
    const mem = n.mem[1] ? ` mem ${gb(n.mem[0])}/${gb(n.mem[1])}G` : "";
    const onCpu = (n.cpu_models || []).map((m) => ` <span class="cm" data-model="${esc(m)}"><i style="background:${colour(m)}"></i>${esc(m)} (CPU)</span>`).join("");
    group.push(`<span class="n${n.state === "lost" ? " lost" : ""}${isHeld(n) ? " held" : ""}" data-node="${esc(n.name)}">` +
      `<a href="#node/${encodeURIComponent(n.name)}">${esc(n.name)}</a>${cells}<span class="r">${cpu}${mem}</span>${onCpu}</span>`);
    drawn++;
  }
  flush();
  const used = data.nodes.reduce((s, n) => s + n.gpus.filter(Boolean).length, 0);
  const total = data.nodes.reduce((s, n) => s + n.gpus.length, 0);
  const legend = [...models].sort().map((m) => `<span><i style="background:${colour(m)}"></i>${esc(m)}</span>`).join("") +
    `<span><i style="background:#e5e7eb"></i>free</span>`;
  return `<h2>Fleet: ${data.nodes.length} node(s), GPUs ${used} used of ${total}</h2>` +
    `<div class="filters"><label>model <select id="f-model">${options(data.models, f.model, "any")}</select></label>` +
    `<label>owner <select id="f-owner">${options(data.owners, f.owner, "any")}</select></label>` +
    `<label>state <select id="f-state">${options(["ready", "lost", "held"], f.state, "any")}</select></label>` +
    `<span class="muted">${cut ? `${ROWS_SHOWN} of ${nodes.length}` : nodes.length} shown</span>` +
    `</div><div class="legend">${legend}</div><div id="fleet">${(first < 0 ? out : out.slice(0, first)).join("")}</div>` +
    (first < 0 ? "" : later("fleet", out.slice(first).join(""))) +
    (cut ? `<p class="muted">${nodes.length - ROWS_SHOWN} more node(s) <button data-all-rows="1">show all ${nodes.length}</button></p>` : "");
}

function renderNode(data) {
  const n = data.node;
  const loc = KINDS.map((k) => `<label>${k} <input name="${k}" value="${esc(n.loc[k] || "")}"${app.at ? " disabled" : ""}></label>`).join(" ");
  const gpus = n.gpus.map((g) => `<div class="gpu"><span class="sw" style="background:${g.model_running ? colour(g.model_running) : "#e5e7eb"}"></span>` +
    `GPU ${g.index} ${esc(g.model)} ${g.memory_gb} GB<br>${g.replica ? `<a href="#replicas">${esc(g.replica)}</a> (${esc(g.model_running)})` : '<span class="muted">free</span>'}</div>`).join("");
  const labels = Object.entries(n.labels).sort().map(([k, v]) => `${esc(k)}=${esc(v)}`).join(", ");
  const hist = n.history.map((e) => {
    const text = e.decisions.length
      ? e.decisions.map((d) => esc(d.words) + (d.reason ? ": " + esc(d.reason) : "") + (d.voided ? ` <span class="voided">[voided: ${esc(d.voided)}]</span>` : "")).join("<br>")
      : esc(e.summary);
    return `<tr><td>${e.seq}</td><td>${esc(when(e.at))}</td><td>${esc(e.type)}</td><td>${text}</td></tr>`;
  });
  return `<h2>Node ${esc(n.name)} <span class="muted">${esc(n.state)}${n.reason ? ": " + esc(n.reason) : ""}</span></h2>` +
    `<div class="kv"><span>agent</span><span>${esc(n.agent)}</span><span>GPUs</span><span>${n.gpus_used} used of ${n.gpus_total}</span>` +
    `<span>CPU cores</span><span>${n.cpu_used} used of ${n.cpu_cores}</span><span>memory</span><span>${gb(n.memory_used)} GB used of ${gb(n.memory_gb)} GB</span>` +
    `<span>labels</span><span id="node-labels">${labels || "(none)"}</span><span>registered</span><span>${esc(when(n.registered_at))}</span></div>` +
    `<h3>Location</h3><form id="labelform" class="labels" data-node="${esc(n.name)}">${loc} ` +
    (app.at ? "" : `<button type="submit">Save location</button>`) + `</form>` +
    `<h3>Running now</h3>${runningNow(n.running || [])}` +
    `<h3>GPUs</h3><div class="gpus">${gpus || '<span class="muted">(none)</span>'}</div>` +
    `<h3>History</h3>${table(["SEQ", "TIME", "EVENT", "WHAT HAPPENED"], hist)}`;
}

function runningNow(rows) {
  // What runs on the node now, a row per shard: on GPUs or on its CPU alone.
  const trs = rows.map((r) => `<tr data-replica="${esc(r.replica)}"><td><a href="#replicas">${esc(r.replica)}</a>` +
    `${r.rank ? ` <span class="muted">shard ${r.rank}</span>` : ""}</td><td><span class="sw" style="background:${colour(r.model)}"></span>${esc(r.model)}` +
    ` <span class="muted">${esc(r.profile)}</span></td><td class="state">${esc(r.state)}${r.shard_state !== r.state ? ` <span class="muted">(shard ${esc(r.shard_state)})</span>` : ""}` +
    `${r.restart ? ` <span class="muted">restart ${esc(r.restart)}</span>` : ""}</td><td class="port">${r.port || ""}</td>` +
    `<td>${r.gpus.length ? `GPU ${r.gpus.join(", ")}` : "CPU only"}${r.cpu_cores ? ` · ${r.cpu_cores} core(s)` : ""}${r.memory_gb ? ` · ${gb(r.memory_gb)} GB` : ""}</td></tr>`);
  return `<div class="fm-running">${table(["REPLICA", "MODEL", "STATE", "PORT", "GPUS / CPU"], trs)}</div>`;
}

// A model's routing policy and, summed over its replicas, why the gateways sent its requests where they did
// and the share of prompt tokens the engines had cached (issue 30; `ctl describe model` has them per replica).
function routingText(r) {
  if (!r) return "";
  const sums = {};
  for (const f of Object.values(r.replicas || {})) for (const [k, v] of Object.entries(f)) sums[k] = (sums[k] || 0) + v;
  const why = ["warm", "hashed", "overflow", "session", "least_load", "round_robin"].filter((k) => sums[k]).map((k) => `${k} ${sums[k]}`);
  const cached = sums.prompt_tokens ? ` · ${Math.round(100 * (sums.cached_tokens || 0) / sums.prompt_tokens)}% cached` : "";
  return `${r.policy}${why.length ? " · " + why.join(", ") : ""}${cached}`;
}

function renderModels(data) {
  const rows = data.models.map((m) => `<tr data-model="${esc(m.name)}"><td>${esc(m.name)}</td><td>${esc(m.priority)}</td><td>${esc(m.owner)}</td>` +
    `<td>${m.desired}</td><td>${m.ready}/${m.replicas}</td><td>${esc(m.waiting)}</td><td>${esc(m.parked)}` +
    `${m.parked && !app.at ? ` <button data-retry="${esc(m.name)}">retry</button>` : ""}</td>` +
    `<td>${m.usage && m.usage.gpus !== undefined ? `${m.usage.gpus} GPU, ${m.usage.cpu_cores} cores, ${gb(m.usage.memory_gb)} GB` : ""}</td>` +
    `<td>${esc(routingText(m.routing))}</td>` +
    `<td><a href="#explain/${encodeURIComponent(m.name)}">explain</a></td></tr>`);
  return `<h2>Models</h2>` + table(["MODEL", "CLASS", "OWNER", "DESIRED", "READY", "WAITING", "PARKED", "OWNER'S QUOTA USE", "ROUTING", ""], rows);
}

function renderReplicas(data) {
  const rows = data.replicas.map((r) => {
    const can = !app.at && r.state === "ready" && !["queued", "replacing", "in place"].includes(r.restart);
    return `<tr data-replica="${esc(r.id)}"><td>${esc(r.id)}</td><td>${esc(r.model)}</td><td>${esc(r.profile)}</td><td class="state">${esc(r.state)}</td>` +
      `<td>${esc(r.restart)}${r.restart_reason ? ": " + esc(r.restart_reason) : ""}</td><td>${r.nodes.map((n) => `<a href="#node/${encodeURIComponent(n)}">${esc(n)}</a>`).join(", ")}</td>` +
      `<td>${esc(r.endpoint)}</td><td>${esc(r.reason)}</td><td>${can ? `<button data-restart="${esc(r.id)}">restart</button> <button data-restart-inplace="${esc(r.id)}">in place</button>` : ""}</td></tr>`;
  });
  return `<h2>Replicas</h2>` + table(["REPLICA", "MODEL", "PROFILE", "STATE", "RESTART", "NODES", "ENDPOINT", "REASON", ""], rows, data.total);
}

function renderDecisions(data) {
  const f = app.decisionFilters;
  const rows = data.decisions.map((d) => `<tr${d.voided ? ' class="voided-row"' : ""}><td>${d.seq}</td><td>${esc(when(d.at))}</td>` +
    `<td>${esc(d.words)}</td><td>${esc(d.reason)}</td><td class="voided">${esc(d.voided)}</td></tr>`);
  return `<h2>Decisions</h2><form id="decform" class="filters">` +
    ["model", "replica", "node"].map((k) => `<label>${k} <input name="${k}" value="${esc(f[k])}"></label>`).join("") +
    `<button type="submit">Filter</button></form>` + table(["SEQ", "TIME", "DECISION", "REASON", "VOIDED (WHY)"], rows.reverse());
}

function renderPreemptions(data) {
  const rows = data.preemptions.map((p) => `<tr><td>${p.seq}</td><td>${esc(when(p.at))}</td><td>${esc(p.model)}</td>` +
    `<td>${p.victims.map((v) => `${esc(v.replica)} (${esc(v.tier)}: ${esc(v.why)})`).join(", ")}</td><td>${esc(p.reason)}</td>` +
    `<td>${esc(p.inventory)}</td><td class="voided">${esc(p.voided)}</td></tr>`);
  return `<h2>Preemptions</h2>` + table(["SEQ", "TIME", "FOR", "VICTIMS (TIER)", "REASON", "BEFORE", "VOIDED"], rows.reverse());
}

function amount(a, limit) {
  if (!a) return "";
  const part = (v, unit) => (v === null || v === undefined ? (limit ? `no limit of ${unit}` : "") : `${v} ${unit}`);
  return [part(a.gpus, "GPUs"), part(a.cpu_cores, "cores"), part(a.memory_gb, "GB")].filter(Boolean).join(", ");
}
function renderQuotas(data) {
  const rows = data.quotas.map((q) => `<tr><td>${esc(q.owner)}</td><td>${esc(amount(q.guarantee))}</td><td>${esc(amount(q.limits, true))}</td>` +
    `<td>${esc(amount(q.usage))}</td><td>${esc(amount(q.borrowed))}</td></tr>`);
  return `<h2>Quotas</h2>` + table(["OWNER", "GUARANTEE", "LIMIT", "USAGE", "BORROWED"], rows);
}

async function renderExplain(name) {
  const models = (await api("models")).models.map((m) => m.name);
  const pick = `<div class="filters"><label>model <select id="x-model">${options(models, name, "choose a model")}</select></label></div>`;
  if (!name) return `<h2>Explain</h2>${pick}<p class="muted">For a model: every node, and why its next replica would or would not go there.</p>`;
  const data = await api(`explain/${encodeURIComponent(name)}`);
  const x = data.explanation;
  const profiles = (x.profiles || []).map((pf) => `<h3>profile ${esc(pf.profile)} needs ${esc(pf.needs)}: ` +
    `<span class="${pf.fits ? "fits" : "nofit"}">${pf.fits ? "fits" : "fits nowhere"}</span></h3>`).join("");
  return `<h2>Explain ${esc(name)}</h2>${pick}<p>${esc(data.lines[0])}</p>${profiles}<pre id="explain-lines">${esc(data.lines.slice(1).join("\n"))}</pre>`;
}

async function render() {
  clearTimeout(app.refreshTimer);
  app.refreshTimer = null;
  app.inflight = (app.inflight || 0) + 1;
  app.tables = 0;
  const [view, ...rest] = (location.hash.slice(1) || "map").split("/");
  const param = decodeURIComponent(rest.join("/"));
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("on", a.dataset.view === view || (view === "node" && a.dataset.view === "map")));
  const main = $("#main");
  try {
    let html, data;
    if (view === "map") html = fleetMap.html(data = await api("map"), rest.join("/"));
    else if (view === "fleet") html = renderFleet(data = await api("fleet"));
    else if (view === "node") html = renderNode(data = await api(`node/${encodeURIComponent(param)}`));
    else if (view === "models") html = renderModels(data = await api("models"));
    else if (view === "replicas") html = renderReplicas(data = await api("replicas", app.allRows ? "" : `limit=${ROWS_SHOWN}`));
    else if (view === "decisions") {
      const f = app.decisionFilters;
      html = renderDecisions(data = await api("decisions", ["model", "replica", "node"].filter((k) => f[k]).map((k) => `${k}=${encodeURIComponent(f[k])}`).join("&")));
    } else if (view === "preemptions") html = renderPreemptions(data = await api("preemptions"));
    else if (view === "quotas") html = renderQuotas(data = await api("quotas"));
    else if (view === "plots") html = plotsView.html(data = await api("plots", plotsView.query(param)));
    else if (view === "timeline") html = timelineView.html(data = await api("timeline", plotsView.windowQuery()));
    else if (view === "explain") { html = await renderExplain(param); data = {seq: app.last, last: app.last}; }
    else html = `<p>No view ${esc(view)}.</p>`;
    // Drawn again only when it differs: a log that moves all the time (power readings) must not
    // replace the button under the operator's pointer.
    if (html !== app.html) { main.innerHTML = html; app.html = html; }
    performance.mark("llmgw-html");  // its HTML built and in the page (the rest: style, layout, paint)
    if (view === "map") fleetMap.draw();  // its canvases: the same HTML may show another use
    main.dataset.view = view;
    main.dataset.seq = data ? data.seq : "";
    if (view === "plots") plotsView.draw(data);  // plots.js, timeline.js: charts and lanes over time
    else if (view === "timeline") timelineView.draw(data);
    else if (view === "node") timelineView.node(param);
    if (data && data.last !== undefined) { app.shown = data.last; showTravel(data); }
    afterPaint(view);
  } catch (e) {
    main.innerHTML = app.html = `<p class="err">${esc(e.message)}</p>`;
  } finally {
    app.inflight--;
  }
}
function afterPaint(view) {
  // Two frames: the second runs once the first has painted (benchmarks/console.py reads these).
  requestAnimationFrame(() => requestAnimationFrame(() => {
    if (app.rendered[view] === undefined) {
      app.rendered[view] = performance.now();
      performance.mark(`llmgw-painted-${view}`);
    }
    document.querySelectorAll("#main template.later").forEach((t) => {
      const into = document.getElementById(t.dataset.into);
      if (into) into.append(t.content);
      t.remove();
    });
    document.body.dataset.painted = view;
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
  }));
}
function scheduleRefresh(ms) {
  if (app.refreshTimer) return;
  app.refreshTimer = setTimeout(() => {
    app.refreshTimer = null;
    const typing = document.activeElement && document.activeElement.matches("#main form input");
    if (typing) { scheduleRefresh(1000); return; }  // never wipe what the operator is typing
    // A view still coming is not asked for again beside itself (the log's first word comes while
    // the first view of 2,000 nodes is on its way: twice the server's and the browser's work).
    if (app.inflight) { scheduleRefresh(150); return; }
    if (!app.at && !(app.shown >= app.last)) render();  // not when the view already shows the last event
    followAction();
  }, ms);
}

// ------------------------------------------------------------------ actions and filters (one listener each)

document.addEventListener("click", (e) => {
  const b = e.target.closest("button");
  if (!b) return;
  if (b.dataset.hold) act("hold", {domain: b.dataset.hold, drain: false, reason: "held from the console"});
  else if (b.dataset.holdDrain) act("hold", {domain: b.dataset.holdDrain, drain: true, reason: "drained from the console"});
  else if (b.dataset.release) act("release", {domain: b.dataset.release});
  else if (b.dataset.restart) {
    if (confirm(`Restart ${b.dataset.restart}? A replacement starts beside it; it stops once the replacement serves.`)) act("restart", {replica: b.dataset.restart, in_place: false});
  } else if (b.dataset.restartInplace) {
    if (confirm(`Restart ${b.dataset.restartInplace} in place? It stops first: its requests go to the other replicas meanwhile.`)) act("restart", {replica: b.dataset.restartInplace, in_place: true});
  }
  else if (b.dataset.retry) act("retry", {model: b.dataset.retry});
  else if (b.dataset.allRows) { app.allRows = true; render(); }
});
document.addEventListener("mouseover", (e) => {
  // A node's GPUs in words, made when the pointer first comes to its stripes (renderFleet).
  const g = e.target.closest && e.target.closest(".n .g");
  if (g && !g.title) g.title = g.dataset.gpus.split("|").map((m, i) => `GPU ${i}: ${m || "free"}`).join("\n");
});
document.addEventListener("change", (e) => {
  const id = e.target.id;
  if (id.startsWith("f-")) { app.filters[id.slice(2)] = e.target.value; render(); }
  else if (id === "x-model") location.hash = `#explain/${encodeURIComponent(e.target.value)}`;
});
document.addEventListener("submit", (e) => {
  if (e.target.id === "labelform") {
    e.preventDefault();
    const form = e.target, set = {}, remove = [];
    for (const k of KINDS) {
      const v = form.elements[k].value.trim();
      if (v && v !== form.elements[k].defaultValue) set[k] = v;
      else if (!v && form.elements[k].defaultValue) remove.push(k);
    }
    act("label", {node: form.dataset.node, set, remove});
  } else if (e.target.id === "decform") {
    e.preventDefault();
    for (const k of ["model", "replica", "node"]) app.decisionFilters[k] = e.target.elements[k].value.trim();
    render();
  }
});
window.addEventListener("hashchange", () => { app.allRows = false; render(); });

// ------------------------------------------------------------------ live

function listen() {
  const source = new EventSource("/api/events");
  source.addEventListener("moved", (e) => {
    const d = JSON.parse(e.data);
    app.last = Math.max(app.last, d.seq);
    if (d.seq === app.shown) return;  // the stream's first word, when the view already shows this event
    $("#slider").max = Math.max(1, d.seq);
    if (!app.at) { $("#slider").value = d.seq; $("#live").textContent = `live: event ${d.seq}`; scheduleRefresh(150); }
    else followAction();
  });
}
render();
listen();
