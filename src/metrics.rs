//! The service's Prometheus metrics: one registry per process (per `App`, so
//! tests running several services in one process each see their own),
//! handed to the HTTP layer and the workers. Labels are bounded: outcome
//! codes, and the product id of open sales only (never user ids).
//!
//! Beside the registry, each sale's [`timeline`]: what this process
//! counted for it, second by second, for the sale's report, the buyers
//! among it in a [`distinct`] sketch.
//!
//! Counters and histograms are updated where things happen; the per-sale
//! gauges (stock, stream length, lag, pending, dead letters) are read from
//! Redis when `/metrics` is scraped (see `http::operators::metrics`).

use std::sync::OnceLock;

use crate::domain::answer::{Class, Outcome};

pub mod distinct;
mod process;
pub mod timeline;

pub use process::ProcessStats;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// `POST /api/orders` answers, by outcome (`accepted`, `replayed` or the
    /// error code) and by who answered (`memory`, `redis`, or `service` for
    /// answers that never reached the sale: bad input, auth, limits, shedding).
    pub order_requests: IntCounterVec,
    /// Redis calls of the order path: `place_order` (the order script) and
    /// `memory_read` (background reads that keep the memory fresh).
    pub order_path_calls: IntCounterVec,
    /// Orders the order script's calls carried (over its calls: the orders
    /// a call shares, `sale::orders::sharing`).
    pub order_script_orders: IntCounter,
    /// Time to answer `POST /api/orders`, by outcome class (`accepted`, `refused`, `shed`).
    pub order_latency: HistogramVec,
    /// Orders inserted into `tb_order` (redeliveries not counted twice).
    pub rows_persisted: IntCounter,
    /// Entries per batch the workers settled.
    pub batch_size: Histogram,
    /// Time of a batch's MySQL transaction.
    pub commit_latency: Histogram,
    /// Entries taken over from idle consumers.
    pub reclaimed: IntCounter,
    /// Entries moved to dead letters.
    pub dead_letters: IntCounter,
    /// The drains' reads of their streams (`XREADGROUP`).
    pub stream_reads: IntCounter,
    /// MySQL calls and transactions tried again after a deadlock or a lock
    /// wait timeout (InnoDB's, or Galera's certification conflicts).
    pub db_retries: IntCounter,
    /// Tasks that ended in a panic, by task (`drain`, `bells`, a pass's
    /// name, ...): counted wherever a task is awaited or supervised
    /// (`worker::every`).
    pub task_panics: IntCounterVec,
    /// MySQL calls refused because the books were out, by why (`read_only`,
    /// `not_primary`, `connection`, `timeout`, `resources`,
    /// `not_migrated`, `setup`: `store::Outage`).
    pub db_unavailable: IntCounterVec,
    /// Admin requests refused for a missing or wrong credential (the
    /// admin log keeps them too, at most a few a second).
    pub admin_auth_failures: IntCounter,
    /// What the repair after a failover of the books put back, by what:
    /// `order` (from its stream), `cancel`, `payment` (from what Redis
    /// keeps of them; `worker::repair`).
    pub put_back: IntCounterVec,
    /// What the books run on: 1 for the topology the server described at
    /// start (`single`, `async_replicas`, `semi_sync`, `galera`, `unknown`).
    pub books_topology: IntGaugeVec,
    /// 1, labelled with this process's release (`version`, `commit`):
    /// which releases a fleet runs, mid-upgrade.
    pub build_info: IntGaugeVec,
    /// Drains sleeping on their sale's bell now (see `sale::bells`).
    pub drains_asleep: IntGauge,
    /// Sleeping drains woken, by why (`bell`: an order; `check`: the
    /// periodic look).
    pub drain_wakeups: IntCounterVec,
    /// From an order's acceptance in Redis to its commit in MySQL.
    pub accept_to_persist: Histogram,
    /// Per open sale, refreshed at each scrape.
    pub sale_stock: IntGaugeVec,
    pub stream_length: IntGaugeVec,
    pub group_lag: IntGaugeVec,
    pub group_pending: IntGaugeVec,
    pub sale_dead_letters: IntGaugeVec,
    /// Per open sale, from the workers' live check of the books
    /// (`bookkeeping::live`): 1 balanced, 0 not; absent until first judged.
    pub sale_books_balanced: IntGaugeVec,
    /// Per open sale: the units by which its books were last found off.
    pub sale_books_difference: IntGaugeVec,
    /// Per open sale with a waiting room, refreshed at each scrape: buyers
    /// who joined, places admitted, buyers still waiting, the pace (and
    /// its ceiling and floor), the estimated wait of whoever joins now, the
    /// buyers holding an unused admission and the cap on them (0: none).
    pub room_joined: IntGaugeVec,
    pub room_admitted: IntGaugeVec,
    pub room_waiting: IntGaugeVec,
    pub room_admit_per_sec: IntGaugeVec,
    pub room_admit_ceiling_per_sec: IntGaugeVec,
    pub room_admit_floor_per_sec: IntGaugeVec,
    pub room_wait_seconds: IntGaugeVec,
    pub room_active: IntGaugeVec,
    pub room_active_cap: IntGaugeVec,
    /// Sales by state (`open`: in the registry, not ended or not yet
    /// looked at; `ended_unsettled`: ended, waiting for something before
    /// they retire; `retired`), set by the workers' retirement pass.
    pub sales: IntGaugeVec,
    /// Per ended sale that cannot retire, 1 for each reason (`dead_letters`,
    /// `unpaid`, `pending`, ...), set by the workers' retirement pass.
    pub sale_unsettled: IntGaugeVec,
    /// Sales retired, and retired sales purged from Redis, by this process.
    pub sales_retired: IntCounter,
    pub sales_purged: IntCounter,
    /// Orders being decided now (of `MAX_IN_FLIGHT`), refreshed at each scrape.
    pub orders_in_flight: IntGauge,
    /// Clients tracked by each rate limit (`user`, `ip`), refreshed at each scrape.
    pub rate_limit_keys: IntGaugeVec,
    /// Client connections open now, refreshed at each scrape.
    pub connections_open: IntGauge,
    /// Client connections closed or refused by the service's bounds, by
    /// reason (`header_timeout`, `idle_timeout`, `write_stall`, `evicted`,
    /// `refused_full`, `refused_address`), caught up at each scrape.
    pub connections_ended: IntCounterVec,
    /// Payment notifications by what came of them: `paid`, `refund_due`,
    /// `amount_mismatch`, `failed` (recorded), `replayed` (recorded before),
    /// `refused` (not heard: a signature that does not verify, an unknown
    /// or pending order, a malformed body).
    pub payment_notifications: IntCounterVec,
    /// Event deliveries to the shop's endpoint by result: `delivered`,
    /// `failed` (an attempt), `dead_lettered`, `replayed`.
    pub event_deliveries: IntCounterVec,
    /// Events recorded and not yet delivered (or dead-lettered), as the
    /// delivering process last saw them.
    pub event_delivery_lag: IntGauge,
    /// Events given up on (`tb_event_dead`), as the delivering process last
    /// saw them.
    pub event_dead_letters: IntGauge,
    /// `order_requests` and `order_latency` series, resolved once each.
    order_series: OrderSeries,
    /// Each sale's seconds as this process counts them, for its report
    /// (not Prometheus: written to the books, see [`timeline`]).
    pub timeline: timeline::Timeline,
}

