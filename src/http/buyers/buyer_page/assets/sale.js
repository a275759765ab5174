// The buyer's page: a client of the public JSON API like any other
// (GET /api/products/{id}, the waiting room's join and polls,
// POST /api/orders, GET /api/orders/{id}). Text only (textContent), never
// markup from data. Polls come when the server's poll_after_ms says, never
// sooner.
"use strict";

const $ = (id) => document.getElementById(id);

const page = {
  // "none" (AUTH=none: a user id field) or "buyer" (verified buyers),
  // rendered by the server.
  auth: document.body.dataset.auth,
  productId: decodeURIComponent(location.pathname.split("/")[2] || ""),
  token: null,
  // The server's clock minus this one (ms), from a Date header: a
  // countdown by a phone's clock minutes off would be wrong.
  offset: 0,
  product: null,
  // idle, joining, waiting, sold-out, admitted, ordering, following,
  // done, over (nothing more to do).
  flow: "idle",
  ticket: null,
  admission: null,
  order: null,
  poll: null,
  expiryPolled: false,
  pausedUntil: 0,
};

const store = {
  get(key) {
    try { return sessionStorage.getItem(key); } catch { return null; }
  },
  set(key, value) {
    try { sessionStorage.setItem(key, value); } catch { /* storage off: memory only */ }
  },
};

// The embedding shop hands a bearer token in the fragment (#token=...),
// which never reaches a server log or a Referer. Taken out of the address
// bar at once; kept for this tab only, so a reload keeps the buyer.
function takeToken() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("token")) {
    const token = params.get("token");
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    if (token && page.auth === "buyer") store.set("flashsale.token", token);
  }
  return page.auth === "buyer" ? store.get("flashsale.token") : null;
}

const serverNow = () => Date.now() + page.offset;

function learnClock(response, sent) {
  const date = Date.parse(response.headers.get("Date") || "");
  if (!Number.isFinite(date)) return;
  // The header counts whole seconds: the server's time was in [date, date + 1 s).
  const offset = date + 500 - (sent + Date.now()) / 2;
  page.offset = Math.abs(offset) > 1500 ? offset : 0;
}

