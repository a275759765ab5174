//! The drain of one sale's stream by one consumer: its reads, its cursor,
//! its reclaims, its trims and its sleep.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::settle::{Outcome, Settle, Source};
use crate::config::WorkerConfig;
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::sale::{Bells, Entry, SaleStream};
use crate::store;
use crate::worker::activity::Activity;
use crate::worker::error::WorkerError;

/// Where the next read starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    /// Re-reading this consumer's own pending entries, after this id
    /// (`0` at start and after a failed batch).
    Own(String),
    /// New entries (`>`).
    New,
}

/// The drain of one sale's stream by one consumer.
pub struct SaleWorker {
    /// The sale, or one of its stock shards (`<pid>~<k>`).
    pub(super) product: ProductId,
    /// The sale, as the books know it.
    sale: ProductId,
    stream: SaleStream,
    /// What wakes this drain when its sale is quiet.
    pub(super) bells: Bells,
    /// Where its orders are persisted.
    orders: store::Orders,
    pub(super) cfg: Arc<WorkerConfig>,
    metrics: Arc<Metrics>,
    cursor: Cursor,
    /// A batch read ahead during the previous step, not yet settled.
    ahead: Option<Vec<Entry>>,
    /// When a read last returned entries (a sale is hot for `HOT_FOR` after).
    last_entries: Instant,
    /// When a trim last ran.
    last_trim: Option<Instant>,
    activity: Activity,
}

/// How long a sale counts as selling after its last new entry.
const HOT_FOR: Duration = Duration::from_secs(10);
/// How often an idle sale's stream is polled when it cannot sleep on its
/// bell (no bell subscription, or entries pending to another consumer).
pub(super) const IDLE_POLL: Duration = Duration::from_millis(500);
/// How long a drain sleeps on its bell before it looks anyway (a bell lost
/// without the subscription noticing; trimming), spread ±25% so that the
/// drains of many quiet sales do not look all at once.
const SLEEP_CHECK: Duration = Duration::from_secs(300);
/// How long a read waits for a free pooled connection before it polls instead.
const POOL_WAIT: Duration = Duration::from_millis(20);

impl SaleWorker {
    /// The drain of `product`'s stream, with the handles its supervisor gives it.
    pub(crate) fn new(
        product: ProductId,
        (stream, bells, orders): (SaleStream, Bells, store::Orders),
        cfg: Arc<WorkerConfig>,
        (metrics, activity): (Arc<Metrics>, Activity),
    ) -> Self {
        Self {
            activity,
            last_trim: None,
            stream,
            bells,
            orders,
            sale: product.sale(),
            product,
            cfg,
            metrics,
            cursor: Cursor::Own("0".into()),
            ahead: None,
            last_entries: Instant::now(),
        }
    }

    pub fn consumer(&self) -> &str {
        &self.cfg.consumer
    }

    /// One batch: this consumer's own pending entries first (after a restart
    /// or a failed batch), then new ones, waiting up to `block` for them.
    ///
    /// The next batch is read while this one is written to MySQL (one
    /// non-blocking read), so Redis and MySQL latencies overlap; it is kept
    /// for the next step (BENCHMARKS.md, "What does persisting cost?").
    #[tracing::instrument(skip(self), fields(product_id = %self.product, consumer = %self.cfg.consumer))]
    pub async fn step(&mut self) -> Result<Outcome, WorkerError> {
        let entries = match self.ahead.take() {
            Some(entries) => entries,
            None => self.next_batch().await?,
        };
        if entries.is_empty() {
            return Ok(Outcome::default());
        }
        self.last_entries = Instant::now();
        let (settled, ahead) = {
            let from = self.next_from();
            tokio::join!(self.settle(entries, Source::Read), self.read(&from, None))
        };
        match (&settled, ahead) {
            (Ok(_), Ok(ahead)) => {
                self.advance(&ahead);
                self.ahead = (!ahead.is_empty()).then_some(ahead);
            }
            // The batch (and anything read ahead) stays pending to us: read
            // it again before anything new.
            _ => self.cursor = Cursor::Own("0".into()),
        }
        settled
    }

    /// Settles a batch read ahead, if any (before shutting down).
    pub async fn finish(&mut self) -> Result<Outcome, WorkerError> {
        match self.ahead.take() {
            Some(entries) => self.settle(entries, Source::Read).await,
            None => Ok(Outcome::default()),
        }
    }

    /// Reads the next batch (own pending entries, then new ones).
    async fn next_batch(&mut self) -> Result<Vec<Entry>, WorkerError> {
        if let Cursor::Own(after) = self.cursor.clone() {
            let entries = self.read(&after, None).await?;
            self.advance(&entries);
            if !entries.is_empty() {
                return Ok(entries);
            }
        }
        self.read(">", Some(self.cfg.block)).await
    }

    /// The id the next read starts from: own pending after the cursor, or new.
    fn next_from(&self) -> String {
        match &self.cursor {
            Cursor::Own(after) => after.clone(),
            Cursor::New => ">".into(),
        }
    }