/// Who decided an order's answer: this process's memory of Redis's
/// answers, Redis itself, or the service before asking the sale (bad
/// input, identity, limits, shedding). The label `answered_by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    Memory,
    Redis,
    Service,
}

impl AnsweredBy {
    pub const ALL: [Self; 3] = [Self::Memory, Self::Redis, Self::Service];

    pub fn label(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Service => "service",
        }
    }
}
/// The order path's series, each resolved on first use and kept: a label
/// lookup hashes the values under a lock, a measurable part of an answer
/// from memory (BENCHMARKS.md, "What does a refusal cost?").
/// Created lazily, so a series appears on `/metrics` only once it counted
/// something, as before.
struct OrderSeries {
    /// By [`Outcome::index`] and [`AnsweredBy`].
    requests: [OnceLock<IntCounter>; Outcome::COUNT * AnsweredBy::ALL.len()],
    /// By [`Class`].
    latency: [OnceLock<Histogram>; Class::ALL.len()],
}

impl Default for OrderSeries {
    fn default() -> Self {
        Self {
            requests: std::array::from_fn(|_| OnceLock::new()),
            latency: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

fn buckets(from: f64, factor: f64, n: usize) -> Vec<f64> {
    prometheus::exponential_buckets(from, factor, n)
        .unwrap_or_else(|_| unreachable!("valid bucket parameters"))
}

impl Metrics {
    /// Counts an answer to `POST /api/orders` and times it by its class.
    pub fn count_order(&self, outcome: Outcome, answered_by: AnsweredBy, seconds: f64) {
        let class = outcome.class();
        self.order_series.requests[outcome.index() * AnsweredBy::ALL.len() + answered_by as usize]
            .get_or_init(|| {
                self.order_requests
                    .with_label_values(&[outcome.label(), answered_by.label()])
            })
            .inc();
        self.order_series.latency[class as usize]
            .get_or_init(|| self.order_latency.with_label_values(&[class.label()]))
            .observe(seconds);
    }

    /// Every answer to `POST /api/orders` counted so far: its outcome (as
    /// [`Metrics::count_order`] took it), who answered, how many.
    pub fn order_counts(&self) -> Vec<(Outcome, AnsweredBy, u64)> {
        let mut counts = Vec::new();
        for family in prometheus::core::Collector::collect(&self.order_requests) {
            for metric in family.get_metric() {
                let label = |name: &str| {
                    metric
                        .get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value())
                };
                let by = label("answered_by")
                    .and_then(|v| AnsweredBy::ALL.into_iter().find(|b| b.label() == v));
                if let (Some(outcome), Some(by)) = (label("outcome").and_then(Outcome::parse), by) {
                    let n = metric.get_counter().get_value() as u64;
                    counts.push((outcome, by, n));
                }
            }
        }
        counts
    }

    /// A sale's books verdict (`bookkeeping::live`).
    pub fn books(&self, product_id: &str, balanced: bool, difference: i64) {
        self.sale_books_balanced
            .with_label_values(&[product_id])
            .set(i64::from(balanced));
        self.sale_books_difference
            .with_label_values(&[product_id])
            .set(difference);
    }

    /// A sale no longer open: its books series go.
    pub fn forget_books(&self, product_id: &str) {
        let _ = self.sale_books_balanced.remove_label_values(&[product_id]);
        let _ = self
            .sale_books_difference
            .remove_label_values(&[product_id]);
    }

    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("flashsale".into()), None)
            .unwrap_or_else(|_| unreachable!("a valid prefix"));
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let counter = |name: &str, help: &str| register(&registry, IntCounter::new(name, help));
        let histogram = |name: &str, help: &str, b: Vec<f64>| {
            register(
                &registry,
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(b)),
            )
        };
        let gauge = |name: &str, help: &str| {
            register(
                &registry,
                IntGaugeVec::new(Opts::new(name, help), &["product_id"]),
            )
        };
        let order_latency = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "order_latency_seconds",
                    "Time to answer POST /api/orders, by outcome class",
                )
                .buckets(buckets(0.0001, 2.0, 16)),
                &["class"],
            ),
        );
        Self {
            order_requests: counter_vec(
                "order_requests_total",
                "POST /api/orders answers by outcome and by who answered",
                &["outcome", "answered_by"],
            ),
            order_path_calls: counter_vec(
                "order_path_redis_calls_total",
                "Redis calls of the order path: the order script, and background reads for the memory",
                &["call"],
            ),
            order_script_orders: counter(
                "order_script_orders_total",
                "Orders decided by the order script's calls (several arriving together share one call)",
            ),
            order_latency,
            rows_persisted: counter("rows_persisted_total", "Orders inserted into tb_order"),
            batch_size: histogram(
                "batch_size",
                "Stream entries per batch settled by the workers",
                buckets(1.0, 2.0, 14),
            ),
            commit_latency: histogram(
                "batch_commit_seconds",
                "Time of a batch's MySQL transaction",
                buckets(0.0005, 2.0, 16),
            ),
            reclaimed: counter(
                "reclaimed_entries_total",
                "Stream entries taken over from idle consumers (XAUTOCLAIM)",
            ),
            dead_letters: counter(
                "dead_letters_total",
                "Stream entries moved to dead letters by this process",
            ),
            stream_reads: counter(
                "stream_reads_total",
                "The workers' reads of their sales' streams (XREADGROUP)",
            ),
            db_retries: counter(
                "db_retries_total",
                "MySQL calls and transactions tried again after a deadlock or a lock wait timeout",
            ),
            task_panics: counter_vec(
                "task_panics_total",
                "Tasks of the service that ended in a panic (logged where they are awaited; a supervised one is started again), by task",
                &["task"],
            ),
            db_unavailable: counter_vec(
                "db_unavailable_total",
                "MySQL calls refused because the books were out (read-only, not the primary, connections, time, resources, not migrated, setup), by why",
                &["why"],
            ),
            admin_auth_failures: counter(
                "admin_auth_failures_total",
                "Admin requests refused for a missing or wrong credential",
            ),
            put_back: counter_vec(
                "put_back_total",
                "What the repair after a failover of the books put back into them, by what (order, cancel, payment)",
                &["what"],
            ),
            books_topology: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "books_topology",
                        "What the books' MySQL runs on, as it last said (read at start and every 10 s; 1 for that topology)",
                    ),
                    &["topology"],
                ),
            ),
            build_info: {
                let info = register(
                    &registry,
                    IntGaugeVec::new(
                        Opts::new(
                            "build_info",
                            "1, labelled with the release this process runs (its version and commit)",
                        ),
                        &["version", "commit"],
                    ),
                );
                // What `domain::release` names (read here from the build, as
                // it does: metrics stands beside domain, not above it).
                info.with_label_values(&[env!("CARGO_PKG_VERSION"), env!("FLASHSALE_COMMIT")])
                    .set(1);
                info
            },
            drains_asleep: register(
                &registry,
                IntGauge::new(
                    "drains_asleep",
                    "Sales whose drain sleeps until an order rings its bell",
                ),
            ),
            drain_wakeups: counter_vec(
                "drain_wakeups_total",
                "Sleeping drains woken, by why (bell: an order; check: the periodic look)",
                &["reason"],
            ),
            accept_to_persist: histogram(
                "accept_to_persist_seconds",
                "From an order's acceptance in Redis to its commit in MySQL",
                buckets(0.001, 2.0, 18),
            ),
            sale_stock: gauge("sale_stock", "Units left in Redis, per open sale"),
            stream_length: gauge("stream_length", "Entries in the sale's order stream"),
            group_lag: gauge(
                "group_lag",
                "Entries of the sale's stream not yet delivered to the workers",
            ),
            group_pending: gauge(
                "group_pending",
                "Entries delivered to a worker and not yet acked",
            ),
            sale_dead_letters: gauge(
                "sale_dead_letters",
                "Entries in the sale's dead-letter stream",
            ),
            sale_books_balanced: gauge(
                "sale_books_balanced",
                "1 when the sale's books balance, 0 when a quiet sale's do not (the workers' live check)",
            ),
            sale_books_difference: gauge(
                "sale_books_difference",
                "Units by which the sale's books were last found off (available_qty - stock - dead letters - unreturned)",
            ),
            room_joined: gauge("room_joined", "Buyers who joined the sale's waiting room"),
            room_admitted: gauge(
                "room_admitted",
                "Places of the sale's waiting room admitted so far",
            ),
            room_waiting: gauge(
                "room_waiting",
                "Buyers in the sale's waiting room not yet admitted",
            ),
            room_admit_per_sec: gauge(
                "room_admit_per_sec",
                "The waiting room's pace now (places admitted per second): the ceiling, lower while orders wait to be persisted",
            ),
            room_admit_ceiling_per_sec: gauge(
                "room_admit_ceiling_per_sec",
                "The waiting room's ceiling: the highest pace the operator set",
            ),
            room_admit_floor_per_sec: gauge(
                "room_admit_floor_per_sec",
                "The waiting room's floor: the lowest pace it drops to under strain",
            ),
            room_active: gauge(
                "room_active",
                "Buyers holding an unused admission (counted when the room has an active cap)",
            ),
            room_active_cap: gauge(
                "room_active_cap",
                "The most buyers who may hold an unused admission (0: no cap)",
            ),
            room_wait_seconds: gauge(
                "room_wait_seconds",
                "Estimated wait of a buyer joining the waiting room now, in seconds",
            ),
            sales: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new("sales", "Sales by state: open, ended_unsettled, retired"),
                    &["state"],
                ),
            ),
            sale_unsettled: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "sale_unsettled",
                        "1 per reason an ended sale cannot retire (dead_letters, unpaid, pending, cancel_requests, unreturned_cancels, books_off, missing_in_redis)",
                    ),
                    &["product_id", "reason"],
                ),
            ),
            sales_retired: counter("sales_retired_total", "Sales this process retired"),
            sales_purged: counter(
                "sales_purged_total",
                "Retired sales whose Redis keys this process deleted",
            ),
            orders_in_flight: register(
                &registry,
                IntGauge::new("orders_in_flight", "Orders being decided now"),
            ),
            rate_limit_keys: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new("rate_limit_keys", "Clients tracked by each rate limit"),
                    &["limit"],
                ),
            ),
            connections_open: register(
                &registry,
                IntGauge::new("http_connections_open", "Client connections open now"),
            ),
            connections_ended: counter_vec(
                "http_connections_ended_total",
                "Client connections closed or refused by the service's bounds, by reason",
                &["reason"],
            ),
            payment_notifications: counter_vec(
                "payment_notifications_total",
                "Payment notifications by what came of them",
                &["result"],
            ),
            event_deliveries: counter_vec(
                "event_deliveries_total",
                "Event deliveries to the shop's endpoint by result",
                &["result"],
            ),
            event_delivery_lag: register(
                &registry,
                IntGauge::new(
                    "event_delivery_lag",
                    "Events recorded and not yet delivered, as the delivering process last saw them",
                ),
            ),
            event_dead_letters: register(
                &registry,
                IntGauge::new(
                    "event_dead_letters",
                    "Events whose delivery gave up, waiting for a replay",
                ),
            ),
            order_series: OrderSeries::default(),
            timeline: timeline::Timeline::default(),
            registry,
        }
    }

    /// Everything, in the Prometheus text format: this registry, then the
    /// standard `process_*` metrics (unprefixed, as every exporter names them).
    pub fn render(&self) -> String {
        let mut text = TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"));
        if let Some(p) = ProcessStats::of("self") {
            p.render_into(&mut text);
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `metric` (its name and help are literals: they are valid).
fn register<M>(registry: &Registry, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.unwrap_or_else(|e| unreachable!("a metric defined here is valid: {e}"));
    let _ = registry.register(Box::new(metric.clone()));
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_described_and_rendered_in_the_standard_names() {
        let Some(p) = ProcessStats::of("self") else {
            return; // not Linux
        };
        assert!(p.threads >= 1 && p.resident_bytes > 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(p.start_time_secs <= now + 1.0 && p.start_time_secs > now - 86_400.0 * 365.0);
        let text = Metrics::new().render();
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_threads",
            "process_open_fds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{name} "))),
                "{name} in:\n{text}"
            );
        }
        assert!(ProcessStats::of("999999999").is_none(), "no such process");
    }
}
