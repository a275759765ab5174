//! A sale's end of life in `tb_product` and `tb_sale_audit`: closed early,
//! retired with its final audit, purged from Redis (see `books::retire`).

use super::db::{Db, StoreError};
use super::events::{self, EventKind};
use super::orders::OrderRow;
use super::orders::ROW;
use super::products::Product;
use super::products::{COLUMNS, normalized};
use crate::domain::{OrderStatus, ProductId, UserId};

/// A retired sale's final audit, as recorded (`tb_sale_audit`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct FinalAudit {
    pub product_id: String,
    pub initial_qty: i64,
    /// The Redis stock when it was retired: the units nobody bought.
    pub redis_stock: i64,
    pub confirmed: i64,
    pub paid: i64,
    pub cancelled: i64,
    pub available_qty: i64,
    /// Orders in `tb_order` (any status).
    pub orders: i64,
    pub repaired_orders: i64,
    pub repaired_units: i64,
    pub repaired_releases: i64,
    pub repaired_idem: i64,
    /// When it was recorded (epoch ms): the sale's retirement.
    pub retired: i64,
}

const AUDIT_COLUMNS: &str = "product_id, initial_qty, redis_stock, confirmed, paid, cancelled, \
                             available_qty, orders, repaired_orders, repaired_units, \
                             repaired_releases, repaired_idem, retired";

impl Db {
    /// Closes a product's sale at `closed_at` (`closed` set once; `end_time`
    /// moved to `end_at` unless it ends earlier; `start_time`, the planned
    /// start, kept even when the close comes before it); `None` when there
    /// is no such product. A retired sale is closed already: nothing changes.
    pub async fn close_product(
        &self,
        product: &ProductId,
        closed_at: i64,
        end_at: i64,
    ) -> Result<Option<Product>, StoreError> {
        self.call(|pool| async move {
            sqlx::query(
                "UPDATE tb_product SET closed = COALESCE(closed, ?), \
                 end_time = LEAST(end_time, ?), updated = ? \
                 WHERE product_id = ? AND retired IS NULL",
            )
            .bind(closed_at)
            .bind(end_at)
            .bind(closed_at)
            .bind(product.as_str())
            .execute(pool)
            .await
        })
        .await
        .map(drop)?;
        self.product(product).await
    }

    /// Opened sales not retired whose end is at or before `ended_by` (epoch
    /// ms), by end then id, after `after` (the last of the previous page),
    /// at most `limit`: those a retirement pass looks at.
    pub async fn ended_unretired(
        &self,
        ended_by: i64,
        after: Option<&(i64, String)>,
        limit: u32,
    ) -> Result<Vec<Product>, StoreError> {
        let filter = "retired IS NULL AND opened IS NOT NULL";
        self.page("end_time", filter, ended_by, after, limit).await
    }

    /// Retired sales whose Redis keys are not deleted yet, by retirement
    /// then id, after `after` (the last of the previous page), at most `limit`.
    pub async fn unpurged(
        &self,
        after: Option<&(i64, String)>,
        limit: u32,
    ) -> Result<Vec<Product>, StoreError> {
        let filter = "purged IS NULL AND retired IS NOT NULL";
        self.page("retired", filter, i64::MAX, after, limit).await
    }

    /// Products matching `filter` with `key` at most `upto`, by `key` then
    /// id, after `after` (`(key, id)` of the previous page's last), at
    /// most `limit`. `key` and `filter` are this module's constants.
    async fn page(
        &self,
        key: &str,
        filter: &str,
        upto: i64,
        after: Option<&(i64, String)>,
        limit: u32,
    ) -> Result<Vec<Product>, StoreError> {
        let (from, id) = after.cloned().unwrap_or((i64::MIN, String::new()));
        let rows: Vec<Product> = self
            .call(|pool| async move {
                sqlx::query_as(&format!(
                    "SELECT {COLUMNS} FROM tb_product WHERE {filter} AND {key} <= ? \
                     AND ({key} > ? OR ({key} = ? AND product_id > ?)) \
                     ORDER BY {key}, product_id LIMIT ?"
                ))
                .bind(upto)
                .bind(from)
                .bind(from)
                .bind(id)
                .bind(limit)
                .fetch_all(pool)
                .await
            })
            .await?;
        Ok(rows.into_iter().map(normalized).collect())
    }

