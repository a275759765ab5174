//! `GET /metrics` (Prometheus text format): the counters (the order path
//! counts its answers with `Metrics::count_order`), and each open sale's
//! gauges read from Redis at the scrape. The API's port is public: there,
//! an anonymous scrape sees a sale's gauges once it has started (an
//! upcoming sale's id, stock and start are not told before it is
//! announced by starting); a scrape with the admin token (`Authorization:
//! Bearer`), and the worker's metrics listener on an address of the
//! operator's, see every open sale.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::state::Operators;
use super::watched::Watched;
use crate::domain::Chain;
use crate::metrics::Metrics;
use crate::sale::room::RoomState;
use crate::sale::{Counter, Counts, StreamView};
use crate::store::{Outage, Topology};

/// Most sales whose gauges one scrape reads from Redis.
const MAX_SALES_SCRAPED: usize = 500;

/// `GET /metrics`: the counters, and each open sale's gauges read from Redis
/// now. A sale Redis cannot describe is left out (and logged), not a 5xx:
/// the scrape still shows everything else.
pub async fn metrics(State(state): State<Operators>, headers: HeaderMap) -> Response {
    let m = &state.metrics;
    m.orders_in_flight
        .set(state.door.guards().in_flight() as i64);
    let (users, ips) = state.door.guards().tracked_keys();
    m.rate_limit_keys
        .with_label_values(&["user"])
        .set(users as i64);
    m.rate_limit_keys.with_label_values(&["ip"]).set(ips as i64);
    m.connections_open.set(state.connections.open() as i64);
    for why in crate::http::transport::conn::Ended::ALL {
        let counter = m.connections_ended.with_label_values(&[why.label()]);
        counter.inc_by(state.connections.ended(why).saturating_sub(counter.get()));
    }
    let operator = match (&state.admin_token, crate::http::extract::bearer(&headers)) {
        // Constant time: the comparison must not reveal how much of a guess was right.
        (Some(token), Some(presented)) => bool::from(presented.ct_eq(token.as_bytes())),
        _ => false,
    };
    let shown = if operator { Shown::All } else { Shown::Started };
    scrape(m, &state.watched, shown).await
}

/// Which open sales a scrape shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// Those that have started (the public port).
    Started,
    /// Every one (a listener of the operator's).
    All,
}

/// The worker-only process's metrics listener: `GET /metrics`, `GET /healthz`.
pub fn worker_router(metrics: Arc<Metrics>, watched: Watched) -> Router {
    let scraped = |State((m, w)): State<(Arc<Metrics>, Watched)>| async move {
        scrape(&m, &w, Shown::All).await
    };
    Router::new()
        .route("/metrics", get(scraped))
        .route("/healthz", get(crate::http::buyers::health::healthz))
        .with_state((metrics, watched))
}

/// Refreshes the per-sale gauges from Redis and renders everything.
async fn scrape(m: &Metrics, sales: &Watched, shown: Shown) -> Response {
    count_calls(m, sales.counts());
    m.db_retries
        .inc_by(sales.db_retries().saturating_sub(m.db_retries.get()));
    for why in Outage::ALL {
        let c = m.db_unavailable.with_label_values(&[why.label()]);
        c.inc_by(sales.db_outages().get(why).saturating_sub(c.get()));
    }
    let topology = sales.topology();
    for t in Topology::ALL {
        m.books_topology
            .with_label_values(&[t.label()])
            .set(i64::from(t == topology));
    }
    let hidden = read_sales(m, sales, shown).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        without_sales(m.render(), &hidden),
    )
        .into_response()
}

