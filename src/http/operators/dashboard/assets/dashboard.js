// The live view: polls /admin/dashboard/data once per tick and writes the
// numbers into the page. Text only (textContent), never markup from data.
"use strict";

const number = new Intl.NumberFormat("en-US");
const rate = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

function text(el, value) {
  if (el && el.textContent !== value) el.textContent = value;
}
function count(v) {
  return v === null || v === undefined ? "—" : number.format(v);
}
function perSecond(v) {
  return v === null || v === undefined ? "—" : rate.format(v);
}
function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms === Infinity) return "> largest bucket";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 120000) return `${rate.format(ms / 1000)} s`;
  return `${rate.format(ms / 60000)} min`;
}

// A moment as the operator's clock shows it (date and time, to the minute).
const clock = new Intl.DateTimeFormat(undefined, { dateStyle: "short", timeStyle: "short" });
function when(ms) {
  return ms === null || ms === undefined ? "—" : clock.format(new Date(ms));
}
// A span to come, in the largest unit that reads well.
function span(ms) {
  if (ms < 120000) return duration(ms);
  if (ms < 7200000) return `${Math.round(ms / 60000)} min`;
  return `${rate.format(ms / 3600000)} h`;
}
// Where the sale stands in its window, from the page's clock.
function timeLeft(sale, now) {
  if (sale.start_ms == null || sale.end_ms == null) return "—";
  if (now < sale.start_ms) return `starts in ${span(sale.start_ms - now)}`;
  if (now < sale.end_ms) return `ends in ${span(sale.end_ms - now)}`;
  return "ended";
}

function renderInstance(inst) {
  const root = document.getElementById("instance");
  for (const [key, value] of Object.entries(inst.orders_total)) {
    text(root.querySelector(`[data-total="${key}"]`), count(value));
    text(root.querySelector(`[data-rate="${key}"]`),
      perSecond(inst.orders_per_s ? inst.orders_per_s[key] : null));
  }
  for (const by of ["memory", "redis", "service"]) {
    text(root.querySelector(`[data-field="answered_${by}"]`),
      perSecond(inst.answered_per_s ? inst.answered_per_s[by] : null));
  }
  text(root.querySelector('[data-field="rows_per_s"]'),
    inst.workers ? perSecond(inst.rows_persisted_per_s) : "no workers here");
  text(root.querySelector('[data-field="rows_persisted"]'),
    inst.workers ? count(inst.rows_persisted) : "—");
  const q = inst.accept_to_persist_ms;
  text(root.querySelector('[data-field="accept_to_persist"]'),
    q ? `${duration(q.p50)} / ${duration(q.p99)}` : "—");
  const e = inst.events;
  const events = root.querySelector('[data-field="events"]');
  text(events, e ? `${count(e.behind)} / ${count(e.dead_letters)} / ${count(e.delivered)}`
    : "not pushed from here");
  events.classList.toggle("bad", !!e && e.dead_letters > 0);
}

const roles = { api: "API", api_and_workers: "API + workers", worker: "workers" };
// The deployment's processes, and which releases run (the gone ones aside).
function renderFleet(fleet, now) {
  const body = document.querySelector("#fleet tbody");
  const rows = fleet.map((m) => {
    const tr = document.createElement("tr");
    tr.dataset.process = m.name;
    tr.classList.toggle("bad", m.gone);
    const cells = [
      `${m.host} · pid ${m.pid}`,
      roles[m.role] || m.role,
      m.version,
      m.commit,
      duration(Math.max(0, now - m.started_ms)),
      m.gone ? `gone (${duration(Math.max(0, now - m.seen_ms))} ago)` : `${duration(Math.max(0, now - m.seen_ms))} ago`,
    ];
    for (const [i, value] of cells.entries()) {
      const td = document.createElement("td");
      td.dataset.field = ["process", "role", "version", "commit", "up", "seen"][i];
      td.textContent = value;
      tr.appendChild(td);
    }
    return tr;
  });
  body.replaceChildren(...rows);
  const releases = new Map();
  for (const m of fleet.filter((m) => !m.gone)) {
    const release = `${m.version} (${m.commit})`;
    releases.set(release, (releases.get(release) || 0) + 1);
  }
  const summary = [...releases].map(([r, n]) => `${r} × ${n}`).join(", ");
  const el = document.getElementById("fleet-releases");
  text(el, releases.size === 0 ? "No process heard from."
    : `${releases.size === 1 ? "One release" : `${releases.size} releases`} running: ${summary}.`);
  el.classList.toggle("bad", releases.size > 1);
}

