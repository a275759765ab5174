//! Check 8: the outbox, as the shop's receiver got it. The events are what
//! the books list (`GET /api/admin/events`, paged to the end: the outbox
//! expanded, whatever its rows look like); every one of them was
//! acknowledged by the receiver as `evt_<id>`, signed with the events'
//! secret, with the feed's body for that event (a repeat only ever with the
//! same id and the same body), first received in id order (overall, so per
//! order too), none dead-lettered. And the events say what happened to
//! each order, as `tb_order` and `tb_payment` have it: `order.confirmed`,
//! then `order.paid`, or `order.cancelled` and then `order.paid` (paid
//! again) or `order.refund_due`, each once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::checks::mysql;
use crate::load::Sale;
use crate::receiver::Receiver;
use crate::world::World;

/// An event's id is its outbox row's × this + its place in the row (as
/// the feed's documentation says).
const EVENTS_PER_ROW: i64 = 10_000;

/// One event as the feed lists it.
#[derive(Debug, Clone)]
struct Event {
    id: i64,
    kind: String,
    order_id: Option<String>,
    product_id: Option<String>,
    message: Value,
}

/// The books' events, read through the admin feed from `after` to the end.
struct Feed {
    http: reqwest::Client,
    url: String,
    token: String,
    events: Vec<Event>,
}

impl Feed {
    fn new(world: &World) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            url: format!("{}/api/admin/events", world.api_urls[0]),
            token: world.admin_token.clone(),
            events: Vec::new(),
        }
    }

    /// Reads the pages after the last event read, to the end.
    async fn read_on(&mut self) -> Result<(), String> {
        loop {
            let after = self.events.last().map_or(0, |e| e.id);
            let page: Value = self
                .http
                .get(format!("{}?after={after}&limit=1000", self.url))
                .bearer_auth(&self.token)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("GET /api/admin/events?after={after}: {e}"))?
                .json()
                .await
                .map_err(|e| format!("GET /api/admin/events?after={after}: {e}"))?;
            let items = page["events"].as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                return Ok(());
            }
            for message in items {
                let text = |v: &Value| v.as_str().map(str::to_owned);
                self.events.push(Event {
                    id: message["id"].as_i64().ok_or("an event without an id")?,
                    kind: text(&message["type"]).unwrap_or_default(),
                    order_id: text(&message["data"]["order_id"]),
                    product_id: text(&message["data"]["product_id"]),
                    message,
                });
            }
        }
    }
}

/// Where delivery to an endpoint stands (`tb_event_delivery`).
#[derive(Debug, sqlx::FromRow)]
#[allow(dead_code)] // read by Debug, for the failure message
struct DeliveryRow {
    endpoint: String,
    delivered_up_to: i64,
    lease_owner: Option<String>,
    attempts: i32,
    last_error: Option<String>,
}

/// How the delivery went, for the report.
#[derive(Debug, Default)]
pub struct Delivered {
    /// The books' events, by type.
    pub by_type: BTreeMap<String, u64>,
    /// Acknowledged deliveries, and of how many ids.
    pub acked: usize,
    pub distinct: usize,
    /// 500s the receiver answered on purpose.
    pub failed: u64,
}

impl Delivered {
    pub fn events(&self) -> u64 {
        self.by_type.values().sum()
    }

    pub fn duplicates(&self) -> usize {
        self.acked - self.distinct
    }
}

