//! A sale's end of life. Once a sale has ended and is settled, the workers
//! retire it, in three steps, each idempotent, in this order:
//!
//! 1. **record**: its final audit goes into `tb_sale_audit` and
//!    `tb_product.retired` is set, in one MySQL transaction, only if the
//!    audit balances and only once (the update is guarded by `retired IS NULL`);
//! 2. **leave**: it leaves the registry of open sales, so every process's
//!    drain, trim, sweep, books check and metrics stop reading it;
//! 3. **purge**: after a grace (`RETIRE_GRACE_SECS`, for a late look with
//!    `redis-cli`, and for other processes to see it gone from the
//!    registry), its keys are deleted (`UNLINK`) and `tb_product.purged` set.
//!
//! A crash between any two steps is finished by the next pass: step 1's
//! record is what the pass looks for (`retired` set, `purged` not), steps 2
//! and 3 are repeated until `purged` is set. Nothing is deleted before the
//! audit is recorded, and a sale is never recorded twice.
//!
//! **Settled** means nothing can change its books any more: its end has
//! passed by the clock of the Redis node that decides its orders (and
//! `RETIRE_AFTER_SECS` more, so that late retries and cancels find it), no
//! entry of its stream is undelivered or pending, no cancel request waits,
//! every cancelled order's units are back in Redis, no order is still
//! `confirmed` (paid, or cancelled by the payment timeout), there are no
//! dead letters (a sale with dead letters waits for an operator), and the
//! full audit balances with nothing pending. From then on no order of the
//! sale can change state: nothing is paid, cancelled or returned after its
//! retirement, so its recorded audit stays true.

use std::time::Duration;

mod settled;

pub use settled::{Assessment, Blocker, Listed, Settlement, state_of};

use settled::{product_id, with_ids};

use super::error::BookkeepingError;
use super::report::Reports;
use crate::config::RetireSettings;
use crate::domain::{Chain, ProductId, now_ms};
use crate::sale::{Lifecycle, Watch};
use crate::store::{self, FinalAudit, Product};

/// How far [`Retirer::retire`] goes (the steps of the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Record,
    Leave,
    Purge,
}

/// What one pass did and found.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// Sales retired by this pass (step 1 done here).
    pub retired: Vec<ProductId>,
    /// Sales whose keys this pass deleted.
    pub purged: Vec<ProductId>,
    /// Ended sales that cannot retire yet, and why (`NotEnded` ones left out).
    pub unsettled: Vec<(ProductId, Vec<Blocker>)>,
    /// Sales this pass could not look at (Redis or MySQL failing): logged.
    pub failed: usize,
}

/// The workers' retirement passes.
#[derive(Clone)]
pub struct Retirer {
    settlement: Settlement,
    lifecycle: Lifecycle,
    /// Where an unsettled sale's reasons are shown.
    watch: Watch,
    products: store::Products,
    /// `sale.ended`, announced once.
    events: store::Events,
    audits: store::Audits,
    /// The sale's report, kept when it retires.
    reports: Reports,
    settings: RetireSettings,
}

impl Retirer {
    pub fn new(
        settlement: Settlement,
        (lifecycle, watch): (Lifecycle, Watch),
        (products, events, audits): (store::Products, store::Events, store::Audits),
        reports: Reports,
        settings: RetireSettings,
    ) -> Self {
        Self {
            reports,
            settlement,
            lifecycle,
            watch,
            products,
            events,
            audits,
            settings,
        }
    }

    /// One pass: every ended sale is assessed and retired when settled
    /// (steps 1 and 2); every retired sale past its grace is purged (step 3,
    /// and step 2 again for a crash between them).
    pub async fn pass(&self) -> Result<Pass, BookkeepingError> {
        let mut pass = Pass::default();
        let mut pace = Pace::new(self.settings.pace);
        self.retire_ended(&mut pass, &mut pace).await?;
        self.purge_retired(&mut pass, &mut pace).await?;
        Ok(pass)
    }

