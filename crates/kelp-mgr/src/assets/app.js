// Kelp dashboard: draws the page the path names from the JSON API. No framework, no build.
"use strict";

const $page = document.getElementById("page");

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = Number(n || 0), i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (i === 0 || v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " " + u[i];
}

function duration(s) {
  if (s == null) return "unknown";
  if (s < 60) return s + "s";
  if (s < 3600) return Math.ceil(s / 60) + "m";
  return Math.ceil(s / 3600) + "h";
}

async function api(path) {
  const r = await fetch(path, {credentials: "same-origin"});
  if (r.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); throw new Error("login"); }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function post(path) {
  const r = await fetch(path, {method: "POST", credentials: "same-origin"});
  const body = await r.json().catch(() => ({}));
  alert(r.ok ? "Done" : (r.status === 403 ? "Forbidden: " : "Failed: ") + (body.error || r.statusText));
  render();
}

function table(cols, rows) {
  const head = cols.map(c => `<th>${esc(c[0])}</th>`).join("");
  const body = rows.map(r => "<tr>" + cols.map(c => `<td>${c[1](r)}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function progressBar(p) {
  const pct = Math.round((p.fraction || 0) * 1000) / 10;
  const state = p.finished_ms ? "finished" : "running";
  return `<div class="progress-item" data-kind="${esc(p.kind)}" data-state="${state}">
    <div>${esc(p.message)}</div>
    <div class="bar" role="progressbar" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${pct}"><div style="width:${pct}%"></div></div>
    <span>${pct}%</span> <span class="muted">${p.finished_ms ? "done" : "remaining: " + duration(p.eta_secs)}</span>
  </div>`;
}

// A list page with a pager: `fetchPage(page)` returns the API's paginated answer.
async function paged(title, url, cols, perPage) {
  const q = new URLSearchParams(location.search);
  const page = Number(q.get("page") || 1);
  const sep = url.includes("?") ? "&" : "?";
  const d = await api(`${url}${sep}page=${page}&per_page=${perPage || 50}`);
  const nav = (p, label) => `<a href="?${new URLSearchParams({...Object.fromEntries(q), page: p})}">${label}</a>`;
  const pager = `<div class="pager">page ${d.page} of ${Math.max(d.pages, 1)} (${d.total} in all)
    ${d.page > 1 ? nav(d.page - 1, "previous") : ""} ${d.page < d.pages ? nav(d.page + 1, "next") : ""}</div>`;
  return `<h1>${esc(title)}</h1>${pager}${table(cols, d.items)}${pager}`;
}

// Inline SVG line chart of `series` (objects with t_ms) for the named fields.
function chart(title, samples, fields, fmt) {
  const w = 640, h = 160, pad = 30;
  if (samples.length < 2) return `<h3>${esc(title)}</h3><p class="muted">Collecting samples…</p>`;
  const t0 = samples[0].t_ms, t1 = samples[samples.length - 1].t_ms;
  const max = Math.max(1, ...samples.flatMap(s => fields.map(f => s[f[0]])));
  const x = t => pad + (w - 2 * pad) * (t - t0) / Math.max(1, t1 - t0);
  const y = v => h - pad - (h - 2 * pad) * v / max;
  const colors = ["#2b8a9e", "#c0602a", "#6a4fb3", "#1b7a3a"];
  const lines = fields.map((f, i) => {
    const pts = samples.map(s => `${x(s.t_ms).toFixed(1)},${y(s[f[0]]).toFixed(1)}`).join(" ");
    return `<polyline fill="none" stroke="${colors[i]}" stroke-width="1.5" points="${pts}"/>`;
  }).join("");
  const legend = fields.map((f, i) => `<span style="color:${colors[i]}">■ ${esc(f[1])}</span>`).join(" ");
  return `<h3>${esc(title)}</h3><svg class="chart" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}">
    <text x="4" y="14" font-size="11">${esc(fmt(max))}</text><text x="4" y="${h - pad + 4}" font-size="11">0</text>
    <line x1="${pad}" y1="${h - pad}" x2="${w - pad}" y2="${h - pad}" stroke="#aaa"/>${lines}</svg><div>${legend}</div>`;
}

const pages = {
  "/": async () => {
    const s = await api("/api/summary");
    const io = s.io || {};
    const cards = [
      ["Health", `<span id="health-status" class="${s.health.status}">${s.health.status}</span>`],
      ["OSDs", `<span id="osd-count">${s.osds.total}</span> <small>${s.osds.up} up, ${s.osds.in} in</small>`],
      ["Pools", s.pools],
      ["PGs", `<span id="pg-count">${s.pgs.total}</span>`],
      ["Objects", s.usage.objects],
      ["Used", `${bytes(s.usage.used_bytes)} <small>of ${bytes(s.usage.total_bytes)}</small>`],
      ["Client I/O", `${bytes(io.read_bytes_sec)}/s rd, ${bytes(io.write_bytes_sec)}/s wr`],
      ["Managers", `${esc(s.mgr.active || "none")} active` + (s.mgr.standbys.length ? `, ${s.mgr.standbys.length} standby` : "")],
    ].map(c => `<div class="card"><div class="muted">${c[0]}</div><div class="big">${c[1]}</div></div>`).join("");
    const checks = s.health.checks.map(c => `<li class="${c.severity}"><b>${esc(c.code)}</b>: ${esc(c.summary)}</li>`).join("");
    const states = s.pgs.by_state.map(p => `<li>${p.count} ${esc(p.state)}</li>`).join("");
    const progress = s.progress.map(progressBar).join("") || `<p class="muted">No long operations.</p>`;
    return `<h1>Overview</h1><div class="cards">${cards}</div>
      <h2>Health checks</h2><ul id="health-checks">${checks || "<li class='ok'>none</li>"}</ul>
      <h2>PG states</h2><ul>${states}</ul>
      <h2>Progress</h2><div id="progress">${progress}</div>`;
  },
  "/health": async () => {
    const h = await api("/api/health");
    const checks = h.checks.map(c => `<h2 class="${c.severity}">${esc(c.code)} (${c.severity})</h2><p>${esc(c.summary)}</p>
      <ul>${c.detail.map(d => `<li>${esc(d)}</li>`).join("")}</ul>`).join("");
    return `<h1>Health: <span id="health-status" class="${h.status}">${h.status}</span></h1>${checks || "<p class='ok'>No health checks raised.</p>"}`;
  },
  "/osds": async () => {
    const me = await api("/api/whoami");
    const admin = me.role === "admin";
    const d = await api("/api/osds?per_page=1000");
    const hosts = {};
    for (const o of d.items) (hosts[o.host] = hosts[o.host] || []).push(o);
    const cols = [["OSD", o => esc(o.name)], ["up", o => o.up ? "<span class='ok'>up</span>" : "<span class='bad'>down</span>"],
      ["in", o => o.in ? "in" : "<span class='warn'>out</span>"], ["reweight", o => o.reweight.toFixed(2)],
      ["size", o => bytes(o.total_bytes)], ["used", o => bytes(o.used_bytes)], ["avail", o => bytes(o.avail_bytes)],
      ["%use", o => o.use_pct.toFixed(2)], ["PGs", o => o.pgs]];
    if (admin) cols.push(["actions", o => `<span class="actions"><button onclick="post('/api/osd/${o.id}/${o.in ? "out" : "in"}')">mark ${o.in ? "out" : "in"}</button><button onclick="post('/api/osd/${o.id}/deep-scrub')">deep scrub</button></span>`]);
    const tree = Object.keys(hosts).sort().map(h => `<h2>host ${esc(h)}</h2>${table(cols, hosts[h])}`).join("");
    return `<h1>OSD tree (<span id="osd-count">${d.total}</span> OSDs)</h1>${tree}`;
  },
  "/pools": () => paged("Pools", "/api/pools", [["pool", p => esc(p.name)], ["id", p => p.id], ["type", p => p.type],
    ["size", p => p.size], ["PGs", p => p.pg_num], ["objects", p => p.objects], ["stored", p => bytes(p.stored_bytes)],
    ["raw used", p => bytes(p.raw_used_bytes)]]),
  "/pgs": async () => {
    const q = new URLSearchParams(location.search);
    const st = await api("/api/pg_states?per_page=1000");
    const filter = st.items.map(s => `<a href="/pgs?state=${encodeURIComponent(s.state)}">${s.count} ${esc(s.state)}</a>`).join(" · ");
    const url = "/api/pgs" + (q.get("state") ? "?state=" + encodeURIComponent(q.get("state").split("+").pop()) : "");
    const list = await paged("PGs", url, [["PG", p => esc(p.pgid)], ["state", p => esc(p.state)], ["up", p => esc(JSON.stringify(p.up))],
      ["acting", p => esc(JSON.stringify(p.acting))], ["objects", p => p.objects], ["bytes", p => bytes(p.bytes)],
      ["degraded", p => p.degraded], ["misplaced", p => p.misplaced]], 100);
    return `<p>${filter}</p>${list}`;
  },
  "/io": async () => {
    const d = await api("/api/io");
    const s = d.items;
    return `<h1>I/O</h1>` +
      chart("Client throughput", s, [["read_bytes_sec", "read"], ["write_bytes_sec", "write"]], v => bytes(v) + "/s") +
      chart("Client operations", s, [["read_op_per_sec", "read op/s"], ["write_op_per_sec", "write op/s"]], v => Math.round(v) + " op/s") +
      chart("Recovery", s, [["recovering_objects_per_sec", "objects/s"]], v => Math.round(v) + " objects/s") +
      chart("Recovery throughput", s, [["recovering_bytes_per_sec", "bytes/s"]], v => bytes(v) + "/s");
  },
  "/buckets": async () => {
    const pools = await api("/api/s3_pools?per_page=100");
    const list = await paged("S3 buckets", "/api/buckets", [["bucket", b => esc(b.name)], ["owner", b => esc(b.owner)],
      ["objects", b => b.objects ?? ""], ["stored", b => b.stored_bytes == null ? "" : bytes(b.stored_bytes)],
      ["index shards", b => b.shards + (b.resharding_to ? ` → ${b.resharding_to} (resharding)` : "")],
      ["created", b => b.created_ms ? new Date(b.created_ms).toISOString() : ""]]);
    return list + `<h2>S3 usage (gateway pools)</h2>` + table([["pool", p => esc(p.name)], ["objects", p => p.objects],
      ["stored", p => bytes(p.stored_bytes)], ["raw used", p => bytes(p.raw_used_bytes)]], pools.items);
  },
  "/progress": async () => {
    const d = await api("/api/progress?per_page=100");
    return `<h1>Progress</h1><div id="progress">${d.items.map(progressBar).join("") || "<p class='muted'>No long operations.</p>"}</div>`;
  },
  "/log": () => paged("Cluster log", "/api/log", [["time", e => new Date(e.stamp_ms).toISOString()], ["level", e => esc(e.level)],
    ["who", e => esc(e.who)], ["message", e => esc(e.message)]], 100),
};

async function render() {
  const draw = pages[location.pathname];
  if (!draw) { $page.innerHTML = "<p>No such page.</p>"; return; }
  try {
    $page.innerHTML = await draw();
    document.body.dataset.loaded = "1";
  } catch (e) {
    if (e.message !== "login") $page.innerHTML = `<p class="bad">${esc(e.message)}</p>`;
  }
}

api("/api/whoami").then(me => {
  document.getElementById("whoami").textContent = `${me.user} (${me.role}) · mgr.${me.mgr}`;
}).catch(() => {});
render();
setInterval(render, 5000);