async function api(method, path, { body, headers = {}, clock = false } = {}) {
  const h = { Accept: "application/json", ...headers };
  if (page.token) h.Authorization = `Bearer ${page.token}`;
  const init = { method, headers: h, cache: "no-store", credentials: "same-origin" };
  if (body !== undefined) {
    h["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const sent = Date.now();
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    return { ok: false, status: 0, data: null, error: "network",
      message: "the connection failed", retryAfterMs: 3000 };
  }
  if (clock) learnClock(response, sent);
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  const retry = Number(response.headers.get("Retry-After"));
  return {
    ok: response.ok,
    status: response.status,
    data,
    error: data && data.error,
    message: (data && data.message) || `HTTP ${response.status}`,
    retryAfterMs: Number.isFinite(retry) && retry > 0 ? retry * 1000 : null,
  };
}

// ---- formatting

function text(el, value) {
  if (el.textContent !== value) el.textContent = value;
}
function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const pad = (n) => String(n).padStart(2, "0");
  const hms = h || d ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
  return d ? `${d} d ${hms}` : hms;
}
function span(ms) {
  const s = ms / 1000;
  if (s < 90) return `${Math.max(1, Math.round(s))} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
// The server's estimate is at the current pace, which follows the
// backend: shown as the server's range (at the pace's ceiling; should
// strain halve it), or 25% either side of the estimate without one.
function etaRange(ms, min, max) {
  if (ms <= 0) return "any moment";
  const low = span(Number.isFinite(min) ? min : ms * 0.75);
  const high = span(Number.isFinite(max) ? max : ms * 1.25);
  return low === high ? `about ${low}` : `${low} – ${high}`;
}
const timeOfDay = (ms) => new Date(ms - page.offset).toLocaleTimeString();
function when(ms) {
  const at = new Date(ms - page.offset);
  const today = new Date().toDateString() === at.toDateString();
  return today ? at.toLocaleTimeString() : at.toLocaleString();
}
const number = new Intl.NumberFormat();
function price(p) {
  const n = Number(p);
  return Number.isFinite(n)
    ? new Intl.NumberFormat(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 2 }).format(n)
    : p;
}
function sentence(message) {
  const m = String(message || "").trim();
  if (!m) return "";
  const s = m[0].toUpperCase() + m.slice(1);
  return /[.!?]$/.test(s) ? s : `${s}.`;
}

// ---- what the page shows

function say(message, tone = "") {
  const status = $("status");
  text(status, message);
  status.className = `status ${tone}`;
}

function setFlow(flow) {
  page.flow = flow;
  document.body.dataset.phase = flow;
  render();
}

const STEP = { idle: "join", joining: "join", waiting: "wait",
  "sold-out": "wait", admitted: "turn", ordering: "order", following: "order", done: "done" };

function renderSteps() {
  const current = STEP[page.flow];
  let passed = !!current;
  for (const li of $("steps").children) {
    const here = li.dataset.step === current;
    if (here) passed = false;
    li.classList.toggle("passed", passed || page.flow === "done");
    if (here) li.setAttribute("aria-current", "step");
    else li.removeAttribute("aria-current");
  }
}

function isOver(p, now) {
  return ["ended", "closed", "retired"].includes(p.state) || now >= p.end_time;
}

function render() {
  const p = page.product;
  if (!p) return;
  const now = serverNow();
  const room = p.waiting_room;
  const over = isOver(p, now);
  const started = now >= p.start_time;
  const joinOpens = room ? p.start_time - room.join_early_secs * 1000 : p.start_time;
  const flow = page.flow;

  // The countdown: to the start, then to the end.
  const paused = !over && !!p.paused;
  if (over) {
    text($("countdown-label"), "The sale");
    text($("countdown"), "has ended");
  } else if (paused) {
    text($("countdown-label"), "The sale");
    text($("countdown"), "is paused");
  } else if (!started) {
    text($("countdown-label"), "Starts in");
    text($("countdown"), clock(p.start_time - now));
  } else {
    text($("countdown-label"), "On sale now · ends in");
    text($("countdown"), clock(p.end_time - now));
  }
  let note = `${started ? "Started" : "Starts"} ${when(p.start_time)}.`;
  if (room && !over && !started) {
    note += now < joinOpens
      ? ` Joining the line opens at ${when(joinOpens)}.`
      : " The line is open: everyone who joins before the start gets a place drawn at random when it starts, so joining early gains nothing.";
  } else if (room && !over) {
    note += " Buyers are let in from the line at a steady pace.";
  }
  if (paused) {
    note = "The shop has paused the sale for a moment: orders resume shortly, and your place in the line is kept.";
    // Looked at again every few seconds, until it resumes.
    if (!page.pauseCheck) {
      page.pauseCheck = setTimeout(() => { page.pauseCheck = null; refreshProduct(); }, 5000);
    }
  }
  text($("when-note"), note);

  // Buttons: real ones, shown only when they can be used.
  const join = $("join");
  join.hidden = !room || !["idle", "joining"].includes(flow) || over;
  join.disabled = flow === "joining" || now < joinOpens || Date.now() < page.pausedUntil;
  text(join, flow === "joining" ? "Joining…" : "Join the line");
  const buy = $("buy");
  buy.hidden = (over && flow !== "ordering")
    || (room ? !["admitted", "ordering"].includes(flow) : !["idle", "ordering"].includes(flow));
  buy.disabled = flow === "ordering" || !started || paused || Date.now() < page.pausedUntil;
  text(buy, flow === "ordering" ? "Ordering…" : "Buy now");

  $("turn").hidden = flow !== "admitted";
  // Once ordered, the order is what matters, not the line.
  if (["following", "done"].includes(flow)) $("line").hidden = true;
  if (flow === "admitted" && page.admission) {
    const left = page.admission.expires_at - now;
    text($("admission-left"), clock(left));
    if (left <= 0 && !page.expiryPolled) {
      // Ran out unused: the server says so (expired), and what next.
      page.expiryPolled = true;
      schedulePoll(500);
    }
  }
  $("steps").hidden = !room;
  renderSteps();
}

function renderProduct(p) {
  document.title = `${p.title} · flash sale`;
  text($("title"), p.title);
  text($("price"), `Price ${price(p.price)}`);
  text($("stock"), p.stock === null || p.stock === undefined ? "—"
    : p.stock === 0 ? "sold out" : `${number.format(p.stock)} of ${number.format(p.initial_qty)}`);
  text($("limit"), `${number.format(p.limit_per_user)}`);
  text($("ends"), when(p.end_time));
  const quantity = $("quantity");
  quantity.max = String(p.limit_per_user);
  $("quantity-field").hidden = p.limit_per_user <= 1;
}

// ---- who is buying

function buyer() {
  if (page.auth !== "none") return {};
  const field = $("user-id");
  const id = Number(field.value);
  if (!Number.isSafeInteger(id) || id < 1) {
    say("Enter your user id (a whole number from 1) to take part.", "bad");
    field.setAttribute("aria-invalid", "true");
    field.focus();
    return null;
  }
  field.removeAttribute("aria-invalid");
  store.set("flashsale.user", String(id));
  return { user_id: id };
}

// One key per sale and buyer in this tab: a retry, or a reload, gets the
// same order back instead of a second one.
function idempotencyKey(who) {
  const name = `flashsale.key.${page.productId}.${who.user_id || "me"}`;
  let key = store.get(name);
  if (!key) {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    key = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    store.set(name, key);
  }
  return key;
}

// ---- the order

async function buy() {
  const who = buyer();
  if (!who) return;
  const quantity = Math.max(1, Math.min(Number($("quantity").value) || 1, page.product.limit_per_user));
  const headers = { "Idempotency-Key": idempotencyKey(who) };
  if (page.admission) headers["Admission-Token"] = page.admission.token;
  $("user-id").readOnly = true;
  const before = page.flow;
  setFlow("ordering");
  say("Placing your order…");
  const r = await api("POST", "/api/orders",
    { body: { product_id: page.productId, quantity, ...who }, headers });
  if (r.ok) {
    page.order = r.data;
    showOrder(r.data);
    setFlow("following");
    say("Your order is accepted: the units are yours. Confirming it…", "good");
    follow(0);
    return;
  }
  setFlow(before);
  refused(r);
}

function showOrder(order) {
  $("order").hidden = false;
  text($("order-id"), order.order_id);
  const status = order.status === "pending" ? "accepted, confirming…" : order.status;
  text($("order-status"), order.provisional ? `${status} (provisional)` : status);
}

// An order is answered 202 at once and persisted a moment later: asked
// again after 0.5 s, then less often, up to every 5 s.
async function follow(attempt) {
  const delay = Math.min(500 * 2 ** attempt, 5000);
  await new Promise((resolve) => setTimeout(resolve, delay));
  const r = await api("GET", `/api/orders/${encodeURIComponent(page.order.order_id)}`);
  if (!r.ok) {
    if (r.status === 0 || r.status === 429 || r.status >= 500) {
      setTimeout(() => follow(attempt + 1), r.retryAfterMs || 0);
    } else {
      say(`${sentence(r.message)}`, "bad");
    }
    return;
  }
  page.order = r.data;
  showOrder(r.data);
  switch (r.data.status) {
    case "pending":
      follow(attempt + 1);
      return;
    case "confirmed":
      setFlow("done");
      say("Your order is confirmed.", "good");
      break;
    case "paid":
      setFlow("done");
      say("Your order is paid.", "good");
      break;
    default:
      setFlow("over");
      say(`Your order is ${r.data.status}.`, "bad");
  }
  refreshProduct();
}

// ---- refusals: the API's message, and what the page does next

function refused(r) {
  const message = sentence(r.message);
  switch (r.error) {
    case "sold_out":
      setFlow("over");
      say(message, "bad");
      refreshProduct();
      return;
    case "sale_ended":
      setFlow("over");
      say(message, "bad");
      return;
    case "admission_expired":
      page.admission = null;
      say(message, "bad");
      schedulePoll(0);
      return;
    case "admission_required":
      // Not (or no longer) this buyer's turn: where the ticket stands says why.
      page.admission = null;
      say(message, "bad");
      if (page.ticket) schedulePoll(0);
      else setFlow("idle");
      return;
    case "queue_not_open":
      say(`The line is not open yet: joining opens at ${when(page.product.start_time - page.product.waiting_room.join_early_secs * 1000)}.`, "bad");
      return;
    case "sale_paused":
      say(`${message} Orders resume shortly: try again in a moment.`, "bad");
      pause(r.retryAfterMs);
      refreshProduct();
      return;
    case "sale_not_started":
      say(`The sale has not started: it starts at ${when(r.data.starts_at || page.product.start_time)}.`, "bad");
      pause(r.retryAfterMs);
      return;
    case "unauthorized":
      say(`${message} Open this page from the shop to sign in.`, "bad");
      return;
    case "product_not_found":
    case "no_waiting_room":
      setFlow("over");
      say(message, "bad");
      return;
    default:
      if (r.status === 0 || r.status === 429 || r.status >= 500) {
        say(`${message} Try again in ${span(r.retryAfterMs || 3000)}.`, "bad");
        pause(r.retryAfterMs || 3000);
      } else {
        say(message, "bad");
      }
  }
}

// The buttons wait as long as the server asked (Retry-After).
function pause(ms) {
  if (!ms) return;
  page.pausedUntil = Date.now() + ms;
  render();
  setTimeout(render, ms + 50);
}

async function refreshProduct() {
  const r = await api("GET", `/api/products/${encodeURIComponent(page.productId)}`);
  if (r.ok) {
    page.product = r.data;
    renderProduct(r.data);
    render();
  }
}

// ---- start

async function start() {
  page.token = takeToken();
  if (page.auth === "none") {
    $("user-field").hidden = false;
    const user = store.get("flashsale.user");
    if (user) $("user-id").value = user;
  }
  $("join").addEventListener("click", join);
  $("buy").addEventListener("click", buy);
  // Enter in a field does what the visible button does. The form has two
  // fields and no submit button, so a browser submits nothing by itself:
  // Enter asks for the submission.
  $("buyer").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.target instanceof HTMLInputElement) {
      e.preventDefault();
      $("buyer").requestSubmit();
    }
  });
  $("buyer").addEventListener("submit", (e) => {
    e.preventDefault();
    for (const button of [$("join"), $("buy")]) {
      if (!button.hidden && !button.disabled) {
        button.click();
        return;
      }
    }
  });
  const r = await api("GET", `/api/products/${encodeURIComponent(page.productId)}`, { clock: true });
  if (!r.ok) {
    text($("title"), r.status === 404 ? "No sale here" : "The sale cannot be shown");
    text($("countdown"), "—");
    document.body.dataset.phase = "missing";
    say(r.status === 404 ? sentence(r.message) : `${sentence(r.message)} Reload to try again.`, "bad");
    return;
  }
  page.product = r.data;
  renderProduct(r.data);
  if (r.data.stock === 0) say("Sold out for now.", "bad");
  setFlow("idle");
  // The countdown, on the second.
  const tick = () => {
    render();
    setTimeout(tick, 1000 - (serverNow() % 1000) + 5);
  };
  tick();
}

document.addEventListener("DOMContentLoaded", start);
