//! The sweeper: one pass over the books, which the workers run periodically.
//! It cancels orders unpaid past the payment timeout (each by one process:
//! `SKIP LOCKED`), finishes cancels interrupted between their MySQL and Redis
//! halves, and applies cancels asked while an order was still pending.

use std::time::Duration;

use super::error::BookkeepingError;
use super::orders::OrderLife;
use crate::domain::ProductId;
use crate::sale::Lifecycle;

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    pub expired: usize,
    /// The orders cancelled by their payment timeout, by sale.
    pub expired_by_sale: Vec<(String, u64)>,
    /// The orders cancelled by their buyers' requests made while they were
    /// pending, by sale.
    pub cancelled_by_sale: Vec<(String, u64)>,
    pub repaired: usize,
    pub requests_applied: usize,
}

/// Orders handled per query, so a transaction stays short.
const BATCH: u32 = 200;

/// Queries of expired orders one pass makes at most (while they come back
/// full): 10,000 orders a pass. One query a pass would cancel at most 40
/// orders a second, and a sale whose crowd left 100,000 orders unpaid
/// would wait most of an hour to retire.
const EXPIRY_BATCHES_PER_PASS: u32 = 50;

pub struct Sweeper {
    order_life: OrderLife,
    /// The registry of open sales.
    lifecycle: Lifecycle,
    payment_timeout: Duration,
    release_grace: Duration,
}

impl Sweeper {
    /// Orders unpaid for `payment_timeout` are cancelled; a cancel whose
    /// Redis half is missing for `release_grace` is finished.
    pub fn new(
        order_life: OrderLife,
        lifecycle: Lifecycle,
        payment_timeout: Duration,
        release_grace: Duration,
    ) -> Self {
        Self {
            order_life,
            lifecycle,
            payment_timeout,
            release_grace,
        }
    }

    /// One pass, over every open sale's cancel requests.
    pub async fn sweep(&self) -> Result<Swept, BookkeepingError> {
        self.sweep_picking(|open| open).await
    }

    /// One pass, over the cancel requests of the open sales `pick` keeps
    /// (the workers pick those not quiet: `worker::activity`).
    pub async fn sweep_picking(
        &self,
        pick: impl FnOnce(Vec<ProductId>) -> Vec<ProductId>,
    ) -> Result<Swept, BookkeepingError> {
        let (mut expired, mut by_sale) = (0, std::collections::BTreeMap::<String, u64>::new());
        for _ in 0..EXPIRY_BATCHES_PER_PASS {
            let cancelled = self
                .order_life
                .cancel_expired(self.payment_timeout, BATCH)
                .await?;
            expired += cancelled.len();
            let full = cancelled.len() >= BATCH as usize;
            for sale in cancelled {
                *by_sale.entry(sale).or_default() += 1;
            }
            if !full {
                break;
            }
        }
        let repaired = self
            .order_life
            .repair_releases(self.release_grace, BATCH)
            .await?;
        let (mut requests_applied, mut cancelled_by_sale) = (0, Vec::new());
        // Every stock shard of a sale holds its own orders' requests.
        for product in pick(self.lifecycle.open_streams().await?) {
            let (applied, cancelled) = self.order_life.apply_cancel_requests(&product).await?;
            requests_applied += applied;
            if cancelled > 0 {
                cancelled_by_sale.push((product.sale().into_string(), cancelled));
            }
        }
        Ok(Swept {
            expired,
            expired_by_sale: by_sale.into_iter().collect(),
            cancelled_by_sale,
            repaired,
            requests_applied,
        })
    }
}
