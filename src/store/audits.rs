//! `tb_sale_audit` ([`Audits`]): a retired sale's final audit, recorded in
//! the transaction that marks it retired (see `bookkeeping::retire`), so its
//! figures outlive its Redis keys. `tb_put_back`: what the repair after a
//! failover of the books put back ([`PutBack`]), listed with the audit.

use super::db::Db;
use super::error::StoreError;
use super::events::{self, EventKind};
use crate::domain::ProductId;

/// One thing the repair after a failover of the books put back
/// (`tb_put_back`): an order, a cancel or a payment the new primary lacked.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct PutBack {
    /// `order`, `cancel` or `payment`.
    pub what: String,
    pub order_id: String,
    /// A payment's kind and id (`payment.succeeded:pay_1`); empty for an
    /// order or a cancel.
    pub item: String,
    /// A payment: what the books made of it when it was put back.
    pub result: Option<String>,
    /// When (epoch ms).
    pub put_back: i64,
}

impl PutBack {
    /// `what` (an order, a dead letter) of order `order_id` put back now,
    /// with no item and no result of its own.
    pub fn order(what: &str, order_id: &str) -> Self {
        Self {
            what: what.into(),
            order_id: order_id.into(),
            item: String::new(),
            result: None,
            put_back: crate::domain::now_ms(),
        }
    }
}

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
    pub repaired_restocks: i64,
    pub repaired_restock_units: i64,
    /// When it was recorded (epoch ms): the sale's retirement.
    pub retired: i64,
}

/// The audits table's handle.
#[derive(Clone)]
pub struct Audits {
    db: Db,
}

impl Audits {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Records a sale's retirement with its final audit, in one
    /// transaction, unless it is retired already; true when this call did.
    pub async fn record_retirement(&self, audit: &FinalAudit) -> Result<bool, StoreError> {
        self.db
            .transaction(|tx| {
                Box::pin(async move {
                    let marked = sqlx::query!(
                        "UPDATE tb_product SET retired = ?, updated = ? \
                         WHERE product_id = ? AND retired IS NULL",
                        audit.retired,
                        audit.retired,
                        audit.product_id,
                    )
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                    if marked == 0 {
                        return Ok(false);
                    }
                    sqlx::query!(
                        "INSERT INTO tb_sale_audit (product_id, initial_qty, redis_stock, \
                         confirmed, paid, cancelled, available_qty, orders, repaired_orders, \
                         repaired_units, repaired_releases, repaired_idem, repaired_restocks, \
                         repaired_restock_units, retired) \
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        audit.product_id,
                        audit.initial_qty,
                        audit.redis_stock,
                        audit.confirmed,
                        audit.paid,
                        audit.cancelled,
                        audit.available_qty,
                        audit.orders,
                        audit.repaired_orders,
                        audit.repaired_units,
                        audit.repaired_releases,
                        audit.repaired_idem,
                        audit.repaired_restocks,
                        audit.repaired_restock_units,
                        audit.retired,
                    )
                    .execute(&mut **tx)
                    .await?;
                    events::record_sale(tx, EventKind::Retired, &audit.product_id).await?;
                    Ok(true)
                })
            })
            .await
    }

    /// A retired sale's final audit.
    pub async fn final_audit(&self, product: &ProductId) -> Result<Option<FinalAudit>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_as!(
                    FinalAudit,
                    "SELECT product_id, initial_qty, redis_stock, confirmed, paid, cancelled, \
                     available_qty, orders, repaired_orders, repaired_units, repaired_releases, \
                     repaired_idem, repaired_restocks, repaired_restock_units, retired \
                     FROM tb_sale_audit WHERE product_id = ?",
                    product.as_str(),
                )
                .fetch_optional(pool)
                .await
            })
            .await
    }

    /// Lists what a repair put back (a thing put back twice, by two
    /// workers at once, is listed once).
    pub async fn note_put_back(
        &self,
        product: &ProductId,
        items: &[PutBack],
    ) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        self.db
            .call(|pool| async move {
                // A runtime query: its text grows with the rows.
                let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT IGNORE INTO tb_put_back \
                     (product_id, what, order_id, item, result, put_back) ",
                );
                insert.push_values(items, |mut row, i| {
                    row.push_bind(product.as_str())
                        .push_bind(&i.what)
                        .push_bind(&i.order_id)
                        .push_bind(&i.item)
                        .push_bind(&i.result)
                        .push_bind(i.put_back);
                });
                insert.build().execute(pool).await.map(|_| ())
            })
            .await
    }

    /// What repairs put back into a sale's books, oldest first (at most
    /// `limit`).
    pub async fn put_back(
        &self,
        product: &ProductId,
        limit: u32,
    ) -> Result<Vec<PutBack>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_as!(
                    PutBack,
                    "SELECT what, order_id, item, result, put_back FROM tb_put_back \
                     WHERE product_id = ? ORDER BY id LIMIT ?",
                    product.as_str(),
                    limit,
                )
                .fetch_all(pool)
                .await
            })
            .await
    }
}
