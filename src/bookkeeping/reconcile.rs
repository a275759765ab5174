//! Reconciliation after a lost write: when a sale's Redis lost writes that
//! the books already hold (a failover to a replica that had not received
//! them, a restart that lost its last writes), Redis would sell those units
//! again. The workers reconcile each sale when its Redis master changes (see
//! `worker::reconciler`) and once when they start. It reads the sale's orders from MySQL and restores, in
//! Redis, what is missing there (`lua/restore_booked.lua`): the orders with
//! their units, the buyers' counts (so limits hold), the idempotency records
//! (so a retry answers the first order), and lost releases. Online: the sale
//! keeps taking orders; each chunk of orders is restored atomically.
//!
//! What was restored is kept in the sale's `repaired` hash and shown by
//! `flashsale audit`. A negative stock afterwards means the sale oversold
//! before the repair (units that Redis sold again while it did not know
//! them): reported, and the audit fails.

use serde::Serialize;

use super::error::BookkeepingError;
use super::orders::pending_of;
use crate::domain::OrderStatus;
use crate::domain::ProductId;
use crate::sale::{Booked, BookedState, Ledger, Restore, Restored};
use crate::store::{self, OrderRow};

#[derive(Debug, Clone, Serialize)]
pub struct Reconciled {
    pub product_id: String,
    /// False when Redis does not have the sale at all (see `flashsale recover`).
    pub in_redis: bool,
    pub restored: Restored,
}

/// The books' view of each order of `rows` (paid and confirmed sold,
/// cancelled by whether its units went back to Redis).
pub(crate) fn booked(rows: &[OrderRow]) -> Result<Vec<Booked>, BookkeepingError> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let state = match r.status {
            OrderStatus::Confirmed | OrderStatus::Paid => BookedState::Sold,
            OrderStatus::Cancelled if r.released => BookedState::Returned,
            OrderStatus::Cancelled => BookedState::Cancelled,
            OrderStatus::Pending | OrderStatus::Cancelling => continue,
        };
        out.push(Booked {
            order: pending_of(r)?,
            state,
        });
    }
    Ok(out)
}

/// Restores in Redis what the books hold and Redis lost, for one sale.
pub async fn reconcile(
    ledger: &Ledger,
    orders: &store::Orders,
    product: &ProductId,
) -> Result<Reconciled, BookkeepingError> {
    if ledger.stock(product).await?.is_none() {
        return Ok(Reconciled {
            product_id: product.to_string(),
            in_redis: false,
            restored: Restored::default(),
        });
    }
    let rows = orders.orders_of_product(product).await?;
    let restored = ledger
        .restore_booked(product, &booked(&rows)?, Restore::Repair)
        .await?;
    if !restored.is_empty() {
        tracing::warn!(
            product_id = %product,
            orders = restored.orders,
            units = restored.units,
            releases = restored.releases,
            idempotency_records = restored.idempotency_records,
            "redis had lost writes the books hold; restored them"
        );
    }
    if restored.stock < 0 {
        tracing::error!(product_id = %product, oversold = -restored.stock, "the sale oversold while redis had lost writes");
    }
    Ok(Reconciled {
        product_id: product.to_string(),
        in_redis: true,
        restored,
    })
}