// The stock over the history kept (up to 5 minutes), on at least a minute.
function chart(svg, caption, history, initial, now) {
  const oldest = history.length ? history[0][0] : now;
  const span = Math.min(5 * 60 * 1000, Math.max(60 * 1000, now - oldest));
  const shown = span < 120000 ? `${Math.round(span / 1000)} s` : `${rate.format(span / 60000)} min`;
  text(caption, `stock over the last ${shown}`);
  const top = Math.max(initial || 0, ...history.map((p) => p[1]), 1);
  const points = history.map(([t, stock]) => {
    const x = 300 - ((now - t) / span) * 300;
    const y = 58 - (stock / top) * 56;
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  svg.querySelector("polyline").setAttribute("points", points.join(" "));
}

function books(sale) {
  if (!sale.books) return ["books: not judged yet", "muted"];
  const age = ` (${duration(sale.books_age_ms)} ago)`;
  if (sale.books.balanced) return ["books balanced" + age, "good"];
  return [`books OFF by ${number.format(sale.books.difference)} units` + age, "bad"];
}

function renderSale(el, sale, now) {
  const field = (name) => el.querySelector(`[data-field="${name}"]`);
  text(field("product_id"), sale.product_id);
  const soldOut = sale.state === "live" && sale.stock === 0;
  // Ended and not retired: why (the workers' retirement pass says).
  const waits = sale.state === "ended" && sale.unsettled
    ? sale.unsettled.split(",").map((r) => r.replace(/_/g, " ")).join(", ") : "";
  text(field("state"), soldOut ? "live · sold out"
    : waits ? `ended · not retired: ${waits}` : sale.state);
  // An ended sale says what comes next: its retirement, and where its
  // report goes then.
  field("retires").hidden = sale.state !== "ended";
  text(field("retires"), sale.state !== "ended" ? ""
    : "Ended: it takes no orders. The workers retire it once every order is settled "
      + "(paid, cancelled or timed out) and its books balance"
      + (waits ? ` (waiting for: ${waits})` : "")
      + "; it then leaves this page, and its report is kept under Past sales.");
  const stuck = waits.includes("dead letters") || waits.includes("books off");
  field("state").className = `badge ${stuck ? "bad" : sale.state}`;
  const [label, tone] = books(sale);
  text(field("books"), label);
  field("books").className = `badge ${tone}`;
  field("error").hidden = !sale.error;
  text(field("error"), sale.error ? `cannot read this sale: ${sale.error}` : "");
  text(field("stock"), count(sale.stock));
  text(field("initial"), count(sale.initial));
  const share = sale.initial ? Math.max(0, Math.min(1, (sale.stock || 0) / sale.initial)) : 0;
  el.querySelector(".fill").style.width = `${(share * 100).toFixed(1)}%`;
  chart(el.querySelector("svg"), el.querySelector(".caption"), sale.stock_history, sale.initial, now);
  text(field("window"), `${when(sale.start_ms)} – ${when(sale.end_ms)}`);
  text(field("time_left"), timeLeft(sale, now));
  text(field("price"), sale.price ?? "—");
  text(field("limit"), count(sale.limit));
  text(field("paused_since"), sale.paused_ms == null ? "—" : when(sale.paused_ms));
  text(field("accepted"), count(sale.accepted));
  text(field("accepted_per_s"), perSecond(sale.accepted_per_s));
  text(field("persisted"), count(sale.persisted));
  text(field("stream_length"), count(sale.stream_length));
  text(field("lag"), count(sale.lag));
  text(field("pending"), count(sale.pending));
  text(field("oldest_pending"), sale.pending ? duration(sale.oldest_pending_age_ms) : "—");
  text(field("dead_letters"), count(sale.dead_letters));
  field("dead_letters").classList.toggle("bad", sale.dead_letters > 0);
  const room = el.querySelector(".room");
  room.hidden = !sale.room;
  if (sale.room) {
    text(field("room_waiting"), count(sale.room.waiting));
    text(field("room_admitted"), count(sale.room.admitted));
    text(field("room_joined"), count(sale.room.joined));
    text(field("room_pace"), perSecond(sale.room.admit_per_sec));
    // Below the ceiling: the backend is strained (orders wait to be persisted).
    field("room_pace").classList.toggle("bad", sale.room.admit_per_sec < sale.room.ceiling_per_sec);
    text(field("room_bounds"), `${count(sale.room.floor_per_sec)}–${count(sale.room.ceiling_per_sec)}`);
    text(field("room_active"), sale.room.active_cap == null
      ? "no cap"
      : `${count(sale.room.active)} of ${count(sale.room.active_cap)}`);
    text(field("room_wait"), duration(sale.room.wait_at_back_ms));
  }
  const body = el.querySelector(".consumers tbody");
  const rows = sale.consumers.map((c) => {
    const tr = document.createElement("tr");
    tr.dataset.consumer = c.name;
    for (const v of [c.name, count(c.pending), duration(c.idle_ms)]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.append(td);
    }
    return tr;
  });
  body.replaceChildren(...rows);
}

// ---- the controls: each a POST of the session's, with the page's token

const csrfToken = () => document.querySelector('meta[name="csrf-token"]').content;

// One action of the page's session: `{ ok, answer }` (the API's JSON), or
// thrown when nothing answered.
async function postAction(body) {
  const response = await fetch("/admin/dashboard/action", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-csrf-token": csrfToken() },
    body: JSON.stringify(body),
  });
  return { ok: response.ok, status: response.status, answer: await response.json().catch(() => ({})) };
}

async function act(el, action, extra) {
  const result = el.querySelector('[data-field="control-result"]');
  const body = { product_id: el.dataset.product, action, ...extra };
  text(result, `${action}…`);
  try {
    const response = await postAction(body);
    const answer = response.answer;
    if (response.ok && action === "room") {
      text(result, `room: ${count(answer.floor_per_sec)}–${count(answer.ceiling_per_sec)} /s, cap ${answer.active_cap == null ? "none" : count(answer.active_cap)}`);
      result.className = "note good";
    } else if (response.ok && action === "restock") {
      const units = extra.units > 0 ? `+${count(extra.units)}` : `−${count(-extra.units)}`;
      text(result, answer.applied === false
        ? `restock ${units}: done before (this retry changed nothing; stock ${count(answer.stock)} of ${count(answer.initial_qty)})`
        : `restock ${units} units: done (stock ${count(answer.stock)} of ${count(answer.initial_qty)})`);
      result.className = "note good";
    } else if (response.ok) {
      text(result, `${action}: done (stock ${count(answer.stock)} of ${count(answer.initial_qty)})`);
      result.className = "note good";
    } else {
      // The API's own answer: its code and message.
      text(result, `${action} refused: ${answer.error || response.status}: ${answer.message || ""}`);
      result.className = "note bad";
    }
  } catch (e) {
    text(result, `${action}: no answer (${e.message})`);
    result.className = "note bad";
    return false;
  }
  return true;
}

// The new sale's form: the admin API's body, created and opened at once.
async function createSale(form) {
  const result = document.getElementById("create-result");
  const f = (name) => form.elements[name].value.trim();
  const at = (name) => new Date(f(name)).getTime();
  const product = {
    product_id: f("product_id"),
    title: f("title"),
    price: f("price"),
    available_qty: Number.parseInt(f("available_qty"), 10),
    start_time: at("start"),
    end_time: at("end"),
    limit_per_user: Number.parseInt(f("limit_per_user"), 10) || 1,
  };
  if (f("ceiling")) {
    product.waiting_room = {
      ceiling_per_sec: Number.parseInt(f("ceiling"), 10),
      admission_secs: Number.parseInt(f("admission"), 10) || 120,
    };
  }
  text(result, "creating…");
  try {
    const response = await postAction({ product_id: product.product_id, action: "create", product });
    const answer = response.answer;
    if (response.ok) {
      text(result, `${product.product_id}: created and open (stock ${count(answer.stock)})`);
      result.className = "note good";
    } else {
      text(result, `refused: ${answer.error || response.status}: ${answer.message || ""}`);
      result.className = "note bad";
    }
  } catch (e) {
    text(result, `no answer (${e.message})`);
    result.className = "note bad";
  }
}

function localInput(ms) {
  const d = new Date(ms - new Date().getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 16);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("replay").addEventListener("click", async () => {
    const result = document.getElementById("replay-result");
    const response = await postAction({ product_id: "", action: "replay" }).catch(() => null);
    const answer = response ? response.answer : {};
    text(result, response && response.ok
      ? `${count(answer.replaying)} dead letters to be delivered again`
      : `refused: ${answer.error || "no answer"}: ${answer.message || ""}`);
  });
  const form = document.getElementById("create");
  form.elements.start.value = localInput(Date.now());
  form.elements.end.value = localInput(Date.now() + 3600000);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    createSale(form);
  });
});

