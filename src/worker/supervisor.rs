//! The supervisor: a drain per open sale, started and stopped as the
//! registry of open sales changes, beside the periodic passes; on shutdown
//! each drain finishes the batch in hand (commit, ack) before it stops.

use std::collections::{HashMap, HashSet};

use prometheus::IntCounterVec;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::parts::Workers;
use super::{drain, every, periodic};
use crate::domain::{Chain, ProductId};
use crate::sale::SaleError;

impl Workers {
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
            .open_streams()
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
        if let std::collections::hash_map::Entry::Vacant(vacant) = self.running.entry(product) {
            let stop = shutdown.child_token();
            let task = spawn(vacant.key().clone(), stop.clone());
            vacant.insert((task, stop));
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
