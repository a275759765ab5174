//! The dashboard's numbers, read at most once per tick however many
//! browsers ask: the first request after a tick reads Redis (the registry,
//! then one pipelined round trip per open sale, `Watch::view`) and this
//! process's counters, and every viewer gets that same answer until the
//! next tick. Nobody watching: nothing read. Nothing is added to the order
//! path: the counters read are the ones it writes anyway (atomics), and the
//! Redis reads are one pipeline per sale per tick.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::core::Collector;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::domain::answer::{Code, Outcome};
use crate::domain::{ProductId, now_ms};
use crate::http::operators::watched::Watched;
use crate::metrics::{self, Metrics};
use crate::sale::StreamView;
use crate::sale::fleet::{self, Member};
use crate::sale::room::RoomFigures;

/// How often the numbers are read (the page polls at this pace).
pub const TICK: Duration = Duration::from_secs(1);
/// How far back a sale's stock chart goes.
const HISTORY: Duration = Duration::from_secs(5 * 60);
/// The longest gap between two reads that still gives a rate (after a
/// time nobody watched, the first read shows none rather than an average
/// over the gap).
const RATE_SPAN: Duration = Duration::from_secs(3);
/// The window of the accept-to-persist quantiles.
const LATENCY_WINDOW: Duration = Duration::from_secs(60);
/// Most sales read per tick (the registry's first, by id); the rest are
/// counted, not shown.
pub const MAX_SALES_SHOWN: usize = 50;

/// The shared reads, and what is remembered between ticks (stock history,
/// Whether this process runs the stream workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerSite {
    /// In this process; `delivering`: they push the outbox's events too.
    Here {
        delivering: bool,
    },
    Elsewhere,
}

/// the counters of the previous tick for rates).
pub struct Board {
    sales: Watched,
    metrics: Arc<Metrics>,
    /// Where the stream workers run (their counters are this process's).
    workers: WorkerSite,
    tick: Duration,
    reads: Mutex<Reads>,
}

#[derive(Default)]
struct Reads {
    /// The latest answer, serialized once for every viewer.
    latest: Option<(Instant, Arc<str>)>,
    sales: HashMap<String, Track>,
    counters: Option<(Instant, Counters)>,
    /// Cumulative accept-to-persist bucket counts, one per tick.
    persist: VecDeque<(Instant, Vec<u64>)>,
}

/// One sale across ticks.
#[derive(Default)]
struct Track {
    /// `(ms since the epoch, stock)`.
    history: VecDeque<(i64, i64)>,
    /// `accepted` at the previous tick.
    accepted: Option<(Instant, u64)>,
}

/// What the page shows.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub at_ms: i64,
    pub tick_ms: u64,
    /// Redis could not be read this tick (the sales are left out).
    pub redis_error: Option<String>,
    pub instance: Instance,
    pub sales: Vec<SaleView>,
    /// Open sales beyond [`MAX_SALES_SHOWN`].
    pub sales_not_shown: usize,
    /// Every `serve` and `worker` process on the fleet's roll, newest beat
    /// first, with its release (empty when Redis could not be read).
    pub fleet: Vec<FleetView>,
}

/// One process of the deployment, as it last wrote itself on the roll
/// (processes of releases before 0.2.0 do not write themselves there).
#[derive(Debug, Serialize)]
pub struct FleetView {
    #[serde(flatten)]
    pub member: Member,
    /// Not heard from for [`fleet::GONE_AFTER`] (killed, frozen, or cut
    /// off from Redis); a process that stops cleanly leaves the roll.
    pub gone: bool,
}

/// This process's counters: the answers it gave, the rows its workers wrote.
#[derive(Debug, Serialize)]
pub struct Instance {
    pub workers: bool,
    pub orders_total: Outcomes<u64>,
    /// Since the previous read (`None` on the first, or after a gap).
    pub orders_per_s: Option<Outcomes<f64>>,
    pub answered_total: Answerers<u64>,
    pub answered_per_s: Option<Answerers<f64>>,
    pub rows_persisted: u64,
    pub rows_persisted_per_s: Option<f64>,
    /// Over the last minute, from the workers' histogram (bucket bounds).
    pub accept_to_persist_ms: Option<Quantiles>,
    /// The outbox's push to the shop, when this process's workers do it.
    pub events: Option<EventsView>,
}

