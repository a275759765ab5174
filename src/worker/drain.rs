//! One sale's drain: a step (read a batch, persist it in one transaction, ack)
//! and a loop around it (waiting, back-off, reclaiming, trimming, shutdown).
//!
//! The invariant: an entry is acked only after its row is committed (or after
//! its dead letter is written). A crash anywhere leaves the entry pending, to
//! be re-read by this consumer or reclaimed by another; the UNIQUE order id
//! makes the second insert a no-op.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::activity::Activity;
use super::{WorkerConfig, WorkerError};
use crate::domain::PendingOrder;
use crate::domain::ProductId;
use crate::domain::{Chain, backoff};
use crate::metrics::Metrics;
use crate::sale::{Bells, Entry, SaleStream};
use crate::store::{self, Persisted};

/// Where a batch came from: read by this worker, or reclaimed from an
/// idle one (its entries may have been delivered, and failed, before: their
/// delivery counts decide which go to dead letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Read,
    Reclaimed,
}

/// Where the next read starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    /// Re-reading this consumer's own pending entries, after this id
    /// (`0` at start and after a failed batch).
    Own(String),
    /// New entries (`>`).
    New,
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

/// The drain of one sale's stream by one consumer.
pub struct SaleWorker {
    product: ProductId,
    stream: SaleStream,
    /// What wakes this drain when its sale is quiet.
    bells: Bells,
    /// Where its orders are persisted.
    orders: store::Orders,
    cfg: Arc<WorkerConfig>,
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

/// Entries of a batch with the orders they carry.
type Batch<'a> = Vec<(&'a Entry, PendingOrder)>;

/// How long a sale counts as selling after its last new entry.
const HOT_FOR: Duration = Duration::from_secs(10);
/// How often an idle sale's stream is polled when it cannot sleep on its
/// bell (no bell subscription, or entries pending to another consumer).
const IDLE_POLL: Duration = Duration::from_millis(500);
/// How long a drain sleeps on its bell before it looks anyway (a bell lost
/// without the subscription noticing; trimming), spread ±25% so that the
/// drains of many quiet sales do not look all at once.
const SLEEP_CHECK: Duration = Duration::from_secs(300);
/// How long a read waits for a free pooled connection before it polls instead.
const POOL_WAIT: Duration = Duration::from_millis(20);

impl SaleWorker {
    /// The drain of `product`'s stream, with the handles its supervisor gives it.
    pub(super) fn new(
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
    fn may_trim(&self) -> bool {
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
        let check = SLEEP_CHECK - spread + spread.mul_f64(2.0 * super::every::unit_random());
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

    /// Persists what parses in one transaction, acks it, and deals with the
    /// rest: parse, claim (after the replicas have the batch), persist, ack,
    /// then the poison entries.
    async fn settle(&self, entries: Vec<Entry>, source: Source) -> Result<Outcome, WorkerError> {
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
            match e.order(&self.product) {
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
        let (persisted, good) = match self.orders.persist_orders(&self.product, &orders).await {
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
            for (_, order) in &good {
                let waited = (now - order.created_ms).max(0) as f64 / 1000.0;
                metrics.accept_to_persist.observe(waited);
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
                .persist_orders(&self.product, std::slice::from_ref(&order))
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
    fn add(self, o: Outcome) -> Outcome {
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

/// Drains one sale until `shutdown`: steps, with a reclaim pass every half
/// claim-idle time and a trim every `trim_every`; a step that finds nothing
/// sleeps on the sale's bell ([`SaleWorker::sleep`]), and a drain woken
/// without finding anything sleeps again at once (nothing is pending then:
/// no reclaim; a trim only while entries may still age out). Errors back
/// off (capped); nothing is dropped mid-batch: shutdown is checked between
/// steps, and a step is bounded by the block time.
pub async fn run_sale(mut w: SaleWorker, shutdown: CancellationToken) {
    let cfg = w.cfg.clone();
    // Set at a failure, cleared at a success: the waits start over.
    let mut backoff = None;
    let reclaim_every = (cfg.claim_idle / 2).max(Duration::from_millis(50));
    let mut next_reclaim = Instant::now() + reclaim_every;
    let mut next_trim = Instant::now() + cfg.trim_every;
    let mut slept = false;
    while !shutdown.is_cancelled() {
        let mut result = w.step().await.map(|o| o.read);
        let quiet = slept && matches!(result, Ok(0));
        if quiet {
            if w.may_trim() {
                result = w.trim().await.map(|_| 0);
            }
        } else {
            if result.is_ok() && Instant::now() >= next_reclaim {
                result = w.reclaim().await.map(|o| o.read);
                next_reclaim = Instant::now() + reclaim_every;
            }
            if result.is_ok() && Instant::now() >= next_trim {
                result = w.trim().await.map(|_| 0);
                next_trim = Instant::now() + cfg.trim_every;
            }
        }
        match result {
            Ok(read) => {
                backoff = None;
                slept = false;
                if read == 0 {
                    match w.sleep(&shutdown).await {
                        Ok(s) => slept = s,
                        Err(e) => {
                            tracing::warn!(product_id = %w.product, error = %Chain(&e), "cannot sleep on the bell; polling");
                        }
                    }
                    if !slept && w.bells.listening() {
                        // Something waits that this drain cannot read (another
                        // consumer's pending entries): poll, as without bells.
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(IDLE_POLL) => {}
                        }
                    }
                }
            }
            Err(e) => {
                slept = false;
                let wait = backoff
                    .get_or_insert_with(|| backoff::doubling(cfg.backoff_min, cfg.backoff_max))
                    .next()
                    .unwrap_or(cfg.backoff_max);
                tracing::warn!(product_id = %w.product, error = %Chain(&e), retry_in = ?wait, "drain failed; backing off");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    if let Err(e) = w.finish().await {
        tracing::warn!(product_id = %w.product, error = %Chain(&e), "batch read ahead left pending");
    }
    tracing::debug!(product_id = %w.product, "drain stopped");
}