// 128 random bits as hex (crypto.randomUUID needs a secure context; a
// dashboard may be served over plain HTTP inside a network).
const newKey = () =>
  Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");

function wireControls(el) {
  const on = (name, run) => el.querySelector(`[data-act="${name}"]`).addEventListener("click", run);
  on("pause", () => act(el, "pause"));
  on("resume", () => act(el, "resume"));
  // A restock is applied once however it is clicked: the button waits for
  // the answer, and the page's key for it (sent as `restock_key`) is kept
  // until an answer comes, so a retry after no answer is the same restock.
  on("restock", async (e) => {
    const button = e.currentTarget;
    if (button.disabled) return;
    const parsed = Number.parseInt(el.querySelector('[data-field="units"]').value, 10);
    const units = Number.isNaN(parsed) ? 0 : parsed;
    if (units < 0 && !window.confirm(`Take ${-units} units of ${el.dataset.product} off sale?`)) return;
    if (el.dataset.restockUnits !== String(units)) {
      el.dataset.restockKey = newKey();
      el.dataset.restockUnits = String(units);
    }
    button.disabled = true;
    try {
      if (await act(el, "restock", { units, restock_key: el.dataset.restockKey })) {
        delete el.dataset.restockKey;
        delete el.dataset.restockUnits;
      }
    } finally {
      button.disabled = false;
    }
  });
  on("room", () => {
    const bound = (name) => {
      const v = el.querySelector(`[data-field="${name}"]`).value.trim();
      return v === "" ? undefined : Number.parseInt(v, 10);
    };
    act(el, "room", { ceiling_per_sec: bound("ceiling"), floor_per_sec: bound("floor"), active_cap: bound("cap") });
  });
  on("close", () => {
    if (window.confirm(`Close ${el.dataset.product} now? No order is taken after this, and it cannot be opened again.`)) {
      act(el, "close");
    }
  });
}

