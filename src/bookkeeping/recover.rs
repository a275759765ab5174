//! `flashsale recover --product ID`: rebuilds a sale in Redis from MySQL after
//! Redis lost it (a restart without persistence, a flushed database).
//!
//! From `tb_order`, with the same script as reconciliation
//! (`lua/restore_booked.lua`) on a stock reset to `initial`: the stock is
//! `initial − confirmed − paid` (cancelled units are back on sale), each
//! buyer's count is the units of their confirmed and paid orders (so the
//! per-user limit still holds), the released set holds every cancelled order
//! (so none is given back twice), and each order's record and idempotency
//! record are back (a retry with the key answers the first order). The sale
//! hash, which lets orders in, is written last.
//!
//! It refuses when Redis still has the sale, or when the sale's stream holds
//! orders MySQL does not have yet (recovering then would forget them), unless
//! forced.

use std::collections::HashSet;

use serde::Serialize;

use super::error::BookkeepingError;
use crate::domain::{ProductId, UserId};
use crate::sale::{BookedState, Ledger, Lifecycle, Restore, SaleError};
use crate::store::{self, OrderRow, Product};

/// Whether a rebuild may go ahead over what Redis still holds of the sale
/// (its hash, or orders in its stream MySQL does not have: those would be
/// forgotten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Refuse (the default).
    Refuse,
    /// `--force`: rebuild anyway.
    Force,
}

#[derive(Debug, Clone, Serialize)]
pub struct Recovered {
    pub product_id: String,
    pub stock: i64,
    pub buyers: usize,
    pub released: usize,
}

/// Rebuilding a sale in Redis from the books.
#[derive(Clone)]
pub struct Recovery {
    ledger: Ledger,
    lifecycle: Lifecycle,
    products: store::Products,
    orders: store::Orders,
}

impl Recovery {
    pub fn new(
        (ledger, lifecycle): (Ledger, Lifecycle),
        (products, orders): (store::Products, store::Orders),
    ) -> Self {
        Self {
            ledger,
            lifecycle,
            products,
            orders,
        }
    }

    pub async fn recover(
        &self,
        product_id: &ProductId,
        overwrite: Overwrite,
    ) -> Result<Recovered, BookkeepingError> {
        let product = self
            .products
            .product(product_id)
            .await?
            .ok_or(BookkeepingError::NoProduct)?;
        let rows = self.orders.orders_of_product(product_id).await?;
        self.may_recover((product_id, &product), &rows, overwrite)
            .await?;

        // Closed while it is rebuilt: without the sale hash every order is
        // refused. The stock starts full and the books' orders are taken off it.
        self.ledger
            .reset(
                product_id,
                product.initial_qty.max(0) as u64,
                u16::try_from(product.stock_shards).unwrap_or(1),
            )
            .await?;
        // `initial_qty` counts the restocks: Redis knows them as done.
        let restocks = self.products.restocks_of(product_id).await?;
        self.lifecycle.restocks_done(product_id, &restocks).await?;
        let booked = super::reconcile::booked(&rows)?;
        let restored = self
            .ledger
            .restore_booked(product_id, &booked, Restore::Rebuild)
            .await?;
        // A sale of several stock shards: each restored order took its
        // units off its own shard; what is left is split again at the open.
        let sold: u64 = booked
            .iter()
            .filter(|b| b.state == BookedState::Sold)
            .map(|b| b.order.quantity.get())
            .sum();
        let stock = match product.stock_shards {
            ..=1 => restored.stock.max(0),
            _ => (product.initial_qty.max(0) - sold as i64).max(0),
        };
        let (opened, _) = self
            .lifecycle
            .open(
                product_id,
                &super::catalog::sale_spec(&product, stock as u64),
            )
            .await?;
        if !opened {
            return Err(SaleError::Corrupt(
                "the sale reappeared while it was being recovered".into(),
            )
            .into());
        }
        self.orders.mark_all_released(product_id).await?;
        let buyers: HashSet<UserId> = booked
            .iter()
            .filter(|b| b.state == BookedState::Sold)
            .map(|b| b.order.user_id)
            .collect();
        let released = booked
            .iter()
            .filter(|b| b.state != BookedState::Sold)
            .count();
        tracing::info!(product_id = %product_id, stock, buyers = buyers.len(), "sale recovered from MySQL");
        Ok(Recovered {
            product_id: product_id.to_string(),
            stock,
            buyers: buyers.len(),
            released,
        })
    }

    /// Refused when recovering the sale would lose something: a retired
    /// sale's final books, or (unless `overwrite`) what Redis still holds.
    async fn may_recover(
        &self,
        (id, product): (&ProductId, &Product),
        rows: &[OrderRow],
        overwrite: Overwrite,
    ) -> Result<(), BookkeepingError> {
        if product.retired.is_some() {
            return Err(BookkeepingError::Refused(
                "the sale is retired: its books are final and it never opens again".into(),
            ));
        }
        if self.ledger.has_sale(id).await? && overwrite == Overwrite::Refuse {
            return Err(BookkeepingError::Refused(
                "Redis still has this sale".into(),
            ));
        }
        let persisted: HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
        let unpersisted = self.ledger.unpersisted_orders(id, &persisted).await?;
        if unpersisted > 0 && overwrite == Overwrite::Refuse {
            return Err(BookkeepingError::Refused(format!(
                "the sale's stream holds {unpersisted} orders not yet in MySQL; let the workers drain it first"
            )));
        }

        Ok(())
    }
}