    /// Records a sale's retirement with its final audit, in one
    /// transaction, unless it is retired already; true when this call did.
    pub async fn record_retirement(&self, audit: &FinalAudit) -> Result<bool, StoreError> {
        self.transaction(|tx| {
            Box::pin(async move {
                let marked = sqlx::query(
                    "UPDATE tb_product SET retired = ?, updated = ? \
                 WHERE product_id = ? AND retired IS NULL",
                )
                .bind(audit.retired)
                .bind(audit.retired)
                .bind(&audit.product_id)
                .execute(&mut **tx)
                .await?
                .rows_affected();
                if marked == 0 {
                    return Ok(false);
                }
                sqlx::query(&format!(
                    "INSERT INTO tb_sale_audit ({AUDIT_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ))
                .bind(&audit.product_id)
                .bind(audit.initial_qty)
                .bind(audit.redis_stock)
                .bind(audit.confirmed)
                .bind(audit.paid)
                .bind(audit.cancelled)
                .bind(audit.available_qty)
                .bind(audit.orders)
                .bind(audit.repaired_orders)
                .bind(audit.repaired_units)
                .bind(audit.repaired_releases)
                .bind(audit.repaired_idem)
                .bind(audit.retired)
                .execute(&mut **tx)
                .await?;
                events::record_sale(tx, EventKind::Retired, &audit.product_id).await?;
                Ok(true)
            })
        })
        .await
    }

    /// Records that a retired sale's Redis keys are deleted.
    pub async fn mark_purged(&self, product: &ProductId, now_ms: i64) -> Result<(), StoreError> {
        self.call(|pool| async move {
            sqlx::query(
                "UPDATE tb_product SET purged = ? WHERE product_id = ? AND purged IS NULL \
                 AND retired IS NOT NULL",
            )
            .bind(now_ms)
            .bind(product.as_str())
            .execute(pool)
            .await
        })
        .await
        .map(drop)
    }

    /// A retired sale's final audit.
    pub async fn final_audit(&self, product: &ProductId) -> Result<Option<FinalAudit>, StoreError> {
        self.call(|pool| async move {
            sqlx::query_as(&format!(
                "SELECT {AUDIT_COLUMNS} FROM tb_sale_audit WHERE product_id = ?"
            ))
            .bind(product.as_str())
            .fetch_optional(pool)
            .await
        })
        .await
    }

    /// How many sales were retired.
    pub async fn retired_count(&self) -> Result<i64, StoreError> {
        self.call(|pool| async move {
            sqlx::query_scalar("SELECT COUNT(*) FROM tb_product WHERE retired IS NOT NULL")
                .fetch_one(pool)
                .await
        })
        .await
    }

    /// Orders of a product still `confirmed` (unpaid), and when the
    /// oldest of them was placed (epoch ms; through `(product_id, status)`).
    pub async fn unpaid_orders(
        &self,
        product: &ProductId,
    ) -> Result<(i64, Option<i64>), StoreError> {
        self.call(|pool| async move {
            sqlx::query_as(
                "SELECT COUNT(*), MIN(created) FROM tb_order WHERE product_id = ? AND status = ?",
            )
            .bind(product.as_str())
            .bind(OrderStatus::Confirmed.as_str())
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
        self.call(|pool| async move {
            sqlx::query_as(&format!(
                "SELECT {ROW} FROM tb_order WHERE user_id = ? AND product_id = ? \
                 AND idempotency_key = ? LIMIT 1"
            ))
            .bind(user_id.as_i64())
            .bind(product.as_str())
            .bind(key)
            .fetch_optional(pool)
            .await
        })
        .await
    }
}
