//! The workers of one process and what they hold: the handles of the two
//! stores and the books' parts, each taken once (nothing holds either
//! store whole); the handles their passes and drains are driven with.

use std::sync::Arc;

use super::activity::Activity;
use super::drain::SaleWorker;
use crate::bookkeeping::{Audit, LiveCheck, OrderLife, Reports, Retirer, Settlement, Sweeper};
use crate::config::{RetireSettings, WorkerConfig};
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::sale::{self, Sales};
use crate::store::{self, Db};

/// The workers of one process.
#[derive(Clone)]
pub struct Workers {
    pub(super) parts: Arc<Parts>,
    pub(super) cfg: Arc<WorkerConfig>,
    /// What the workers did (rows persisted, reclaims, dead letters, ...).
    pub(super) metrics: Arc<Metrics>,
    /// Which sales' drains sleep (for the per-sale passes).
    pub(super) activity: Activity,
}

/// What the workers use of the two stores: the handles, and the books'
/// parts the periodic passes run.
pub(super) struct Parts {
    /// The registry of open sales.
    pub(super) lifecycle: sale::Lifecycle,
    pub(super) streams: sale::Streams,
    pub(super) bells: sale::Bells,
    /// Where the books' verdicts are recorded for every instance to show.
    pub(super) watch: sale::Watch,
    /// What reconciliation restores in Redis.
    pub(super) ledger: sale::Ledger,
    /// Where the drains persist; whether the database is ready.
    pub(super) orders: store::Orders,
    pub(super) products: store::Products,
    pub(super) events: store::Events,
    pub(super) deliveries: store::Deliveries,
    /// Where retirements and what repairs put back are listed.
    pub(super) audits: store::Audits,
    pub(super) order_life: OrderLife,
    pub(super) live: LiveCheck,
    pub(super) retirer: Retirer,
}

impl Parts {
    fn new(sales: &Sales, db: &Db, retire: RetireSettings) -> Self {
        let audit = Audit::new(
            sales.ledger().clone(),
            (db.products(), db.orders(), db.audits()),
        );
        let redis = (sales.lifecycle().clone(), sales.watch().clone());
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
            watch: sales.watch().clone(),
            ledger: sales.ledger().clone(),
            orders: db.orders(),
            products: db.products(),
            events: db.events(),
            deliveries: db.deliveries(),
            audits: db.audits(),
            order_life: OrderLife::new(
                (sales.accepted().clone(), sales.ledger().clone()),
                (db.orders(), db.payments()),
            ),
            live: LiveCheck::new((sales.watch().clone(), sales.ledger().clone()), db.orders()),
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
            self.parts.order_life.clone(),
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

    /// The retirement passes, for driving pass by pass.
    pub fn retirer(&self) -> Retirer {
        self.parts.retirer.clone()
    }
}