/// Events pushed to the shop's endpoint, by this process's workers.
#[derive(Debug, Serialize)]
pub struct EventsView {
    /// Recorded and not yet delivered.
    pub behind: i64,
    /// Given up on, waiting for a replay.
    pub dead_letters: i64,
    pub delivered: u64,
    /// Failed attempts (retried).
    pub failed: u64,
}

/// `POST /api/orders` answers by outcome class.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Outcomes<T> {
    pub accepted: T,
    pub sold_out: T,
    pub limit: T,
    /// `overloaded`: refused for capacity.
    pub shed: T,
    pub rate_limited: T,
    /// 5xx: a dependency failed, or a bug.
    pub errors: T,
    /// Every other refusal (outside the window, unknown product, bad input).
    pub other: T,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Answerers<T> {
    pub memory: T,
    pub redis: T,
    pub service: T,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p99: f64,
    pub samples: u64,
}

/// One open sale.
#[derive(Debug, Serialize)]
pub struct SaleView {
    pub product_id: String,
    /// `upcoming`, `live`, `paused` (by an operator), `ended` (by this
    /// process's clock), or `unknown`.
    pub state: &'static str,
    #[serde(flatten)]
    pub watch: StreamView,
    /// Orders accepted per second since the previous read (`None` on the
    /// first, or after a gap), every instance's.
    pub accepted_per_s: Option<f64>,
    /// Acked entries that did not go to dead letters: rows persisted.
    pub persisted: u64,
    pub oldest_pending_age_ms: Option<i64>,
    pub books_age_ms: Option<i64>,
    /// `(ms since the epoch, stock)` over the last minutes.
    pub stock_history: Vec<(i64, i64)>,
    /// The sale could not be read this tick.
    pub error: Option<String>,
    /// Its waiting room, if it has one.
    pub room: Option<BoardRoom>,
}

/// A sale's waiting room on the page.
#[derive(Debug, Serialize)]
pub struct BoardRoom {
    /// The pace now, and the bounds it keeps to.
    pub admit_per_sec: f64,
    pub ceiling_per_sec: u32,
    pub floor_per_sec: u32,
    /// Buyers holding an unused admission, and the cap (null: none).
    pub active: u64,
    pub active_cap: Option<u64>,
    /// How long the oldest order not yet persisted has waited (null: none).
    pub unpersisted_ms: Option<u64>,
    #[serde(flatten)]
    pub figures: RoomFigures,
}

#[derive(Debug, Clone, Default)]
struct Counters {
    orders: Outcomes<u64>,
    answered: Answerers<u64>,
    rows: u64,
}

impl Board {
    pub fn new(sales: Watched, metrics: Arc<Metrics>, workers: WorkerSite) -> Self {
        Self {
            sales,
            metrics,
            workers,
            tick: TICK,
            reads: Mutex::new(Reads::default()),
        }
    }

    /// The latest numbers as JSON: this tick's if read already, read now
    /// otherwise (one reader at a time; the others wait and share it).
    pub async fn latest(&self) -> Arc<str> {
        let mut reads = self.reads.lock().await;
        if let Some((at, json)) = &reads.latest
            && at.elapsed() < self.tick
        {
            return json.clone();
        }
        let snapshot = self.read(&mut reads).await;
        let json: Arc<str> = serde_json::to_string(&snapshot)
            .unwrap_or_else(|_| unreachable!("plain data serializes"))
            .into();
        reads.latest = Some((Instant::now(), json.clone()));
        json
    }

