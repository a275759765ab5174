//! `tb_order`: persisted orders, one row per accepted order.

use rust_decimal::Decimal;

use super::{Db, StoreError};
use crate::domain::OrderId;

/// An order row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OrderRow {
    pub order_id: String,
    pub user_id: i64,
    pub product_id: String,
    pub quantity: i64,
    pub price: Decimal,
    pub status: String,
    pub created: i64,
    pub updated: i64,
}

impl Db {
    pub async fn order(&self, order_id: &OrderId) -> Result<Option<OrderRow>, StoreError> {
        self.bounded(async {
            Ok(sqlx::query_as(
                "SELECT order_id, user_id, product_id, quantity, price, status, created, updated \
                 FROM tb_order WHERE order_id = ?",
            )
            .bind(order_id.as_str())
            .fetch_optional(self.pool())
            .await?)
        })
        .await
    }
}