/// Waits until the receiver has acknowledged every event the books list,
/// as long as delivery moves on (a new event acknowledged within `stall`)
/// and at most `limit`; Ok(how long), or Err(where delivery stands).
pub async fn wait_delivered(
    world: &World,
    receiver: &Receiver,
    stall: Duration,
    limit: Duration,
) -> Result<Duration, String> {
    let mut feed = Feed::new(world);
    let t0 = Instant::now();
    let (mut progress, mut moved) = (0, Instant::now());
    // The feed lists an event once it is `DB_TIMEOUT_MS` + 1 s old: the
    // last payments' events may not be listed yet. Wait for the feed to
    // reach the last outbox row the books hold now (nothing writes any
    // more), so that neither this wait nor the check reads a feed that
    // stops short.
    let last_row: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM tb_event")
        .fetch_one(&mysql(world).await)
        .await
        .unwrap_or(None);
    let reached = |feed: &Feed| match (last_row, feed.events.last()) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(row), Some(e)) => e.id / EVENTS_PER_ROW >= row,
    };
    loop {
        let read = feed.read_on().await;
        let acked: HashSet<String> = receiver
            .received()
            .acked
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        let missing: Vec<i64> = feed
            .events
            .iter()
            .map(|e| e.id)
            .filter(|id| !acked.contains(&format!("evt_{id}")))
            .collect();
        if read.is_ok() && missing.is_empty() && reached(&feed) {
            return Ok(t0.elapsed());
        }
        if acked.len() > progress {
            (progress, moved) = (acked.len(), Instant::now());
        }
        if t0.elapsed() >= limit || moved.elapsed() >= stall {
            let db = mysql(world).await;
            let at: Vec<DeliveryRow> = sqlx::query_as(
                "SELECT endpoint, delivered_up_to, lease_owner, attempts, last_error \
                 FROM tb_event_delivery",
            )
            .fetch_all(&db)
            .await
            .unwrap_or_default();
            return Err(format!(
                "{} of {} events not acknowledged {:.1?} after the books were checked, \
                 the last acknowledgement {:.1?} ago (the first missing: {:?}; the feed: \
                 {read:?}, up to {:?}, the books' last row {last_row:?}); delivery: {at:?}",
                missing.len(),
                feed.events.len(),
                t0.elapsed(),
                moved.elapsed(),
                &missing[..missing.len().min(10)],
                feed.events.last().map(|e| e.id)
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Check 8 (see the module docs); returns the counts and the violations.
pub async fn check(world: &World, receiver: &Receiver, sales: &[Sale]) -> (Delivered, Vec<String>) {
    let mut problems = Vec::new();
    let mut feed = Feed::new(world);
    if let Err(e) = feed.read_on().await {
        problems.push(format!("cannot read the events: {e}"));
    }
    let events = feed.events;
    let db = mysql(world).await;
    let orders: Vec<(String, String)> = sqlx::query_as("SELECT order_id, status FROM tb_order")
        .fetch_all(&db)
        .await
        .expect("read tb_order");
    let paid_with: HashMap<String, String> = sqlx::query_as::<_, (String, String)>(
        "SELECT order_id, result FROM tb_payment WHERE kind = 'payment.succeeded'",
    )
    .fetch_all(&db)
    .await
    .expect("read tb_payment")
    .into_iter()
    .collect();
    let received = receiver.received().clone();

    let mut summary = Delivered {
        acked: received.acked.len(),
        failed: received.failed,
        ..Delivered::default()
    };
    for e in &events {
        *summary.by_type.entry(e.kind.clone()).or_default() += 1;
    }
    if events.windows(2).any(|w| w[1].id <= w[0].id) {
        problems.push("the feed's event ids do not increase".into());
    }
    match dead_letters(world).await {
        Ok(dead) => {
            for d in dead {
                problems.push(format!("an event was dead-lettered: {d}"));
            }
        }
        Err(e) => problems.push(format!("cannot read the dead letters: {e}")),
    }
    for why in received.forged.iter().take(5) {
        problems.push(format!(
            "the receiver got a request it could not verify: {why}"
        ));
    }
    for (id, first, later) in received.changed.iter().take(5) {
        problems.push(format!(
            "{id} came again with another body:\n  {first}\n  {later}"
        ));
    }

    // Each id's first acknowledgement, in arrival order.
    let mut first: Vec<i64> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for (id, _) in &received.acked {
        if !seen.insert(id.as_str()) {
            continue;
        }
        match id.strip_prefix("evt_").and_then(|n| n.parse().ok()) {
            Some(n) => first.push(n),
            None => problems.push(format!("the receiver acknowledged {id}, not an event's id")),
        }
    }
    summary.distinct = seen.len();
    let by_id: HashMap<i64, &Event> = events.iter().map(|e| (e.id, e)).collect();
    for n in &first {
        if !by_id.contains_key(n) {
            problems.push(format!(
                "evt_{n} was delivered and the books list no such event"
            ));
        }
    }
    let delivered: HashSet<i64> = first.iter().copied().collect();
    let lost: Vec<&Event> = events
        .iter()
        .filter(|e| !delivered.contains(&e.id))
        .collect();
    if !lost.is_empty() {
        let show: Vec<String> = lost
            .iter()
            .take(10)
            .map(|e| e.message.to_string())
            .collect();
        problems.push(format!(
            "{} event(s) never acknowledged by the receiver: {}",
            lost.len(),
            show.join(", ")
        ));
    }
    // What each delivered body says: its event, as the feed lists it.
    for e in &events {
        let Some(body) = received.bodies.get(&format!("evt_{}", e.id)) else {
            continue;
        };
        match serde_json::from_str::<Value>(body) {
            Ok(v) if v == e.message => {}
            _ => problems.push(format!(
                "evt_{} was delivered as {body}, the feed lists {}",
                e.id, e.message
            )),
        }
    }
    // In order: the first receptions' ids increase, overall and so per order.
    let inversions: Vec<(i64, i64)> = first
        .windows(2)
        .filter(|w| w[1] < w[0])
        .map(|w| (w[0], w[1]))
        .collect();
    if !inversions.is_empty() {
        problems.push(format!(
            "{} event(s) first received after a later one (before, after): {:?}",
            inversions.len(),
            &inversions[..inversions.len().min(10)]
        ));
    }
    let mut per_order_received: HashMap<&str, Vec<i64>> = HashMap::new();
    for n in &first {
        if let Some(order) = by_id.get(n).and_then(|e| e.order_id.as_deref()) {
            per_order_received.entry(order).or_default().push(*n);
        }
    }
    for (order, ids) in &per_order_received {
        if ids.windows(2).any(|w| w[1] < w[0]) {
            problems.push(format!(
                "order {order}'s events were first received out of order: {ids:?}"
            ));
        }
    }

    // What the events say happened to each order.
    let mut per_order: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in &events {
        if let Some(order) = &e.order_id {
            per_order.entry(order).or_default().push(e.kind.as_str());
        }
    }
    let statuses: HashMap<&str, &str> = orders
        .iter()
        .map(|(id, s)| (id.as_str(), s.as_str()))
        .collect();
    for (order, status) in &orders {
        let want: &[&str] = match (status.as_str(), paid_with.get(order).map(String::as_str)) {
            ("paid", Some("paid")) => &["order.confirmed", "order.paid"],
            ("paid", Some("paid_again")) => &["order.confirmed", "order.cancelled", "order.paid"],
            ("cancelled", Some("refund_due")) => {
                &["order.confirmed", "order.cancelled", "order.refund_due"]
            }
            // Check 7 says what is wrong with the payment; the events
            // must still say what the books did.
            ("cancelled", _) => &["order.confirmed", "order.cancelled"],
            ("paid", _) => &["order.confirmed", "order.paid"],
            _ => &["order.confirmed"],
        };
        let got = per_order.get(order.as_str()).cloned().unwrap_or_default();
        if got != want {
            problems.push(format!(
                "order {order} ({status}, paid {:?}) has the events {got:?}, not {want:?}",
                paid_with.get(order)
            ));
        }
    }
    for order in per_order.keys() {
        if !statuses.contains_key(order) {
            problems.push(format!(
                "events of order {order}, which tb_order does not hold"
            ));
        }
    }
    // Each sale sold out in the books at least once (its last unit booked).
    for sale in sales {
        let sold_out = events
            .iter()
            .any(|e| e.kind == "sale.sold_out" && e.product_id.as_deref() == Some(&sale.id));
        if !sold_out {
            problems.push(format!("{}: no sale.sold_out event", sale.id));
        }
    }
    (summary, problems)
}

/// `GET /api/admin/events/dead`: the dead letters, as JSON texts.
async fn dead_letters(world: &World) -> Result<Vec<String>, String> {
    let page: Value = reqwest::Client::new()
        .get(format!("{}/api/admin/events/dead", world.api_urls[0]))
        .bearer_auth(&world.admin_token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    Ok(page["dead"]
        .as_array()
        .ok_or("no dead letters list")?
        .iter()
        .map(Value::to_string)
        .collect())
}
