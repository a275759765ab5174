//! The reconciler: watches the Redis master behind each open sale and, when
//! it changes (a failover promoted a replica, a server restarted), restores
//! in Redis what the books hold and the new master lost (see
//! `bookkeeping::reconcile`). Every sale is reconciled once when the workers start
//! too, since a failover may have happened while none ran.
//!
//! With `REDIS_WAIT_REPLICAS` ≥ 1 a failover loses nothing the books hold
//! (workers persist only what the replicas have), so this finds nothing to
//! do. With 0, it closes the window in which the new master would sell
//! again units the books hold: at most one check interval plus one pass
//! after the new master serves (see docs/redis.md, Redis Cluster).

use crate::bookkeeping::BookkeepingError;
use crate::bookkeeping::reconcile::reconcile;
use crate::domain::ProductId;
use crate::sale::{Ledger, Lifecycle, RestockAnswer, RestockBy};
use crate::store;
use std::collections::{HashMap, HashSet};

/// The sales reconciled since their master last changed.
pub struct Reconciler {
    lifecycle: Lifecycle,
    ledger: Ledger,
    orders: store::Orders,
    /// Whether the books say a sale is paused, and its restocks.
    products: store::Products,
    /// Product -> the master epoch it was last reconciled under.
    seen: HashMap<ProductId, String>,
    /// The open sales and their epochs at the last check that finished.
    last: Option<(Vec<ProductId>, Vec<String>)>,
}

impl Reconciler {
    pub fn new(
        (lifecycle, ledger): (Lifecycle, Ledger),
        (orders, products): (store::Orders, store::Products),
    ) -> Self {
        Self {
            lifecycle,
            ledger,
            orders,
            products,
            seen: HashMap::new(),
            last: None,
        }
    }

    /// One check: reconciles the sales whose master changed (or that were
    /// never reconciled by this process); returns how many were reconciled.
    pub async fn check(&mut self) -> Result<usize, BookkeepingError> {
        // Every sale and each of its stock shards k >= 1 (`<pid>~<k>`):
        // each may have a master of its own.
        let open = self.lifecycle.open_streams().await?;
        let epochs = self.lifecycle.master_epochs(&open).await?;
        // The same sales under the same masters as at the last check: each
        // was reconciled under its master, nothing to do. Compared as lists
        // (the registry's order is stable while it does not change): with
        // 10,000 quiet sales, hashing every id every second was most of
        // what an idle process spent between the 5-minute looks.
        if self
            .last
            .as_ref()
            .is_some_and(|(sales, masters)| *sales == open && *masters == epochs)
        {
            return Ok(0);
        }
        let last = (open.clone(), epochs.clone());
        // A set: with thousands of open sales, a scan of the list per sale
        // (every second) was most of an idle process's CPU.
        let listed: HashSet<&ProductId> = open.iter().collect();
        self.seen.retain(|p, _| listed.contains(p));
        // The sales one of whose masters changed, with their new epochs.
        let mut changed: Vec<(ProductId, Vec<(ProductId, String)>)> = Vec::new();
        for (stream, epoch) in open.into_iter().zip(epochs) {
            if self.seen.get(&stream) == Some(&epoch) {
                continue;
            }
            let sale = stream.sale();
            match changed.iter_mut().find(|(s, _)| *s == sale) {
                Some((_, streams)) => streams.push((stream, epoch)),
                None => changed.push((sale, vec![(stream, epoch)])),
            }
        }
        let mut done = 0;
        for (sale, streams) in changed {
            self.reconcile(&sale).await?;
            self.seen.extend(streams);
            done += 1;
        }
        self.last = Some(last);
        Ok(done)
    }

    /// One sale under a new master: the restocks it lost made again, then
    /// its orders and releases, then its pause.
    async fn reconcile(&self, product: &ProductId) -> Result<(), BookkeepingError> {
        // Moves between stock shards left half done (a caller died, or a
        // master failed over under it): finished first, so that the units
        // are where the books' orders are restored.
        let moves = self.ledger.repair_moves(product).await?;
        if moves > 0 {
            tracing::warn!(product_id = %product, moves, "finished moves of units between stock shards that were left half done");
        }
        // Restocks the new master lost: made again, once each (the script
        // knows the ones it has), counted as repaired; before the orders, so
        // that units restocked and sold are not seen as oversold. (A sale
        // Redis does not have answers `NoSale`.)
        for (id, units) in self.products.restocks_of(product).await? {
            let made = self
                .lifecycle
                .restock(product, units, &id, RestockBy::PutBack)
                .await?;
            if let RestockAnswer::Done {
                applied: true,
                stock,
                ..
            } = made
            {
                tracing::warn!(product_id = %product, restock_id = %id, units, stock, "redis had lost a restock the books hold; made again");
                if stock < 0 {
                    tracing::error!(product_id = %product, oversold = -stock, "the sale oversold while redis had lost a restock that took units away");
                }
            }
        }
        let reconciled = reconcile(&self.ledger, &self.orders, product).await?;
        // A pause the new master lost (written after its last replication):
        // paused again, as the books have it.
        if reconciled.in_redis
            && let Some(p) = self.products.product(product).await?
            && p.paused.is_some()
            && let Some(paused) = self.lifecycle.pause(product, true).await?
            && paused.changed
        {
            tracing::warn!(product_id = %product, "redis had lost the sale's pause; paused again, as the books have it");
        }
        Ok(())
    }
}
