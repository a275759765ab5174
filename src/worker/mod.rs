//! The stream workers: move each sale's accepted orders from its Redis Stream
//! into MySQL, with the stream's consumer group as the only queue.
//!
//! A supervisor ([`Workers::run`]) reads the registry of open sales every few
//! seconds and runs one drain task per sale ([`drain`]): `XREADGROUP` a batch,
//! one MySQL transaction, then `XACK`; `XAUTOCLAIM` for entries a crashed
//! consumer left pending; dead letters for entries that can never be
//! persisted; trimming of acked entries past their retention. Every command
//! touches one sale's keys only. Beside them, a periodic pass of the books'
//! [`Sweeper`] (payment timeouts, interrupted cancels), the [`reconciler`]
//! (what a failover lost in Redis, restored from the books) and the
//! retirement passes (`books::retire`: ended, settled sales leave the
//! registry, so their drains stop).

pub mod drain;
pub mod reconciler;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use drain::{Outcome, SaleWorker};

use crate::books::retire::{RetireSettings, Retirer};
use crate::books::{self, Books, Sweeper};
use crate::domain::Chain;
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::sale::queue::BooksVerdict;
use crate::sale::{SaleError, Sales};
use crate::store::{Db, StoreError};

/// The largest `BATCH_SIZE`: a batch is one multi-row INSERT of 9 values
/// a row, and MySQL takes at most 65,535 placeholders in one statement.
pub const MAX_BATCH_SIZE: usize = 5_000;

/// The workers' settings' defaults: the one place they are written (the
/// command line shows them, [`WorkerConfig::default`] uses them).
pub mod defaults {
    pub const BATCH_SIZE: usize = 500;
    pub const BLOCK_MS: u64 = 2_000;
    pub const CLAIM_IDLE_MS: u64 = 15_000;
    pub const MAX_DELIVERIES: u64 = 5;
    pub const STREAM_RETENTION_SECS: u64 = 600;
    pub const PAYMENT_TIMEOUT_SECS: u64 = 900;
    pub const BOOKS_CHECK_MS: u64 = 5_000;
    pub const RETIRE_CHECK_MS: u64 = 10_000;
}

/// How the workers behave.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This process's consumer name in every sale's group; unique per process.
    pub consumer: String,
    /// Entries per `XREADGROUP` (and rows per MySQL transaction).
    pub batch_size: usize,
    /// How long a read waits for new entries.
    pub block: Duration,
    /// Entries pending longer than this are taken over from their consumer.
    pub claim_idle: Duration,
    /// Deliveries after which an entry that cannot be persisted is dead-lettered.
    pub max_deliveries: u64,
    /// Acked entries stay in the stream this long, for operators.
    pub retention: Duration,
    pub trim_every: Duration,
    /// How often the registry of open sales is read.
    pub registry_refresh: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Orders confirmed and unpaid this long are cancelled.
    pub payment_timeout: Duration,
    /// How often the sweeper passes (payment timeouts, interrupted cancels).
    pub sweep_every: Duration,
    /// How often the Redis masters behind the open sales are checked for a
    /// change (a failover, a restart) that calls for reconciliation.
    pub reconcile_every: Duration,
    /// A cancel's Redis half missing for this long counts as interrupted.
    pub release_grace: Duration,
    /// How often every open sale's books are checked (`books::live`);
    /// zero: never.
    pub books_every: Duration,
    /// How often ended sales are looked at for retirement
    /// (`books::retire`); zero: never.
    pub retire_every: Duration,
    pub retire: RetireSettings,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            consumer: default_consumer_name(),
            batch_size: defaults::BATCH_SIZE,
            block: Duration::from_millis(defaults::BLOCK_MS),
            claim_idle: Duration::from_millis(defaults::CLAIM_IDLE_MS),
            max_deliveries: defaults::MAX_DELIVERIES,
            retention: Duration::from_secs(defaults::STREAM_RETENTION_SECS),
            trim_every: Duration::from_secs(5),
            registry_refresh: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            payment_timeout: Duration::from_secs(defaults::PAYMENT_TIMEOUT_SECS),
            sweep_every: Duration::from_secs(5),
            reconcile_every: Duration::from_secs(1),
            release_grace: Duration::from_secs(10),
            books_every: Duration::from_millis(defaults::BOOKS_CHECK_MS),
            retire_every: Duration::from_millis(defaults::RETIRE_CHECK_MS),
            retire: RetireSettings::default(),
        }
    }
}

