//! The orders table's handle and its row.

use rust_decimal::Decimal;

use crate::domain::OrderStatus;
use crate::store::db::Db;

/// The orders table's handle.
#[derive(Clone)]
pub struct Orders {
    pub(super) db: Db,
}

/// An order row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OrderRow {
    pub order_id: String,
    pub user_id: i64,
    pub product_id: String,
    pub quantity: i64,
    pub price: Decimal,
    #[sqlx(try_from = "String")]
    pub status: OrderStatus,
    pub created: i64,
    pub updated: i64,
    /// For a cancelled order: its units are back in Redis too.
    pub released: bool,
    /// The Idempotency-Key it was placed with, if any.
    pub idempotency_key: Option<String>,
}

/// The columns of an `OrderRow`.
pub(crate) const ROW: &str = "order_id, user_id, product_id, quantity, price, status, created, updated, released, idempotency_key";
