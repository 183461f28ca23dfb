// The llmgw console: one page, a view per hash (#fleet, #node/NAME, ...).
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
    box.innerHTML = `<span data-action-seq="${body.seq}">${esc(app.pending.said)}</span>; waiting for the decision that follows…`;
    followAction();
    scheduleRefresh(0);
  } catch (e) {
    box.className = "bad";
    box.textContent = `${verb} refused: ${e.message}`;
  }
}
async function followAction() {
  // The decisions after the action's event: what the control plane did about it.
  if (!app.pending) return;
  const p = app.pending;
  try {
    const d = await fetch(`/api/decisions?after=${p.seq}`, {credentials: "same-origin"}).then((r) => r.json());
    const rows = d.decisions || [];
    if (!rows.length) return;
    $("#actionsaid").innerHTML = `<span data-action-seq="${p.seq}">${esc(p.said)}</span>. The decision that followed (event ${rows[0].seq}):<ul>` +
      rows.filter((r) => r.seq === rows[0].seq).map((r) =>
        `<li class="followed">${esc(r.words)}${r.reason ? ": " + esc(r.reason) : ""}` +
        `${r.voided ? ` <span class="voided">[voided: ${esc(r.voided)}]</span>` : ""}</li>`).join("") + "</ul>";
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
$("#slider").addEventListener("change", (e) => {
  const v = Number(e.target.value);
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
function table(head, rows) {
  const cut = !app.allRows && rows.length > ROWS_SHOWN;
  const shown = cut ? rows.slice(0, ROWS_SHOWN) : rows;
  return `<div class="scroll"><table><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody>` +
    (shown.length ? shown.join("") : `<tr><td colspan="${head.length}" class="muted">(none)</td></tr>`) + "</tbody></table></div>" +
    (cut ? `<p class="muted">${rows.length - ROWS_SHOWN} more row(s) <button data-all-rows="1">show all ${rows.length}</button></p>` : "");
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

function renderFleet(data) {
  const f = app.filters;
  const domains = new Map(data.domains.map((d) => [d.domain, d]));
  const heldKinds = data.domains.filter((d) => d.held).map((d) => d.domain);
  const isHeld = (n) => KINDS.some((k) => n.loc[k] && heldKinds.includes(`${k}/${n.loc[k]}`));
  const nodes = data.nodes.filter((n) =>
    (!f.model || n.gpus.includes(f.model)) && (!f.owner || n.owners.includes(f.owner)) &&
    (!f.state || (f.state === "held" ? isHeld(n) : n.state === f.state)));
  const key = (n) => KINDS.map((k) => n.loc[k] || "");
  nodes.sort((a, b) => { const x = key(a).join("\u0001"), y = key(b).join("\u0001"); return x < y ? -1 : x > y ? 1 : a.name < b.name ? -1 : 1; });
  const models = new Set();
  const out = [];
  let prev = null, group = [];
  const flush = () => { if (group.length) out.push(`<div class="nodes">${group.join("")}</div>`); group = []; };
  for (const n of nodes) {
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
    const step = 100 / Math.max(1, n.gpus.length);
    const stops = n.gpus.map((m, i) => {
      if (m) models.add(m);
      return `${m ? colour(m) : "#e5e7eb"} ${(i * step).toFixed(2)}% ${((i + 1) * step).toFixed(2)}%`;
    }).join(",");
    const cells = n.gpus.length ? `<span class="g" style="width:${n.gpus.length * 8}px;background:linear-gradient(to right,${stops})"` +
      ` data-gpus="${esc(n.gpus.join("|"))}" title="${esc(n.gpus.map((m, i) => `GPU ${i}: ${m || "free"}`).join("\n"))}"></span>` : "";
    const cpu = n.cpu[1] ? ` cpu ${n.cpu[0]}/${n.cpu[1]}` : "";
    const mem = n.mem[1] ? ` mem ${gb(n.mem[0])}/${gb(n.mem[1])}G` : "";
    group.push(`<span class="n${n.state === "lost" ? " lost" : ""}${isHeld(n) ? " held" : ""}" data-node="${esc(n.name)}">` +
      `<a href="#node/${encodeURIComponent(n.name)}">${esc(n.name)}</a>${cells}<span class="r">${cpu}${mem}</span></span>`);
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
    `<span class="muted">${nodes.length} shown</span>` +
    `</div><div class="legend">${legend}</div><div id="fleet">${out.join("")}</div>`;
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
    `<h3>GPUs</h3><div class="gpus">${gpus || '<span class="muted">(none)</span>'}</div>` +
    `<h3>History</h3>${table(["SEQ", "TIME", "EVENT", "WHAT HAPPENED"], hist)}`;
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
  return `<h2>Replicas</h2>` + table(["REPLICA", "MODEL", "PROFILE", "STATE", "RESTART", "NODES", "ENDPOINT", "REASON", ""], rows);
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
  const [view, ...rest] = (location.hash.slice(1) || "fleet").split("/");
  const param = decodeURIComponent(rest.join("/"));
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("on", a.dataset.view === view || (view === "node" && a.dataset.view === "fleet")));
  const main = $("#main");
  try {
    let html, data;
    if (view === "fleet") html = renderFleet(data = await api("fleet"));
    else if (view === "node") html = renderNode(data = await api(`node/${encodeURIComponent(param)}`));
    else if (view === "models") html = renderModels(data = await api("models"));
    else if (view === "replicas") html = renderReplicas(data = await api("replicas"));
    else if (view === "decisions") {
      const f = app.decisionFilters;
      html = renderDecisions(data = await api("decisions", ["model", "replica", "node"].filter((k) => f[k]).map((k) => `${k}=${encodeURIComponent(f[k])}`).join("&")));
    } else if (view === "preemptions") html = renderPreemptions(data = await api("preemptions"));
    else if (view === "quotas") html = renderQuotas(data = await api("quotas"));
    else if (view === "explain") { html = await renderExplain(param); data = {seq: app.last, last: app.last}; }
    else html = `<p>No view ${esc(view)}.</p>`;
    // Drawn again only when it differs: a log that moves all the time (power readings) must not
    // replace the button under the operator's pointer.
    if (html !== app.html) { main.innerHTML = html; app.html = html; }
    main.dataset.view = view;
    main.dataset.seq = data ? data.seq : "";
    if (data && data.last !== undefined) { app.shown = data.last; showTravel(data); }
    afterPaint(view);
  } catch (e) {
    main.innerHTML = app.html = `<p class="err">${esc(e.message)}</p>`;
  }
}
function afterPaint(view) {
  // Two frames: the second runs once the first has painted (benchmarks/console.py reads these).
  requestAnimationFrame(() => requestAnimationFrame(() => {
    if (app.rendered[view] === undefined) {
      app.rendered[view] = performance.now();
      performance.mark(`llmgw-painted-${view}`);
    }
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
  else if (b.dataset.restart) act("restart", {replica: b.dataset.restart, in_place: false});
  else if (b.dataset.restartInplace) act("restart", {replica: b.dataset.restartInplace, in_place: true});
  else if (b.dataset.retry) act("retry", {model: b.dataset.retry});
  else if (b.dataset.allRows) { app.allRows = true; render(); }
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
