//! The books' reads of the orders: one order, a buyer's, a sale's sums.

use super::row::{OrderRow, Orders, checked, order_rows};
use crate::domain::{OrderId, OrderStatus, ProductId, UserId};
use crate::store::db::Db;
use crate::store::error::StoreError;

impl Orders {
    /// The server that holds the books now ([`Db::server_identity`]).
    pub async fn server_identity(&self) -> Result<String, StoreError> {
        self.db.server_identity().await
    }

    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// True once the database is created and migrated (see
    /// [`Db::migrate_until_ready`]).
    pub fn is_ready(&self) -> bool {
        self.db.is_ready()
    }

    /// Completes once the database is created and migrated.
    pub async fn wait_ready(&self) {
        self.db.wait_ready().await
    }

    /// MySQL answers (the service's readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.ping().await
    }

    pub async fn order(&self, order_id: &OrderId) -> Result<Option<OrderRow>, StoreError> {
        self.db
            .call(|pool| async move {
                order_rows!("WHERE order_id = ?", order_id.as_str())
                    .fetch_optional(pool)
                    .await
            })
            .await?
            .map(OrderRow::try_from)
            .transpose()
    }

    /// The status of each of `ids` the books hold (the others are missing).
    pub async fn statuses(
        &self,
        ids: &[&str],
    ) -> Result<std::collections::HashMap<String, OrderStatus>, StoreError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let rows: Vec<(String, String)> = self
            .db
            .call(|pool| async move {
                // A runtime query: its `IN` list is as long as `ids`.
                let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "SELECT order_id, status FROM tb_order WHERE order_id IN (",
                );
                let mut list = q.separated(", ");
                for id in ids {
                    list.push_bind(*id);
                }
                q.push(")");
                q.build_query_as().fetch_all(pool).await
            })
            .await?;
        rows.into_iter()
            .map(|(id, status)| {
                let status = OrderStatus::try_from(status)
                    .map_err(|e| StoreError::Corrupt(format!("order {id}: {e}")))?;
                Ok((id, status))
            })
            .collect()
    }

    /// A user's orders, newest first; at most `limit`, older than `before` (epoch ms) if given.
    pub async fn orders_of_user(
        &self,
        user_id: UserId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<OrderRow>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                order_rows!(
                    "WHERE user_id = ? AND created < ? ORDER BY created DESC, id DESC LIMIT ?",
                    user_id.as_i64(),
                    before.unwrap_or(i64::MAX),
                    limit,
                )
                .fetch_all(pool)
                .await
            })
            .await?;
        checked(rows)
    }

    /// The second half of a cancel is done: the units are back in Redis.
    pub async fn mark_released(&self, order_id: &str) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "UPDATE tb_order SET released = 1 WHERE order_id = ? AND status = ?",
                    order_id,
                    OrderStatus::Cancelled.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)
    }

    /// Cancelled orders whose Redis half did not happen (a crash between the
    /// two), last touched before `updated_before`.
    pub async fn unreleased(
        &self,
        updated_before: i64,
        limit: u32,
    ) -> Result<Vec<OrderRow>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                order_rows!(
                    "WHERE status = ? AND released = 0 AND updated < ? LIMIT ?",
                    OrderStatus::Cancelled.as_str(),
                    updated_before,
                    limit,
                )
                .fetch_all(pool)
                .await
            })
            .await?;
        checked(rows)
    }

    /// Units of a product's cancelled orders whose Redis half has not
    /// happened yet, and when the newest of them was cancelled (epoch ms;
    /// 0 when there is none). Reads the few cancelled, unreleased rows
    /// through the index `(status, released, created)`.
    pub async fn unreturned_units(&self, product: &ProductId) -> Result<(i64, i64), StoreError> {
        let row = self
            .db
            .call(|pool| async move {
                sqlx::query!(
                    "SELECT SUM(quantity) AS units, MAX(updated) AS newest FROM tb_order \
                     WHERE status = ? AND released = 0 AND product_id = ?",
                    OrderStatus::Cancelled.as_str(),
                    product.as_str(),
                )
                .fetch_one(pool)
                .await
            })
            .await?;
        Ok((whole_units(row.units), row.newest.unwrap_or(0)))
    }

    /// What the live books check reads of MySQL, in one query: the
    /// product's `available_qty`, then what [`Self::unreturned_units`]
    /// answers; `None` when the product is not in `tb_product`.
    pub async fn books_figures(
        &self,
        product: &ProductId,
    ) -> Result<Option<(i64, (i64, i64))>, StoreError> {
        let row = self
            .db
            .call(|pool| async move {
                // The aggregate has one row, whatever matches.
                sqlx::query!(
                    "SELECT p.available_qty, c.units AS `units?: rust_decimal::Decimal`, \
                     c.newest AS `newest?: i64` FROM tb_product p \
                     CROSS JOIN (SELECT SUM(quantity) AS units, MAX(updated) AS newest \
                     FROM tb_order WHERE status = ? AND released = 0 AND product_id = ?) c \
                     WHERE p.product_id = ?",
                    OrderStatus::Cancelled.as_str(),
                    product.as_str(),
                    product.as_str(),
                )
                .fetch_optional(pool)
                .await
            })
            .await?;
        Ok(row.map(|r| {
            (
                r.available_qty,
                (whole_units(r.units), r.newest.unwrap_or(0)),
            )
        }))
    }

    /// Every order of a product (for the audit and for recovery).
    pub async fn orders_of_product(
        &self,
        product: &ProductId,
    ) -> Result<Vec<OrderRow>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                order_rows!("WHERE product_id = ?", product.as_str())
                    .fetch_all(pool)
                    .await
            })
            .await?;
        checked(rows)
    }

    /// Marks every cancelled order of a product released (recovery rebuilt
    /// the Redis stock without their units).
    pub async fn mark_all_released(&self, product: &ProductId) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "UPDATE tb_order SET released = 1 WHERE product_id = ? AND status = ?",
                    product.as_str(),
                    OrderStatus::Cancelled.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)
    }

    /// Orders of a product still `confirmed` (unpaid), and when the
    /// oldest of them was placed (epoch ms; through `(product_id, status)`).
    pub async fn unpaid_orders(
        &self,
        product: &ProductId,
    ) -> Result<(i64, Option<i64>), StoreError> {
        let row = self
            .db
            .call(|pool| async move {
                sqlx::query!(
                    "SELECT COUNT(*) AS unpaid, MIN(created) AS oldest FROM tb_order \
                     WHERE product_id = ? AND status = ?",
                    product.as_str(),
                    OrderStatus::Confirmed.as_str(),
                )
                .fetch_one(pool)
                .await
            })
            .await?;
        Ok((row.unpaid, row.oldest))
    }

    /// When a product's orders last changed (epoch ms, the books' clock as
    /// the rows carry it; `None`: no order).
    pub async fn last_change(&self, product: &ProductId) -> Result<Option<i64>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_scalar!(
                    "SELECT MAX(updated) AS `newest?: i64` FROM tb_order WHERE product_id = ?",
                    product.as_str(),
                )
                .fetch_one(pool)
                .await
            })
            .await
    }

    /// The order a buyer placed for a product under an Idempotency-Key
    /// (for a retry after the sale's Redis keys are gone).
    pub async fn order_by_key(
        &self,
        user_id: UserId,
        product: &ProductId,
        key: &str,
    ) -> Result<Option<OrderRow>, StoreError> {
        self.db
            .call(|pool| async move {
                order_rows!(
                    "WHERE user_id = ? AND product_id = ? AND idempotency_key = ? LIMIT 1",
                    user_id.as_i64(),
                    product.as_str(),
                    key,
                )
                .fetch_optional(pool)
                .await
            })
            .await?
            .map(OrderRow::try_from)
            .transpose()
    }
}

/// A `SUM` of units as MySQL answers it (a DECIMAL, NULL over no rows).
fn whole_units(sum: Option<rust_decimal::Decimal>) -> i64 {
    sum.map_or(0, |u| i64::try_from(u).unwrap_or(i64::MAX))
}