/// `text` without the series of the sales in `hidden`: those the scrape
/// does not show, whoever set their gauges (the workers set the books'
/// verdict of every open sale, upcoming ones too).
fn without_sales(text: String, hidden: &[String]) -> String {
    if hidden.is_empty() {
        return text;
    }
    let labels: Vec<String> = hidden
        .iter()
        .map(|id| format!("product_id=\"{id}\""))
        .collect();
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        if !labels.iter().any(|l| line.contains(l.as_str())) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The sales count their own calls; the counters catch up at each scrape.
fn count_calls(m: &Metrics, counts: &Counts) {
    for (call, now) in [
        ("place_order", counts.get(Counter::OrderCalls)),
        ("memory_read", counts.get(Counter::MemoryReads)),
    ] {
        let counter = m.order_path_calls.with_label_values(&[call]);
        counter.inc_by(now.saturating_sub(counter.get()));
    }
    let orders = &m.order_script_orders;
    let sent = counts.get(Counter::OrdersSent);
    orders.inc_by(sent.saturating_sub(orders.get()));
}

/// Each open sale's gauges, read from Redis now (the last scrape's are
/// dropped first: a retired sale's series go with it). Returns the sales
/// this scrape must not show (not started, on the public port).
async fn read_sales(m: &Metrics, sales: &Watched, shown: Shown) -> Vec<String> {
    let mut hidden = Vec::new();
    for gauge in [
        &m.sale_stock,
        &m.stream_length,
        &m.group_lag,
        &m.group_pending,
        &m.sale_dead_letters,
        &m.room_joined,
        &m.room_admitted,
        &m.room_waiting,
        &m.room_admit_per_sec,
        &m.room_admit_ceiling_per_sec,
        &m.room_admit_floor_per_sec,
        &m.room_wait_seconds,
        &m.room_active,
        &m.room_active_cap,
    ] {
        gauge.reset();
    }
    let open = match sales.lifecycle().open_sales().await {
        Ok(open) => open,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "metrics: cannot list the open sales");
            return hidden;
        }
    };
    let now = crate::domain::now_ms();
    for product in open.iter().take(MAX_SALES_SCRAPED) {
        match sales.watch().view(product).await {
            Ok(w) if shown == Shown::Started && w.start_ms.is_none_or(|start| start > now) => {
                hidden.push(product.to_string());
                continue;
            }
            Ok(w) => set_sale_gauges(m, product.as_str(), &w),
            Err(e) => {
                tracing::warn!(product_id = %product, error = %Chain(&e), "metrics: cannot read the sale");
                continue;
            }
        }
        match sales.room().room(product).await {
            Ok(Some(room)) => set_room_gauges(m, product.as_str(), &room),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(product_id = %product, error = %Chain(&e), "metrics: cannot read the waiting room")
            }
        }
    }
    hidden
}

fn set_room_gauges(m: &Metrics, product_id: &str, room: &RoomState) {
    let id = [product_id];
    let figures = room.figures(crate::domain::now_ms());
    m.room_joined
        .with_label_values(&id)
        .set(figures.joined as i64);
    m.room_admitted
        .with_label_values(&id)
        .set(figures.admitted as i64);
    m.room_waiting
        .with_label_values(&id)
        .set(figures.waiting as i64);
    m.room_admit_per_sec
        .with_label_values(&id)
        .set(room.pace.round() as i64);
    m.room_admit_ceiling_per_sec
        .with_label_values(&id)
        .set(i64::from(room.ceiling));
    m.room_admit_floor_per_sec
        .with_label_values(&id)
        .set(i64::from(room.floor));
    m.room_active
        .with_label_values(&id)
        .set(i64::try_from(room.active).unwrap_or(i64::MAX));
    m.room_active_cap.with_label_values(&id).set(
        room.cap
            .map_or(0, |cap| i64::try_from(cap).unwrap_or(i64::MAX)),
    );
    m.room_wait_seconds
        .with_label_values(&id)
        .set(figures.wait_at_back_ms.div_ceil(1000) as i64);
}

fn set_sale_gauges(m: &Metrics, product_id: &str, w: &StreamView) {
    let id = [product_id];
    m.sale_stock
        .with_label_values(&id)
        .set(w.stock.unwrap_or(0).max(0));
    m.stream_length
        .with_label_values(&id)
        .set(w.stream_length as i64);
    m.sale_dead_letters
        .with_label_values(&id)
        .set(w.dead_letters as i64);
    m.group_pending.with_label_values(&id).set(w.pending as i64);
    if let Some(lag) = w.lag {
        m.group_lag.with_label_values(&id).set(lag as i64);
    }
}
