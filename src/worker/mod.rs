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

pub mod activity;
pub mod deliver;
pub mod drain;
pub mod every;
mod periodic;
pub mod reconciler;
pub mod repair;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prometheus::IntCounterVec;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use drain::{Outcome, SaleWorker};

use activity::Activity;

use crate::books::{Audit, Books, LiveCheck, Reports, Retirer, Settlement, Sweeper};
use crate::config::{RetireSettings, WorkerConfig};
use crate::domain::{Chain, ProductId};
use crate::metrics::Metrics;
use crate::sale::{self, SaleError, Sales};
use crate::store::{self, Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Redis(#[from] SaleError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Books(#[from] crate::books::BooksError),
}

/// The workers of one process.
#[derive(Clone)]
pub struct Workers {
    parts: Arc<Parts>,
    cfg: Arc<WorkerConfig>,
    /// What the workers did (rows persisted, reclaims, dead letters, ...).
    metrics: Arc<Metrics>,
    /// Which sales' drains sleep (for the per-sale passes).
    activity: Activity,
}

/// What the workers use of the two stores: the handles, and the books'
/// parts the periodic passes run.
struct Parts {
    /// The registry of open sales.
    lifecycle: sale::Lifecycle,
    streams: sale::Streams,
    bells: sale::Bells,
    /// Where the books' verdicts are recorded for every instance to show.
    queue: sale::Queue,
    /// What reconciliation restores in Redis.
    ledger: sale::Ledger,
    /// Where the drains persist; whether the database is ready.
    orders: store::Orders,
    products: store::Products,
    events: store::Events,
    deliveries: store::Deliveries,
    /// Where retirements and what repairs put back are listed.
    audits: store::Audits,
    books: Books,
    live: LiveCheck,
    retirer: Retirer,
}

impl Parts {
    fn new(sales: &Sales, db: &Db, retire: RetireSettings) -> Self {
        let audit = Audit::new(
            sales.ledger().clone(),
            (db.products(), db.orders(), db.audits()),
        );
        let redis = (sales.lifecycle().clone(), sales.queue().clone());
        let reports = Reports::new(
            audit.clone(),
            sales.room().clone(),
            (db.seconds(), db.products(), db.orders(), db.payments()),
        );
        let settlement = Settlement::new(redis.clone(), (db.products(), db.orders()), audit);
        let retirer = Retirer::new(
            settlement,
            redis,
            (db.products(), db.events(), db.audits()),
            reports,
            retire,
        );
        Self {
            lifecycle: sales.lifecycle().clone(),
            streams: sales.streams().clone(),
            bells: sales.bells().clone(),
            queue: sales.queue().clone(),
            ledger: sales.ledger().clone(),
            orders: db.orders(),
            products: db.products(),
            events: db.events(),
            deliveries: db.deliveries(),
            audits: db.audits(),
            books: Books::new(
                (sales.accepted().clone(), sales.ledger().clone()),
                (db.orders(), db.payments()),
            ),
            live: LiveCheck::new((sales.queue().clone(), sales.ledger().clone()), db.orders()),
            retirer,
        }
    }
}

impl Workers {
    /// The workers over `sales` and `db`: each part takes the handles it
    /// uses, nothing holds either whole.
    pub fn new(sales: &Sales, db: &Db, cfg: WorkerConfig) -> Self {
        Self {
            parts: Arc::new(Parts::new(sales, db, cfg.retire)),
            cfg: Arc::new(cfg),
            metrics: Arc::default(),
            activity: Activity::default(),
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
        Sweeper::new(
            self.parts.books.clone(),
            self.parts.lifecycle.clone(),
            self.cfg.payment_timeout,
            self.cfg.release_grace,
        )
    }

    /// A drain of one sale, for driving step by step.
    pub fn sale_worker(&self, product: ProductId) -> SaleWorker {
        let parts = &self.parts;
        let stream = parts.streams.stream(&product, &self.cfg.consumer);
        SaleWorker::new(
            product,
            (stream, parts.bells.clone(), parts.orders.clone()),
            self.cfg.clone(),
            (self.metrics.clone(), self.activity.clone()),
        )
    }

    /// Runs a drain per open sale until `shutdown`, each finishing the
    /// batch in hand (commit, ack) before it stops, beside the periodic
    /// passes ([`periodic`]). A sale dropped from the registry has its drain
    /// stopped the same way. Nothing starts before the database is ready
    /// (a drain would fail every batch and spend the entries' deliveries).
    pub async fn run(self, shutdown: CancellationToken) {
        if !self.parts.orders.is_ready() {
            tracing::info!("stream workers wait for the database to be ready");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.parts.orders.wait_ready() => {}
            }
        }
        tracing::info!(consumer = %self.cfg.consumer, "stream workers started");
        let passes = periodic::start(&self, &shutdown);
        let bells = self.parts.bells.clone();
        let panics = self.metrics.task_panics.clone();
        let bells = every::supervised("bells", (shutdown.clone(), panics.clone()), {
            let stop = shutdown.clone();
            move || {
                let (bells, stop) = (bells.clone(), stop.clone());
                async move { bells.listen(stop).await }
            }
        });
        let mut drains = Drains::default();
        loop {
            if let Err(e) = self.step(&mut drains, &shutdown).await {
                tracing::warn!(error = %Chain(&e), "cannot read the registry of open sales");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.registry_refresh) => {}
            }
        }
        drains.stop_all(&panics).await;
        every::report_exit("bells", bells, &panics).await;
        for pass in passes {
            every::report_exit("pass", pass, &panics).await;
        }
        tracing::info!("stream workers stopped");
    }

    /// One look at the registry: a drain starts for each open sale that has
    /// none running, and stops for each sale that left it.
    pub async fn step(
        &self,
        drains: &mut Drains,
        shutdown: &CancellationToken,
    ) -> Result<(), SaleError> {
        let open: HashSet<ProductId> = self
            .parts
            .lifecycle
            .open_sales()
            .await?
            .into_iter()
            .collect();
        for gone in drains.stop_those_not_in(&open) {
            self.parts.bells.forget(&gone);
        }
        for product in open {
            drains.start(product, shutdown, |product, stop| {
                // Cloned only for a drain that starts: every look at the
                // registry goes over every open sale.
                let workers = self.clone();
                let panics = self.metrics.task_panics.clone();
                every::supervised("drain", (stop.clone(), panics), move || {
                    drain::run_sale(workers.sale_worker(product.clone()), stop.clone())
                })
            });
        }
        Ok(())
    }

    /// The retirement passes, for driving pass by pass.
    pub fn retirer(&self) -> Retirer {
        self.parts.retirer.clone()
    }
}

