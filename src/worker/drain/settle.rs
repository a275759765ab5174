//! A batch settled: parsed, claimed once the replicas have it, persisted
//! in one transaction, acked; entries that cannot be persisted are dead
//! letters (or kept, while their deliveries are few).

use crate::config::WorkerConfig;
use crate::domain::{Chain, PendingOrder, ProductId};
use crate::metrics::Metrics;
use crate::metrics::timeline::{Count, Gauge};
use crate::sale::{Entry, SaleStream};
use crate::store::{self, Persisted};
use crate::worker::error::WorkerError;

/// Where a batch came from: read by this worker, or reclaimed from an
/// idle one (its entries may have been delivered, and failed, before: their
/// delivery counts decide which go to dead letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Read,
    Reclaimed,
}

/// What one step or reclaim pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Entries read or claimed.
    pub read: usize,
    /// Entries acked after their orders were committed (new or already there).
    pub acked: usize,
    /// What the commit inserted.
    pub persisted: Persisted,
    /// Entries moved to dead letters.
    pub dead: usize,
    /// Poison entries left pending for a later delivery.
    pub kept: usize,
}

/// Entries of a batch with the orders they carry.
type Batch<'a> = Vec<(&'a Entry, PendingOrder)>;

/// What settling a batch needs of its drain.
pub(super) struct Settle<'a> {
    /// The stream's sale, or its stock shard (`<pid>~<k>`).
    pub(super) product: &'a ProductId,
    /// The sale, as the books know it.
    pub(super) sale: &'a ProductId,
    pub(super) stream: &'a SaleStream,
    pub(super) orders: &'a store::Orders,
    pub(super) cfg: &'a WorkerConfig,
    pub(super) metrics: &'a Metrics,
}