/// `<hostname>-<pid>`: unique across hosts and across processes on one host.
pub fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "flashsale".into());
    format!("{host}-{}", std::process::id())
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Redis(#[from] SaleError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The workers of one process.
#[derive(Clone)]
pub struct Workers {
    sales: Sales,
    db: Db,
    cfg: Arc<WorkerConfig>,
    /// What the workers did (rows persisted, reclaims, dead letters, ...).
    metrics: Arc<Metrics>,
}

impl Workers {
    pub fn new(sales: Sales, db: Db, cfg: WorkerConfig) -> Self {
        Self {
            sales,
            db,
            cfg: Arc::new(cfg),
            metrics: Arc::default(),
        }
    }

    /// Reports into `metrics` (the process's registry) from now on.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The sweeper, for driving pass by pass.
    pub fn sweeper(&self) -> Sweeper {
        let books = Books::new(self.sales.clone(), self.db.clone());
        Sweeper::new(
            books,
            self.sales.clone(),
            self.cfg.payment_timeout,
            self.cfg.release_grace,
        )
    }

    /// A drain of one sale, for driving step by step.
    pub fn sale_worker(&self, product: ProductId) -> SaleWorker {
        SaleWorker::new(
            product,
            self.sales.clone(),
            self.db.clone(),
            self.cfg.clone(),
            self.metrics.clone(),
        )
    }

    /// Runs a drain task per open sale until `shutdown`; each task finishes
    /// the batch in hand (commit, ack) before it stops. A sale dropped from the
    /// registry has its drain stopped the same way.
    /// Nothing starts before the database is ready (a drain would fail every
    /// batch and spend the entries' deliveries).
    pub async fn run(self, shutdown: CancellationToken) {
        if !self.db.is_ready() {
            tracing::info!("stream workers wait for the database to be ready");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.db.wait_ready() => {}
            }
        }
        tracing::info!(consumer = %self.cfg.consumer, "stream workers started");
        let sweeping = tokio::spawn(sweep(
            self.sweeper(),
            self.cfg.sweep_every,
            shutdown.clone(),
        ));
        let reconciling = tokio::spawn(reconciler::run(
            reconciler::Reconciler::new(self.sales.clone(), self.db.clone()),
            self.cfg.reconcile_every,
            shutdown.clone(),
        ));
        let watching = tokio::spawn(self.clone().watch_books(shutdown.clone()));
        let retiring = tokio::spawn(self.clone().retire(shutdown.clone()));
        let mut running: HashMap<ProductId, (JoinHandle<()>, CancellationToken)> = HashMap::new();
        let mut stopping: Vec<JoinHandle<()>> = Vec::new();
        loop {
            match self.sales.lifecycle.open_sales().await {
                Ok(open) => {
                    let open: std::collections::HashSet<ProductId> = open.into_iter().collect();
                    let gone: Vec<ProductId> = running
                        .iter()
                        .filter(|(p, (task, _))| !open.contains(*p) || task.is_finished())
                        .map(|(p, _)| p.clone())
                        .collect();
                    for product in gone {
                        if let Some((task, stop)) = running.remove(&product) {
                            stop.cancel();
                            stopping.push(task);
                        }
                    }
                    for product in open {
                        if let std::collections::hash_map::Entry::Vacant(slot) =
                            running.entry(product.clone())
                        {
                            let stop = shutdown.child_token();
                            let task = drain::run_sale(self.sale_worker(product), stop.clone());
                            slot.insert((tokio::spawn(task), stop));
                        }
                    }
                    stopping.retain(|t| !t.is_finished());
                }
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "cannot read the registry of open sales")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.registry_refresh) => {}
            }
        }
        for task in running.into_values().map(|(t, _)| t).chain(stopping) {
            let _ = task.await;
        }
        let _ = sweeping.await;
        let _ = reconciling.await;
        let _ = watching.await;
        let _ = retiring.await;
        tracing::info!("stream workers stopped");
    }

    /// The retirement passes, for driving pass by pass.
    pub fn retirer(&self) -> Retirer {
        Retirer::new(self.sales.clone(), self.db.clone(), self.cfg.retire)
    }

    /// A retirement pass every `retire_every` until `shutdown`, with the
    /// sales-by-state gauges set from what it found.
    async fn retire(self, shutdown: CancellationToken) {
        if self.cfg.retire_every.is_zero() {
            return;
        }
        let retirer = self.retirer();
        loop {
            match retirer.pass().await {
                Ok(pass) => self.count_states(&pass).await,
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "retirement pass failed; the next one retries")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.retire_every) => {}
            }
        }
    }

    async fn count_states(&self, pass: &books::retire::Pass) {
        let m = &self.metrics;
        m.sales_retired.inc_by(pass.retired.len() as u64);
        m.sales_purged.inc_by(pass.purged.len() as u64);
        m.sale_unsettled.reset();
        for (product, blockers) in &pass.unsettled {
            for b in blockers {
                m.sale_unsettled
                    .with_label_values(&[product.as_str(), b.code()])
                    .set(1);
            }
        }
        let unsettled = pass.unsettled.len() as i64;
        m.sales
            .with_label_values(&["ended_unsettled"])
            .set(unsettled);
        if let Ok(open) = self.sales.lifecycle.open_sales().await {
            m.sales
                .with_label_values(&["open"])
                .set((open.len() as i64 - unsettled).max(0));
        }
        if let Ok(retired) = self.db.retired_count().await {
            m.sales.with_label_values(&["retired"]).set(retired);
        }
    }

    /// Checks every open sale's books every `books_every` until `shutdown`,
    /// and exports the verdicts (`flashsale_sale_books_balanced`,
    /// `flashsale_sale_books_difference`, and in the sale's `books` key for
    /// the dashboards); a sale that leaves the registry leaves the gauges.
    async fn watch_books(self, shutdown: CancellationToken) {
        if self.cfg.books_every.is_zero() {
            return;
        }
        let mut verdicts = books::live::Verdicts::default();
        loop {
            match self.sales.lifecycle.open_sales().await {
                Ok(open) => {
                    for product in &open {
                        let checked = books::live::check(
                            &self.sales,
                            &self.db,
                            product,
                            self.cfg.release_grace,
                            &mut verdicts,
                        )
                        .await;
                        match checked {
                            Ok(Some(v)) => {
                                self.metrics
                                    .books(product.as_str(), v.balanced, v.difference);
                                let recorded = BooksVerdict {
                                    balanced: v.balanced,
                                    difference: v.difference,
                                    judged_ms: crate::domain::now_ms(),
                                };
                                if let Err(e) =
                                    self.sales.queue.record_books(product, recorded).await
                                {
                                    tracing::warn!(%product, error = %Chain(&e), "cannot record the books verdict");
                                }
                            }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(%product, error = %Chain(&e), "cannot check the books")
                            }
                        }
                    }
                    for gone in verdicts.retain(&open) {
                        self.metrics.forget_books(gone.as_str());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "cannot read the registry of open sales")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.books_every) => {}
            }
        }
    }
}

/// Runs a pass of `sweeper` every `every` until `shutdown`.
async fn sweep(sweeper: Sweeper, every: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = sweeper.sweep().await {
            tracing::warn!(error = %Chain(&e), "sweep failed; next pass retries");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