    /// Moves the cursor past `entries` (to new entries once own ones run out).
    fn advance(&mut self, entries: &[Entry]) {
        if let Cursor::Own(_) = self.cursor {
            self.cursor = match entries.last() {
                Some(last) => Cursor::Own(last.id.clone()),
                None => Cursor::New,
            };
        }
    }

    /// Takes over entries idle longer than `claim_idle` (a crashed or stuck
    /// consumer's) and settles them; entries delivered more than
    /// `max_deliveries` times that still cannot be persisted become dead letters.
    #[tracing::instrument(skip(self), fields(product_id = %self.product, consumer = %self.cfg.consumer))]
    pub async fn reclaim(&mut self) -> Result<Outcome, WorkerError> {
        let mut total = Outcome::default();
        let mut start = "0-0".to_owned();
        loop {
            let claimed = self
                .stream
                .autoclaim(self.cfg.claim_idle, &start, self.cfg.batch_size)
                .await?;
            if !claimed.deleted.is_empty() {
                tracing::warn!(ids = ?claimed.deleted, "pending entries were deleted from the stream");
            }
            let entries = claimed.entries;
            if !entries.is_empty() {
                self.metrics.reclaimed.inc_by(entries.len() as u64);
                tracing::info!(count = entries.len(), "reclaimed idle entries");
                let o = self.settle(entries, Source::Reclaimed).await?;
                total = total.add(o);
            }
            start = claimed.next;
            if start == "0-0" {
                return Ok(total);
            }
        }
    }

    /// Trims acked entries older than the retention.
    pub async fn trim(&mut self) -> Result<u64, WorkerError> {
        let trimmed = self.stream.trim(self.cfg.retention).await?;
        self.last_trim = Some(Instant::now());
        Ok(trimmed)
    }

    /// Whether a sleeping drain's stream may still hold entries to trim:
    /// entries were read (or the drain started) less than the retention
    /// before the last trim.
    pub(super) fn may_trim(&self) -> bool {
        let aged_out = self.last_entries + self.cfg.retention;
        Instant::now() >= aged_out && self.last_trim.is_none_or(|t| t < aged_out)
    }

    /// Sleeps until the sale's bell rings, when its stream has nothing
    /// pending or undelivered (`drain_sleep.lua`) and a bell subscription is
    /// up; or for `SLEEP_CHECK` at most, or until `shutdown`. Returns
    /// whether it slept (false: something waits, or no bells to sleep on).
    pub async fn sleep(&mut self, shutdown: &CancellationToken) -> Result<bool, WorkerError> {
        let bells = &self.bells;
        if !bells.listening() || self.ahead.is_some() || self.cursor != Cursor::New {
            return Ok(false);
        }
        let bell = bells.waiter(&self.product);
        if !self.stream.sleep().await? {
            return Ok(false);
        }
        self.activity.sleeps(&self.product);
        self.metrics.drains_asleep.inc();
        let spread = SLEEP_CHECK / 4;
        let check =
            SLEEP_CHECK - spread + spread.mul_f64(2.0 * crate::worker::every::unit_random());
        tokio::select! {
            _ = bell.notified() => self.metrics.drain_wakeups.with_label_values(&["bell"]).inc(),
            _ = tokio::time::sleep(check) => self.metrics.drain_wakeups.with_label_values(&["check"]).inc(),
            _ = shutdown.cancelled() => {}
        }
        self.metrics.drains_asleep.dec();
        self.activity.wakes(&self.product);
        Ok(true)
    }

    /// Reads a batch. Only a hot sale's wait for new entries blocks in Redis,
    /// on a pooled connection of its own (see sale::conn); every other read
    /// is non-blocking on the shared connection, and an idle sale that found
    /// nothing sleeps on its bell ([`Self::sleep`]), or without bells waits
    /// `IDLE_POLL` here instead. So the pool only needs a
    /// connection per sale that is selling right now, however many sales the
    /// registry lists, and a full pool slows a drain down, never stops it.
    #[tracing::instrument(level = "debug", skip(self), fields(product_id = %self.product, count = self.cfg.batch_size))]
    async fn read(&self, from: &str, block: Option<Duration>) -> Result<Vec<Entry>, WorkerError> {
        let count = self.cfg.batch_size;
        self.metrics.stream_reads.inc();
        if let Some(block) = block
            && self.last_entries.elapsed() < HOT_FOR
            && let Some(entries) = self
                .stream
                .read_waiting(from, count, block, POOL_WAIT)
                .await?
        {
            return Ok(entries);
        }
        let entries = self.stream.read_now(from, count).await?;
        if entries.is_empty()
            && let Some(block) = block
            && !self.bells.listening()
        {
            tokio::time::sleep(block.min(IDLE_POLL)).await;
        }
        Ok(entries)
    }

    /// Settles a batch (`settle`): persisted, acked, or dead letters.
    async fn settle(&self, entries: Vec<Entry>, source: Source) -> Result<Outcome, WorkerError> {
        let settle = Settle {
            product: &self.product,
            sale: &self.sale,
            stream: &self.stream,
            orders: &self.orders,
            cfg: &self.cfg,
            metrics: &self.metrics,
        };
        settle.batch(entries, source).await
    }
}