/// The drain task of each open sale, and those stopping.
#[derive(Default)]
pub struct Drains {
    running: HashMap<ProductId, (JoinHandle<()>, CancellationToken)>,
    stopping: Vec<JoinHandle<()>>,
}

impl Drains {
    /// Starts `product`'s drain with `spawn` unless one runs.
    fn start(
        &mut self,
        product: ProductId,
        shutdown: &CancellationToken,
        spawn: impl FnOnce(ProductId, CancellationToken) -> JoinHandle<()>,
    ) {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.running.entry(product) {
            let stop = shutdown.child_token();
            let task = spawn(slot.key().clone(), stop.clone());
            slot.insert((task, stop));
        }
    }

    /// Stops the drains of the sales not in `open` (and forgets those that
    /// ended); returns the sales no longer open.
    fn stop_those_not_in(&mut self, open: &HashSet<ProductId>) -> Vec<ProductId> {
        let gone: Vec<ProductId> = self
            .running
            .iter()
            .filter(|(p, (task, _))| !open.contains(*p) || task.is_finished())
            .map(|(p, _)| p.clone())
            .collect();
        for product in &gone {
            if let Some((task, stop)) = self.running.remove(product) {
                stop.cancel();
                self.stopping.push(task);
            }
        }
        self.stopping.retain(|t| !t.is_finished());
        gone.into_iter().filter(|p| !open.contains(p)).collect()
    }

    /// Waits for every drain to finish its batch and stop.
    /// Waits for every drain to stop; one that ended in a panic is logged
    /// and counted.
    async fn stop_all(self, panics: &IntCounterVec) {
        for task in self
            .running
            .into_values()
            .map(|(t, _)| t)
            .chain(self.stopping)
        {
            every::report_exit("drain", task, panics).await;
        }
    }
}
