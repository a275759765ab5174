//! The orders table's handle and its row.

use rust_decimal::Decimal;

use crate::domain::OrderStatus;
use crate::store::db::Db;
use crate::store::error::StoreError;

/// The orders table's handle.
#[derive(Clone)]
pub struct Orders {
    pub(super) db: Db,
}

/// An order row.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderRow {
    pub order_id: String,
    pub user_id: i64,
    pub product_id: String,
    pub quantity: i64,
    pub price: Decimal,
    pub status: OrderStatus,
    pub created: i64,
    pub updated: i64,
    /// For a cancelled order: its units are back in Redis too.
    pub released: bool,
    /// The Idempotency-Key it was placed with, if any.
    pub idempotency_key: Option<String>,
}

/// An order row as the query reads it: its status still the books' text.
pub(crate) struct OrderRecord {
    pub order_id: String,
    pub user_id: i64,
    pub product_id: String,
    pub quantity: i64,
    pub price: Decimal,
    pub status: String,
    pub created: i64,
    pub updated: i64,
    pub released: bool,
    pub idempotency_key: Option<String>,
}

impl TryFrom<OrderRecord> for OrderRow {
    type Error = StoreError;

    fn try_from(r: OrderRecord) -> Result<Self, StoreError> {
        let status = OrderStatus::try_from(r.status)
            .map_err(|e| StoreError::Corrupt(format!("order {}: {e}", r.order_id)))?;
        Ok(Self {
            order_id: r.order_id,
            user_id: r.user_id,
            product_id: r.product_id,
            quantity: r.quantity,
            price: r.price,
            status,
            created: r.created,
            updated: r.updated,
            released: r.released,
            idempotency_key: r.idempotency_key,
        })
    }
}

/// The rows read, each checked ([`OrderRecord`] to [`OrderRow`]).
pub(crate) fn checked(rows: Vec<OrderRecord>) -> Result<Vec<OrderRow>, StoreError> {
    rows.into_iter().map(OrderRow::try_from).collect()
}

/// Whole order rows, checked at build time like every static query:
/// `$rest` is what follows `FROM tb_order` (an index hint, the `WHERE`),
/// then its arguments. Yields [`OrderRecord`]s.
macro_rules! order_rows {
    ($rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            $crate::store::orders::row::OrderRecord,
            "SELECT order_id, user_id, product_id, quantity, price, status, created, updated, \
             released AS `released: bool`, idempotency_key FROM tb_order " + $rest
            $(, $arg)*
        )
    };
}
pub(crate) use order_rows;
