//! Persisting a batch of one sale's accepted orders: one transaction that
//! inserts the orders not yet in `tb_order` and takes exactly their units
//! off `tb_product.available_qty`.

use std::collections::HashSet;

use sqlx::{MySql, QueryBuilder};

use super::row::Orders;
use crate::domain::{OrderStatus, PendingOrder, ProductId, backoff, now_ms};
use crate::store::error::StoreError;
use crate::store::events::{self, EventKind};

/// What one `persist_orders` call changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Persisted {
    /// Rows inserted now (orders already in `tb_order` are skipped).
    pub inserted: u64,
    /// Units of those rows, taken off `tb_product.available_qty`.
    pub units: u64,
}

const COLUMNS: &str =
    "order_id, user_id, product_id, quantity, price, status, created, updated, idempotency_key";

/// Attempts of one batch when a concurrent writer inserts the same order between
/// our read and our insert (two workers holding one redelivered entry).
const RACE_ATTEMPTS: usize = 3;

/// The text of a `rows`-row `<verb> INTO <table>` of orders. Written out
/// rather than through sqlx's `QueryBuilder`, whose per-value formatting
/// was the largest part of the workers' own CPU per order (BENCHMARKS.md,
/// "What does persisting cost?").
fn insert_sql(verb: &str, table: &str, rows: usize) -> String {
    const ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let head = [verb, " INTO ", table, " (", COLUMNS, ") VALUES "];
    let mut sql =
        String::with_capacity(head.iter().map(|s| s.len()).sum::<usize>() + rows * (ROW.len() + 2));
    head.iter().for_each(|s| sql.push_str(s));
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(ROW);
    }
    sql
}

/// `sql` (from [`insert_sql`]) with `orders` bound, as confirmed orders.
fn insert_query<'q>(
    sql: &'q str,
    orders: &[&'q PendingOrder],
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    let now = now_ms();
    // A runtime query: one row of values per order (`insert_sql`).
    orders.iter().fold(sqlx::query(sql), |query, o| {
        query
            .bind(o.order_id.as_str())
            .bind(o.user_id.as_i64())
            .bind(o.product_id.as_str())
            .bind(o.quantity.get() as i64)
            .bind(o.price)
            .bind(OrderStatus::Confirmed.as_str())
            .bind(o.created_ms)
            .bind(now)
            .bind(o.idempotency_key.as_deref())
    })
}

/// One multi-row `INSERT` (or `INSERT IGNORE`) into tb_order; returns the rows inserted.
async fn insert_orders(
    tx: &mut sqlx::Transaction<'_, MySql>,
    orders: &[&PendingOrder],
    verb: &str,
) -> Result<u64, sqlx::Error> {
    let sql = insert_sql(verb, "tb_order", orders.len());
    Ok(insert_query(&sql, orders)
        .execute(&mut **tx)
        .await?
        .rows_affected())
}

/// Which of `orders` `tb_order` holds already (their ids).
async fn existing_ids(
    tx: &mut sqlx::Transaction<'_, MySql>,
    orders: &[&PendingOrder],
) -> Result<HashSet<String>, sqlx::Error> {
    // A runtime query: its `IN` list is as long as the batch.
    let mut select =
        QueryBuilder::<MySql>::new("SELECT order_id FROM tb_order WHERE order_id IN (");
    let mut ids = select.separated(", ");
    for o in orders {
        ids.push_bind(o.order_id.as_str());
    }
    select.push(")");
    let existing: Vec<String> = select.build_query_scalar().fetch_all(&mut **tx).await?;
    Ok(existing.into_iter().collect())
}

impl Orders {
    /// Persists a batch of one sale's orders in ONE transaction: inserts the
    /// orders not yet in `tb_order` and takes exactly their units off
    /// `available_qty`. Idempotent: a redelivered batch changes nothing.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product, orders = orders.len()))]
    pub async fn persist_orders(
        &self,
        product: &ProductId,
        orders: &[PendingOrder],
    ) -> Result<Persisted, StoreError> {
        // Lost an insert race: the batch is tried again.
        let lost_race = |e: &StoreError| matches!(e, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation());
        backoff::retrying(RACE_ATTEMPTS, lost_race, || {
            self.db.bounded(self.persist_once(product, orders))
        })
        .await
    }

    async fn persist_once(
        &self,
        product: &ProductId,
        orders: &[PendingOrder],
    ) -> Result<Persisted, StoreError> {
        // Each order once (a batch may carry the same entry twice after a reclaim).
        let mut seen = HashSet::with_capacity(orders.len());
        let unique: Vec<&PendingOrder> = orders
            .iter()
            .filter(|o| seen.insert(o.order_id.as_str()))
            .collect();
        if unique.is_empty() {
            return Ok(Persisted::default());
        }
        // Fast path, for the common batch of orders never seen before: insert
        // all, skipping duplicates; if every row went in, the units to take
        // off are the whole batch's.
        let mut tx = self.db.pool().begin().await?;
        let inserted = insert_orders(&mut tx, &unique, "INSERT IGNORE").await?;
        let fresh = if inserted == unique.len() as u64 {
            unique
        } else {
            // A redelivery: some rows exist. Start over and learn which.
            tx.rollback().await?;
            tx = self.db.pool().begin().await?;
            let existing = existing_ids(&mut tx, &unique).await?;
            let fresh: Vec<&PendingOrder> = unique
                .into_iter()
                .filter(|o| !existing.contains(o.order_id.as_str()))
                .collect();
            if fresh.is_empty() {
                return Ok(Persisted::default());
            }
            // Plain INSERT: a row another worker commits meanwhile fails the
            // batch (and it is retried), instead of being counted twice.
            insert_orders(&mut tx, &fresh, "INSERT").await?;
            fresh
        };
        let units: u64 = fresh.iter().map(|o| o.quantity.get()).sum();
        let ids = fresh.iter().map(|o| o.order_id.as_str());
        events::record(&mut tx, EventKind::Confirmed, ids).await?;
        sqlx::query!(
            "UPDATE tb_product SET available_qty = available_qty - ?, updated = ? \
             WHERE product_id = ?",
            units as i64,
            now_ms(),
            product.as_str(),
        )
        .execute(&mut *tx)
        .await?;
        events::sold_out_if_none_left(&mut tx, product.as_str()).await?;
        tx.commit().await?;
        Ok(Persisted {
            inserted: fresh.len() as u64,
            units,
        })
    }
}

#[cfg(feature = "bench")]
impl Orders {
    /// A bare multi-row `INSERT` into `table` (a twin of tb_order), autocommit:
    /// the floor `flashsale-bench drain` compares the workers' drain against.
    #[cfg(feature = "bench")]
    pub(crate) async fn insert_orders_raw(
        &self,
        table: &str,
        orders: &[PendingOrder],
    ) -> Result<u64, StoreError> {
        let rows: Vec<&PendingOrder> = orders.iter().collect();
        let sql = insert_sql("INSERT", table, rows.len());
        Ok(insert_query(&sql, &rows)
            .execute(self.db.pool())
            .await?
            .rows_affected())
    }
}