    async fn read(&self, reads: &mut Reads) -> Snapshot {
        let now = Instant::now();
        let at_ms = now_ms();
        let instance = self.instance(reads, now);
        let (mut open, redis_error) = match self.sales.lifecycle().open_sales().await {
            Ok(open) => (open, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        open.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let sales_not_shown = open.len().saturating_sub(MAX_SALES_SHOWN);
        open.truncate(MAX_SALES_SHOWN);
        reads
            .sales
            .retain(|id, _| open.iter().any(|p| p.as_str() == id));
        let mut sales = Vec::with_capacity(open.len());
        let mut unavailable = false;
        for product in &open {
            let track = reads.sales.entry(product.to_string()).or_default();
            let read = if unavailable {
                Err("redis unavailable".to_owned())
            } else {
                self.sales.watch().view(product).await.map_err(|e| {
                    unavailable = e.is_unavailable();
                    e.to_string()
                })
            };
            let mut sale = view(product, read, track, now, at_ms);
            if !unavailable && let Ok(Some(room)) = self.sales.room().room(product).await {
                sale.room = Some(BoardRoom {
                    admit_per_sec: room.pace,
                    ceiling_per_sec: room.ceiling,
                    floor_per_sec: room.floor,
                    active: room.active,
                    active_cap: room.cap,
                    unpersisted_ms: room.unpersisted_ms,
                    figures: room.figures(at_ms),
                });
            }
            sales.push(sale);
        }
        let members = match &redis_error {
            Some(_) => Ok(Vec::new()),
            None => self.sales.fleet().members().await,
        };
        let fleet = match members {
            Ok(members) => members
                .into_iter()
                .map(|member| FleetView {
                    gone: at_ms - member.seen_ms > fleet::GONE_AFTER.as_millis() as i64,
                    member,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        Snapshot {
            at_ms,
            tick_ms: self.tick.as_millis() as u64,
            redis_error,
            instance,
            sales,
            sales_not_shown,
            fleet,
        }
    }

    fn instance(&self, reads: &mut Reads, now: Instant) -> Instance {
        let counters = counters(&self.metrics);
        let rates = reads
            .counters
            .as_ref()
            .filter(|(then, _)| now.duration_since(*then) <= RATE_SPAN)
            .map(|(then, before)| Rates::between(before, &counters, now.duration_since(*then)));
        reads.counters = Some((now, counters.clone()));
        let (bounds, cumulative) = persist_buckets(&self.metrics);
        reads.persist.push_back((now, cumulative.clone()));
        // The oldest sample kept is the last one at least a window old, and
        // none older than the window and a gap: after a time nobody watched,
        // the quantiles start again rather than span the gap.
        while (reads.persist.len() > 1
            && reads
                .persist
                .get(1)
                .is_some_and(|(t, _)| now.duration_since(*t) >= LATENCY_WINDOW))
            || reads
                .persist
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > LATENCY_WINDOW + RATE_SPAN)
        {
            reads.persist.pop_front();
        }
        let accept_to_persist_ms = reads.persist.front().and_then(|(_, oldest)| {
            let window: Vec<u64> = cumulative
                .iter()
                .zip(oldest)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect();
            quantiles(&bounds, &window)
        });
        let m = &self.metrics;
        let delivered = |r: &str| m.event_deliveries.with_label_values(&[r]).get();
        let events = (self.workers == WorkerSite::Here { delivering: true }).then(|| EventsView {
            behind: m.event_delivery_lag.get(),
            dead_letters: m.event_dead_letters.get(),
            delivered: delivered("delivered") + delivered("replayed"),
            failed: delivered("failed"),
        });
        Instance {
            workers: matches!(self.workers, WorkerSite::Here { .. }),
            events,
            orders_total: counters.orders,
            orders_per_s: rates.as_ref().map(|r| r.orders),
            answered_total: counters.answered,
            answered_per_s: rates.as_ref().map(|r| r.answered),
            rows_persisted: counters.rows,
            rows_persisted_per_s: rates.map(|r| r.rows),
            accept_to_persist_ms,
        }
    }
}

/// The counters' rates per second between two reads.
struct Rates {
    orders: Outcomes<f64>,
    answered: Answerers<f64>,
    rows: f64,
}

impl Rates {
    fn between(before: &Counters, now: &Counters, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let (o, p) = (&now.orders, &before.orders);
        let (a, q) = (&now.answered, &before.answered);
        Self {
            orders: Outcomes {
                accepted: rate(o.accepted, p.accepted),
                sold_out: rate(o.sold_out, p.sold_out),
                limit: rate(o.limit, p.limit),
                shed: rate(o.shed, p.shed),
                rate_limited: rate(o.rate_limited, p.rate_limited),
                errors: rate(o.errors, p.errors),
                other: rate(o.other, p.other),
            },
            answered: Answerers {
                memory: rate(a.memory, q.memory),
                redis: rate(a.redis, q.redis),
                service: rate(a.service, q.service),
            },
            rows: rate(now.rows, before.rows),
        }
    }
}

/// A sale's view from this tick's read and what the track remembers.
fn view(
    product: &ProductId,
    read: Result<StreamView, String>,
    track: &mut Track,
    now: Instant,
    at_ms: i64,
) -> SaleView {
    let (watch, error) = match read {
        Ok(w) => (w, None),
        Err(e) => (StreamView::default(), Some(e)),
    };
    let mut accepted_per_s = None;
    if error.is_none() {
        if let Some((then, before)) = track.accepted
            && now.duration_since(then) <= RATE_SPAN
        {
            let secs = now.duration_since(then).as_secs_f64().max(1e-3);
            accepted_per_s = Some(watch.accepted.saturating_sub(before) as f64 / secs);
        }
        track.accepted = Some((now, watch.accepted));
        if let Some(stock) = watch.stock {
            track.history.push_back((at_ms, stock));
        }
    }
    let horizon = at_ms - HISTORY.as_millis() as i64;
    while track.history.front().is_some_and(|(t, _)| *t < horizon) {
        track.history.pop_front();
    }
    let state = match (watch.start_ms, watch.end_ms) {
        (Some(_), Some(end)) if at_ms >= end => "ended",
        _ if watch.paused_ms.is_some() => "paused",
        (Some(start), _) if at_ms < start => "upcoming",
        (Some(_), Some(_)) => "live",
        _ => "unknown",
    };
    SaleView {
        product_id: product.to_string(),
        state,
        accepted_per_s,
        persisted: watch.acked.saturating_sub(watch.dead_letters),
        oldest_pending_age_ms: watch.oldest_pending_ms.map(|t| (at_ms - t).max(0)),
        books_age_ms: watch.books.map(|b| (at_ms - b.judged_ms).max(0)),
        stock_history: track.history.iter().copied().collect(),
        error,
        watch,
        room: None,
    }
}

/// This process's order answers and persisted rows, from the registry.
fn counters(m: &Metrics) -> Counters {
    let mut c = Counters {
        rows: m.rows_persisted.get(),
        ..Counters::default()
    };
    for (outcome, by, n) in m.order_counts() {
        let o = &mut c.orders;
        *match outcome {
            Outcome::Accepted | Outcome::Replayed => &mut o.accepted,
            Outcome::Refused(code) => match code {
                Code::SoldOut | Code::InsufficientStock => &mut o.sold_out,
                Code::LimitExceeded => &mut o.limit,
                Code::Overloaded => &mut o.shed,
                Code::RateLimited => &mut o.rate_limited,
                Code::Unavailable | Code::Internal => &mut o.errors,
                Code::InvalidRequest
                | Code::Unauthorized
                | Code::Forbidden
                | Code::AdmissionRequired
                | Code::AdmissionExpired
                | Code::ChallengeRequired
                | Code::NotFound
                | Code::ProductNotFound
                | Code::OrderNotFound
                | Code::InvalidSignature
                | Code::OrderPending
                | Code::AmountMismatch
                | Code::PaymentIdReused
                | Code::NoWaitingRoom
                | Code::TicketNotFound
                | Code::MethodNotAllowed
                | Code::RequestTimeout
                | Code::ProductExists
                | Code::SaleNotStarted
                | Code::SaleEnded
                | Code::SalePaused
                | Code::SaleClosed
                | Code::InvalidTransition
                | Code::QueueNotOpen
                | Code::PayloadTooLarge
                | Code::UnsupportedMediaType
                | Code::IdempotencyKeyReused
                | Code::HeadersTooLarge => &mut o.other,
            },
        } += n;
        let a = &mut c.answered;
        *match by {
            metrics::AnsweredBy::Memory => &mut a.memory,
            metrics::AnsweredBy::Redis => &mut a.redis,
            metrics::AnsweredBy::Service => &mut a.service,
        } += n;
    }
    c
}

/// The accept-to-persist histogram's bucket bounds (ms) and cumulative counts.
fn persist_buckets(m: &Metrics) -> (Vec<f64>, Vec<u64>) {
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    for family in m.accept_to_persist.collect() {
        for metric in family.get_metric() {
            for bucket in metric.get_histogram().get_bucket() {
                bounds.push(bucket.upper_bound() * 1000.0);
                counts.push(bucket.cumulative_count());
            }
        }
    }
    (bounds, counts)
}

/// The p50 and p99 of a window of cumulative bucket counts, as the bucket
/// bounds that hold them (`None`: nothing persisted in the window).
fn quantiles(bounds: &[f64], cumulative: &[u64]) -> Option<Quantiles> {
    let total = *cumulative.last()?;
    if total == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = (q * total as f64).ceil() as u64;
        cumulative
            .iter()
            .position(|c| *c >= rank)
            .and_then(|i| bounds.get(i))
            .copied()
            .unwrap_or(f64::INFINITY)
    };
    Some(Quantiles {
        p50: at(0.5),
        p99: at(0.99),
        samples: total,
    })
}

/// The dashboard of one process: its sessions, its shared reads, and the
/// admin token its sign-in takes.
pub struct Dashboard {
    pub sessions: super::session::Sessions,
    pub board: Board,
    pub admin_token: std::sync::Arc<str>,
    /// Where sign-ins, sign-outs and refused sign-ins are written, and
    /// who the client is (its address, as the limits see it).
    pub admin: std::sync::Arc<crate::http::operators::admin_log::AdminDoor>,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The sales as an admin runs them (the page's controls), the events'
    /// dead letters replayed from the page, each sale's report
    /// (`/admin/dashboard/report/{id}`).
    pub desk: crate::http::operators::desk::SaleDesk,
    /// The sessions a logout here ended (nonce -> expiry, epoch ms):
    /// refused even while the books cannot be asked.
    pub ended: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_the_bounds_of_the_buckets_that_hold_them() {
        let bounds = [1.0, 10.0, 100.0, 1000.0];
        // 50 under 1 ms, 49 more under 10 ms, 1 under 1 s.
        let q = quantiles(&bounds, &[50, 99, 99, 100]).unwrap();
        assert_eq!((q.p50, q.p99, q.samples), (1.0, 10.0, 100));
        let q = quantiles(&bounds, &[0, 0, 0, 3]).unwrap();
        assert_eq!((q.p50, q.p99), (1000.0, 1000.0));
        assert!(quantiles(&bounds, &[0, 0, 0, 0]).is_none());
    }

    #[test]
    fn a_process_counts_answers_by_class() {
        let m = Metrics::new();
        use metrics::AnsweredBy::{Memory, Redis, Service};
        let refused = Outcome::Refused;
        for (outcome, by) in [
            (Outcome::Accepted, Redis),
            (Outcome::Replayed, Redis),
            (refused(Code::SoldOut), Memory),
            (refused(Code::InsufficientStock), Redis),
            (refused(Code::LimitExceeded), Memory),
            (refused(Code::Overloaded), Service),
            (refused(Code::RateLimited), Service),
            (refused(Code::Unavailable), Redis),
            (refused(Code::SaleEnded), Memory),
        ] {
            m.count_order(outcome, by, 0.001);
        }
        m.rows_persisted.inc_by(5);
        let c = counters(&m);
        let o = c.orders;
        assert_eq!(
            (
                o.accepted,
                o.sold_out,
                o.limit,
                o.shed,
                o.rate_limited,
                o.errors,
                o.other
            ),
            (2, 2, 1, 1, 1, 1, 1)
        );
        let a = c.answered;
        assert_eq!((a.memory, a.redis, a.service), (3, 4, 2));
        assert_eq!(c.rows, 5);
    }
}