function renderControls(el, sale) {
  const over = sale.state === "ended";
  el.querySelector(".controls").hidden = over;
  el.querySelector('[data-act="pause"]').hidden = sale.state === "paused";
  el.querySelector('[data-act="resume"]').hidden = sale.state !== "paused";
  el.querySelector(".room-controls").hidden = !sale.room;
  // The room's fields start at its bounds as they are (once: then they
  // are the operator's).
  if (sale.room && !el.dataset.boundsShown) {
    el.dataset.boundsShown = "1";
    el.querySelector('[data-field="ceiling"]').value = sale.room.ceiling_per_sec;
    el.querySelector('[data-field="floor"]').value = sale.room.floor_per_sec;
    el.querySelector('[data-field="cap"]').value = sale.room.active_cap ?? 0;
  }
}

function renderSales(snapshot) {
  const root = document.getElementById("sales");
  const template = document.getElementById("sale-template");
  const seen = new Set();
  for (const sale of snapshot.sales) {
    seen.add(sale.product_id);
    let el = root.querySelector(`section[data-product="${CSS.escape(sale.product_id)}"]`);
    if (!el) {
      el = template.content.firstElementChild.cloneNode(true);
      el.dataset.product = sale.product_id;
      el.querySelector('[data-field="report"]').href =
        `/admin/dashboard/report/${encodeURIComponent(sale.product_id)}`;
      wireControls(el);
      root.append(el);
    }
    renderSale(el, sale, snapshot.at_ms);
    renderControls(el, sale);
  }
  for (const el of [...root.children]) {
    if (!seen.has(el.dataset.product)) el.remove();
  }
  document.getElementById("no-sales").hidden = snapshot.sales.length > 0;
  // The log's sale filter offers the open sales.
  const offered = document.getElementById("log-sales");
  const ids = snapshot.sales.map((s) => s.product_id);
  if (offered.dataset.ids !== ids.join(",")) {
    offered.dataset.ids = ids.join(",");
    offered.replaceChildren(...ids.map((id) => {
      const option = document.createElement("option");
      option.value = id;
      return option;
    }));
  }
  const more = document.getElementById("more-sales");
  more.hidden = snapshot.sales_not_shown === 0;
  text(more, `${count(snapshot.sales_not_shown)} more open sales not shown.`);
}

