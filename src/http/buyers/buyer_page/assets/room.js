// The buyer's page, its waiting room: the proof of work a join may ask
// (pow.js), joining, and the polls of where the ticket stands, each when
// the server's poll_after_ms says. Loaded before sale.js, which shares its
// page state and draws what these learn.

async function proofOfWork(who) {
  const id = encodeURIComponent(page.productId);
  const c = await api("GET", `/api/sales/${id}/challenge`);
  if (!c.ok) return { refused: c };
  const { challenge, difficulty } = c.data;
  if (!difficulty) return { proof: null };
  const user = page.auth === "none" ? who.user_id : c.data.user_id;
  if (user === undefined || user === null) return { proof: null };
  say("Proving you are a person, not a script: a short computation (it takes a few seconds at most).");
  const { nonce } = await solveProof(challenge, user, difficulty);
  return { proof: `${challenge}.${nonce}` };
}

async function join() {
  const who = buyer();
  if (!who) return;
  $("user-id").readOnly = true;
  setFlow("joining");
  const work = await proofOfWork(who);
  if (work.refused) {
    setFlow("idle");
    $("user-id").readOnly = false;
    refused(work.refused);
    return;
  }
  const r = await api("POST", `/api/sales/${encodeURIComponent(page.productId)}/queue`,
    { body: page.auth === "none" ? who : undefined,
      headers: work.proof ? { "Join-Proof": work.proof } : {} });
  if (!r.ok) {
    setFlow("idle");
    $("user-id").readOnly = false;
    refused(r);
    return;
  }
  page.ticket = r.data.ticket;
  standing(r.data);
}

function schedulePoll(ms) {
  clearTimeout(page.poll);
  page.poll = setTimeout(poll, ms);
}

async function poll() {
  if (!page.ticket) return;
  const path = `/api/sales/${encodeURIComponent(page.productId)}/queue/${encodeURIComponent(page.ticket)}`;
  const r = await api("GET", path);
  if (r.ok) {
    standing(r.data);
  } else if (r.status === 0 || r.status === 429 || r.status >= 500) {
    say(`${sentence(r.message)} Asking again in ${span(r.retryAfterMs || 5000)}.`, "bad");
    schedulePoll(r.retryAfterMs || 5000);
  } else {
    refused(r);
  }
}

function standing(s) {
  const line = $("line");
  switch (s.status) {
    case "waiting": {
      line.hidden = false;
      if (s.place === null) {
        // Before the draw; or just after it, until the service has counted
        // everyone who joined before the start.
        const drawn = s.draw_at <= serverNow();
        text($("place"), drawn ? "coming…" : "drawn at the start");
        text($("ahead"), "—");
        text($("eta"), "—");
        text($("line-note"), drawn
          ? "The sale has started: your place comes with the next answer."
          : `Everyone who joined before the start gets a place drawn at random at ${timeOfDay(s.draw_at)}.`);
        if (page.flow !== "waiting") say("You are in the line.", "good");
      } else {
        text($("place"), number.format(s.place));
        text($("ahead"), number.format(s.ahead));
        text($("eta"), etaRange(s.estimated_wait_ms, s.estimated_wait_min_ms, s.estimated_wait_max_ms));
        text($("line-note"), `The wait is an estimate at the current pace (${number.format(s.admit_per_sec)} buyers a second); it may change. This page asks again when the service says to.`);
        if (page.flow !== "waiting" || $("status").dataset.place !== String(s.place)) {
          say(`You are number ${number.format(s.place)} in line.`, "good");
          $("status").dataset.place = String(s.place);
        }
      }
      setFlow("waiting");
      keepFocus($("line-title"));
      schedulePoll(s.poll_after_ms);
      break;
    }
    case "admitted":
      page.admission = { token: s.admission, expires_at: s.expires_at };
      page.expiryPolled = false;
      text($("place"), number.format(s.place));
      text($("ahead"), "0");
      text($("eta"), "now");
      text($("line-note"), "");
      setFlow("admitted");
      say(`It’s your turn: buy before ${timeOfDay(s.expires_at)}.`, "good");
      keepFocus($("buy"));
      break;
    case "expired":
      // Final: joining again gives the same ticket, whose place has passed.
      page.admission = null;
      line.hidden = true;
      setFlow("over");
      say(`Your turn ran out at ${timeOfDay(s.expired_at)} without an order: each place in line gets one turn.`, "bad");
      break;
    case "sold_out":
      line.hidden = true;
      setFlow("sold-out");
      say("Sold out for now. Units that unpaid orders give back go to the next buyers in line: this page keeps your place and checks again.", "bad");
      schedulePoll(s.poll_after_ms || 5000);
      break;
    case "ended":
    default:
      line.hidden = true;
      setFlow("over");
      say("The sale has ended.", "bad");
  }
}

// Focus follows the buyer's next step when the control they used went away.
function keepFocus(el) {
  const active = document.activeElement;
  if (active === el) return;
  // (or was on a heading this page focused before).
  if (!active || active === document.body || active.hidden || active.disabled
    || (active.tabIndex === -1 && active.tagName !== "BUTTON")) {
    if (!el.hasAttribute("tabindex") && el.tagName !== "BUTTON") el.tabIndex = -1;
    el.focus();
  }
}