    async fn retire_ended(&self, pass: &mut Pass, pace: &mut Pace) -> Result<(), BookkeepingError> {
        // Every ended sale, including those within RETIRE_AFTER_SECS of their
        // end: what else holds them is recorded from their first pass.
        let ended_by = now_ms();
        let mut ended = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .products
                .ended_unretired(ended_by, after.as_ref(), self.settings.batch)
                .await?;
            let full = page.len() >= self.settings.batch as usize;
            after = page.last().map(|p| (p.end_time, p.product_id.clone()));
            ended.extend(page);
            if !full {
                break;
            }
        }
        for (product, id) in with_ids(&ended) {
            pace.next().await;
            // `sale.ended`, once, before its retirement's event.
            if let Err(e) = self.events.announce_end(id.as_str()).await {
                tracing::warn!(product_id = %id, error = %Chain(&e), "cannot record the sale's end; the next pass retries");
                pass.failed += 1;
                continue;
            }
            match self.retire(product, Step::Leave).await {
                Ok(None) => pass.retired.push(id),
                Ok(Some(blockers)) => {
                    // The wait alone is no reason an operator acts on.
                    let blockers: Vec<Blocker> = blockers
                        .into_iter()
                        .filter(|b| !matches!(b, Blocker::NotEnded { .. }))
                        .collect();
                    match blockers[..] {
                        [] => continue,
                        // No key written for a sale Redis does not have.
                        [Blocker::MissingInRedis] => {}
                        _ => {
                            let codes: Vec<&str> = blockers.iter().map(Blocker::code).collect();
                            if let Err(e) = self.watch.record_unsettled(&id, &codes.join(",")).await
                            {
                                tracing::debug!(product_id = %id, error = %Chain(&e), "cannot record why the sale is not retired");
                            }
                        }
                    }
                    pass.unsettled.push((id, blockers));
                }
                Err(e) => {
                    tracing::warn!(product_id = %id, error = %Chain(&e), "cannot retire the sale; the next pass retries");
                    pass.failed += 1;
                }
            }
        }
        Ok(())
    }

    async fn purge_retired(
        &self,
        pass: &mut Pass,
        pace: &mut Pace,
    ) -> Result<(), BookkeepingError> {
        // Read now: a sale retired by this pass may be due already.
        let due_by = now_ms() - self.settings.grace.as_millis() as i64;
        let mut after = None;
        loop {
            let page = self
                .products
                .unpurged(after.as_ref(), self.settings.batch)
                .await?;
            let full = page.len() >= self.settings.batch as usize;
            after = page
                .last()
                .map(|p| (p.retired.unwrap_or(0), p.product_id.clone()));
            let page = with_ids(&page);
            // Step 2 again, for a crash between steps 1 and 2: one command a page.
            let ids: Vec<ProductId> = page.iter().map(|(_, id)| id.clone()).collect();
            self.lifecycle.forget_all(&ids).await?;
            for (product, id) in page {
                if product.retired.unwrap_or(i64::MAX) > due_by {
                    continue;
                }
                pace.next().await;
                match self.purge(&id).await {
                    Ok(()) => pass.purged.push(id),
                    Err(e) => {
                        tracing::warn!(product_id = %id, error = %Chain(&e), "cannot purge the retired sale; the next pass retries");
                        pass.failed += 1;
                    }
                }
            }
            if !full {
                break;
            }
        }
        Ok(())
    }

    /// Retires `product` if it is settled, up to step `upto` (the pass goes
    /// to [`Step::Leave`]; the purge waits for the grace). `Some(blockers)`
    /// when it is not settled. Each step is idempotent; a retired sale
    /// goes on from step 2.
    pub async fn retire(
        &self,
        product: &Product,
        upto: Step,
    ) -> Result<Option<Vec<Blocker>>, BookkeepingError> {
        let id = product_id(product)?;
        if product.retired.is_none() {
            let assessed = self.settlement.assess(product, self.settings.after).await?;
            let audit = match assessed.audit {
                Some(audit) if assessed.blockers.is_empty() => audit,
                _ => return Ok(Some(assessed.blockers)),
            };
            let recorded = FinalAudit {
                product_id: product.product_id.clone(),
                initial_qty: audit.initial,
                redis_stock: audit.redis_stock.unwrap_or(0),
                confirmed: audit.confirmed,
                paid: audit.paid,
                cancelled: audit.cancelled,
                available_qty: audit.available_qty,
                orders: audit.orders,
                repaired_orders: audit.repaired.orders as i64,
                repaired_units: audit.repaired.units as i64,
                repaired_releases: audit.repaired.releases as i64,
                repaired_idem: audit.repaired.idempotency_records as i64,
                repaired_restocks: audit.repaired.restocks as i64,
                repaired_restock_units: audit.repaired.restock_units,
                retired: now_ms(),
            };
            if self.audits.record_retirement(&recorded).await? {
                tracing::info!(
                    product_id = %id,
                    sold = audit.confirmed + audit.paid,
                    paid = audit.paid,
                    left = recorded.redis_stock,
                    "sale retired: final audit recorded"
                );
            }
        }
        if upto >= Step::Leave {
            // Its report, with the final audit, before Redis forgets it
            // (once: a report kept stands), when the processes' timelines
            // hold its orders' last changes.
            self.settlement.timelines_settled(&id).await?;
            self.reports.keep(&id).await?;
            self.lifecycle.forget(&id).await?;
        }
        if upto >= Step::Purge {
            self.purge(&id).await?;
        }
        Ok(None)
    }

    /// Step 3 of a retired sale: its keys, and its timeline's rows (its
    /// report, kept at step 2, holds them).
    async fn purge(&self, id: &ProductId) -> Result<(), BookkeepingError> {
        self.lifecycle.unlink(id).await?;
        self.reports.forget_timeline(id).await?;
        self.products.mark_purged(id, now_ms()).await?;
        tracing::debug!(product_id = %id, "retired sale's Redis keys deleted");
        Ok(())
    }
}

/// At most one step every `every`: waits out the rest of the previous
/// step's share.
struct Pace {
    every: Duration,
    next: tokio::time::Instant,
}

impl Pace {
    fn new(every: Duration) -> Self {
        Self {
            every,
            next: tokio::time::Instant::now(),
        }
    }

    async fn next(&mut self) {
        tokio::time::sleep_until(self.next).await;
        self.next = tokio::time::Instant::now() + self.every;
    }
}