// The admin log: its newest entries every few seconds (one sale's when
// the filter names one; older pages on request, which stop the refresh
// until "Newest").
const logView = { before: null, oldest: null };

// A value of the log as one line of text (JSON: what was asked, before,
// after).
function logValue(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "string" ? v : JSON.stringify(v);
}

// Epoch ms as the browser's local date and time, to the second.
function logWhen(ms) {
  const d = new Date(ms);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString()}`;
}

async function loadLog() {
  const params = new URLSearchParams();
  const sale = document.getElementById("log-sale").value.trim();
  if (sale) params.set("sale", sale);
  if (logView.before !== null) params.set("before", String(logView.before));
  const response = await fetch(`/admin/dashboard/log?${params}`, {
    credentials: "same-origin",
    cache: "no-store",
  });
  if (!response.ok) return;
  const { entries } = await response.json();
  const body = document.querySelector("#admin-log tbody");
  const rows = entries.map((e) => {
    const tr = document.createElement("tr");
    tr.dataset.id = String(e.id);
    const change = e.before !== null || e.after !== null
      ? `${logValue(e.before) || "–"} → ${logValue(e.after) || "–"}` : "";
    const cells = [logWhen(e.at), e.action, e.product_id || "", e.actor, e.address || "",
      e.status ? String(e.status) : "", logValue(e.asked), change];
    for (const value of cells) {
      const td = document.createElement("td");
      text(td, value);
      tr.appendChild(td);
    }
    if (e.action === "auth.failed" || e.action === "dashboard.forged") tr.className = "bad";
    return tr;
  });
  body.replaceChildren(...rows);
  logView.oldest = entries.length ? entries[entries.length - 1].id : null;
  document.getElementById("log-older").disabled = entries.length === 0;
  document.body.dataset.logRows = String(rows.length);
}

async function pollLog() {
  try {
    if (logView.before === null) await loadLog();
  } catch (e) {
    // The sales' poll says when the connection is lost.
  }
  setTimeout(pollLog, 5000);
}

function wireLog() {
  const reload = () => { loadLog().catch(() => {}); };
  document.getElementById("log-sale").addEventListener("change", () => {
    logView.before = null;
    reload();
  });
  document.getElementById("log-newest").addEventListener("click", () => {
    logView.before = null;
    reload();
  });
  document.getElementById("log-older").addEventListener("click", () => {
    if (logView.oldest !== null) logView.before = logView.oldest;
    reload();
  });
}

let ticks = 0;
async function poll() {
  let next = 1000;
  const status = document.getElementById("status");
  try {
    const response = await fetch("/admin/dashboard/data", {
      credentials: "same-origin",
      cache: "no-store",
    });
    if (response.status === 401) {
      // The session ended: the page answers with the login form.
      window.location.reload();
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const snapshot = await response.json();
    next = snapshot.tick_ms || next;
    renderInstance(snapshot.instance);
    renderFleet(snapshot.fleet || [], snapshot.at_ms);
    renderSales(snapshot);
    ticks += 1;
    document.body.dataset.ticks = String(ticks);
    const at = new Date(snapshot.at_ms).toLocaleTimeString();
    if (snapshot.redis_error) {
      text(status, `Redis unavailable at ${at}: ${snapshot.redis_error}`);
      status.className = "bad";
    } else {
      text(status, `updated ${at}`);
      status.className = "good";
    }
  } catch (e) {
    text(status, `connection lost (${e.message}); retrying`);
    status.className = "bad";
  }
  setTimeout(poll, next);
}

document.addEventListener("DOMContentLoaded", poll);
document.addEventListener("DOMContentLoaded", pollLog);
document.addEventListener("DOMContentLoaded", wireLog);