impl Settle<'_> {
    /// Persists what parses in one transaction, acks it, and deals with the
    /// rest: parse, claim (after the replicas have the batch), persist, ack,
    /// then the poison entries.
    pub(super) async fn batch(
        &self,
        entries: Vec<Entry>,
        source: Source,
    ) -> Result<Outcome, WorkerError> {
        self.metrics.batch_size.observe(entries.len() as f64);
        let (good, mut bad) = self.parse(&entries);
        let (good, void) = self.claim(&entries, good).await?;
        let (persisted, good) = self.persist(good, &mut bad).await?;
        let ids: Vec<&str> = good
            .iter()
            .chain(&void)
            .map(|(e, _)| e.id.as_str())
            .collect();
        self.stream.ack(&ids).await?;
        self.metrics.rows_persisted.inc_by(persisted.inserted);
        let mut outcome = Outcome {
            read: entries.len(),
            acked: ids.len(),
            persisted,
            ..Outcome::default()
        };
        if !bad.is_empty() {
            (outcome.dead, outcome.kept) = self.poison(bad, source).await?;
        }
        Ok(outcome)
    }

    /// The batch's orders, and the entries that do not parse (with why).
    fn parse<'a>(&self, entries: &'a [Entry]) -> (Batch<'a>, Vec<(&'a Entry, String)>) {
        let (mut good, mut bad) = (Vec::with_capacity(entries.len()), Vec::new());
        for e in entries {
            match e.order(self.product) {
                Ok(o) => good.push((e, o)),
                Err(reason) => bad.push((e, reason)),
            }
        }
        (good, bad)
    }

    /// Claims the batch for the books, once the replicas have it (with WAIT
    /// on; otherwise the batch stays pending and is tried again): returns the
    /// orders to persist, and those the API voided (their WAIT failed, the
    /// buyer was answered 503), which are acked without a row. A claimed
    /// order can no longer be voided.
    async fn claim<'a>(
        &self,
        entries: &[Entry],
        good: Batch<'a>,
    ) -> Result<(Batch<'a>, Batch<'a>), WorkerError> {
        self.stream.confirm_replicated().await?;
        let last = entries
            .iter()
            .map(|e| e.id.as_str())
            .max_by_key(|id| entry_order(id))
            .unwrap_or("0-0");
        let ids: Vec<&str> = good.iter().map(|(_, o)| o.order_id.as_str()).collect();
        let voided = self.stream.claim(last, &ids).await?;
        let (void, kept): (Vec<_>, Vec<_>) = good
            .into_iter()
            .partition(|(_, o)| voided.iter().any(|v| v == o.order_id.as_str()));
        if !void.is_empty() {
            tracing::info!(count = void.len(), "voided orders acked without a row");
        }
        Ok((kept, void))
    }

    /// Writes the batch's rows in one transaction (timed). A batch MySQL
    /// refuses is written row by row, and the rows it refuses join `bad`.
    async fn persist<'a>(
        &self,
        good: Batch<'a>,
        bad: &mut Vec<(&'a Entry, String)>,
    ) -> Result<(Persisted, Batch<'a>), WorkerError> {
        let metrics = &self.metrics;
        let orders: Vec<PendingOrder> = good.iter().map(|(_, o)| o.clone()).collect();
        let commit = metrics.commit_latency.start_timer();
        let (persisted, good) = match self.orders.persist_orders(self.sale, &orders).await {
            Ok(p) => (p, good),
            Err(e) if e.is_unavailable() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "batch refused; persisting its rows one by one");
                self.persist_row_by_row(good, bad).await?
            }
        };
        commit.observe_duration();
        if persisted.inserted > 0 {
            // The batch's rows were new (a redelivered batch inserts none).
            let now = crate::domain::now_ms();
            let (mut most, mut total) = (0, 0);
            for (_, order) in &good {
                let waited = (now - order.created_ms).max(0);
                metrics.accept_to_persist.observe(waited as f64 / 1000.0);
                (most, total) = (most.max(waited), total + waited as u64);
            }
            // The sale's timeline: orders persisted, and how long they
            // waited (the batch's rows, when all of them were new).
            let timeline = &metrics.timeline;
            let sale = self.sale.as_str();
            timeline.count(sale, Count::Persisted, persisted.inserted);
            if persisted.inserted == good.len() as u64 {
                timeline.count(sale, Count::PersistWaitMs, total);
                timeline.count(sale, Count::PersistWaited, persisted.inserted);
                timeline.gauge(sale, Gauge::PersistLagMaxMs, most);
            }
        }
        Ok((persisted, good))
    }

    /// Something in the batch MySQL will not take: find it, row by row.
    async fn persist_row_by_row<'a>(
        &self,
        good: Batch<'a>,
        bad: &mut Vec<(&'a Entry, String)>,
    ) -> Result<(Persisted, Batch<'a>), WorkerError> {
        let mut total = Persisted::default();
        let mut ok = Vec::with_capacity(good.len());
        for (entry, order) in good {
            match self
                .orders
                .persist_orders(self.sale, std::slice::from_ref(&order))
                .await
            {
                Ok(p) => {
                    total.inserted += p.inserted;
                    total.units += p.units;
                    ok.push((entry, order));
                }
                Err(e) if e.is_unavailable() => return Err(e.into()),
                Err(e) => bad.push((entry, format!("mysql refused the row: {e}"))),
            }
        }
        Ok((total, ok))
    }

    /// Entries that cannot be persisted: dead letters once delivered more than
    /// `max_deliveries` times, otherwise left pending for another try.
    async fn poison(
        &self,
        bad: Vec<(&Entry, String)>,
        source: Source,
    ) -> Result<(usize, usize), WorkerError> {
        let counts = if source == Source::Reclaimed {
            let (first, last) = (&bad[0].0.id, &bad[bad.len() - 1].0.id);
            self.stream
                .deliveries(first, last, self.cfg.batch_size)
                .await?
        } else {
            Default::default()
        };
        let (mut dead, mut kept) = (0, 0);
        for (entry, reason) in bad {
            let delivered = counts.get(&entry.id).copied().unwrap_or(1);
            if delivered > self.cfg.max_deliveries {
                self.stream.dead_letter(entry, &reason, delivered).await?;
                self.metrics.dead_letters.inc();
                tracing::error!(id = %entry.id, %reason, delivered, "entry moved to dead letters");
                dead += 1;
            } else {
                tracing::warn!(id = %entry.id, %reason, delivered, "entry cannot be persisted; left pending");
                kept += 1;
            }
        }
        Ok((dead, kept))
    }
}

/// A stream entry id's `(ms, seq)`, for ordering ids.
fn entry_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl Outcome {
    pub(super) fn add(self, o: Outcome) -> Outcome {
        Outcome {
            read: self.read + o.read,
            acked: self.acked + o.acked,
            persisted: Persisted {
                inserted: self.persisted.inserted + o.persisted.inserted,
                units: self.persisted.units + o.persisted.units,
            },
            dead: self.dead + o.dead,
            kept: self.kept + o.kept,
        }
    }
}
