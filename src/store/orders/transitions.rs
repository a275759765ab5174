//! Status changes of persisted orders, each guarded in SQL (`UPDATE ... WHERE
//! status = ...`) so that it happens once however many requests, retries and
//! workers race for it. A cancel gives the units back to
//! `tb_product.available_qty` in the same transaction as the status change.

use std::collections::BTreeMap;

use sqlx::{MySql, QueryBuilder};

use super::row::{OrderRow, Orders, checked, order_rows};
use crate::domain::{OrderId, OrderStatus, UserId, backoff, now_ms};
use crate::store::error::StoreError;
use crate::store::events::{self, EventKind};

/// What a guarded status change found.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// This call made the change.
    Done(OrderRow),
    /// The order was in the target status already.
    Already(OrderRow),
    /// The order is in a status the change cannot start from.
    Refused(OrderRow),
    NotFound,
}

impl Orders {
    /// `confirmed` → `paid`, for the order's owner.
    #[tracing::instrument(level = "debug", skip_all, fields(order_id = %order_id, user_id = %user_id))]
    pub async fn pay(&self, order_id: &OrderId, user_id: UserId) -> Result<Transition, StoreError> {
        self.until_settled(order_id, Some(user_id), OrderStatus::Paid, || {
            self.db.transaction(|tx| {
                Box::pin(async move {
                    // By the order id's unique key, always: on a young table
                    // MariaDB may pick `idx_user` instead, whose gap locks
                    // deadlock with a worker inserting that user's orders.
                    let changed = sqlx::query!(
                        "UPDATE tb_order FORCE INDEX (uk_order_id) SET status = ?, updated = ? \
                         WHERE order_id = ? AND user_id = ? AND status = ?",
                        OrderStatus::Paid.as_str(),
                        now_ms(),
                        order_id.as_str(),
                        user_id.as_i64(),
                        OrderStatus::Confirmed.as_str(),
                    )
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                    if changed == 1 {
                        events::record(tx, EventKind::Paid, [order_id.as_str()].into_iter())
                            .await?;
                    }
                    Ok(changed == 1)
                })
            })
        })
        .await
    }

    /// `confirmed` → `cancelled`, giving the units back to `available_qty` in
    /// the same transaction. The Redis half (returning stock and allowance)
    /// comes after the commit; until `mark_released`, `released` stays 0 so a
    /// crash in between is found and repaired.
    #[tracing::instrument(level = "debug", skip_all, fields(order_id = %order_id, user_id = ?user_id))]
    pub async fn cancel(
        &self,
        order_id: &OrderId,
        user_id: Option<UserId>,
    ) -> Result<Transition, StoreError> {
        self.until_settled(order_id, user_id, OrderStatus::Cancelled, || {
            self.db.transaction(|tx| {
                Box::pin(async move {
                    let row = order_rows!(
                        "WHERE order_id = ? AND status = ? FOR UPDATE",
                        order_id.as_str(),
                        OrderStatus::Confirmed.as_str(),
                    )
                    .fetch_optional(&mut **tx)
                    .await?
                    .map(OrderRow::try_from)
                    .transpose()?;
                    let Some(mut row) =
                        row.filter(|r| user_id.is_none_or(|u| r.user_id == u.as_i64()))
                    else {
                        return Ok(false);
                    };
                    cancel_rows(tx, std::slice::from_mut(&mut row)).await?;
                    Ok(true)
                })
            })
        })
        .await
    }

    /// Runs a guarded change (`attempt`, true when it changed the row) and
    /// reads what it found. A worker may commit the order between the change
    /// (which then matched no row) and the read (which finds it `confirmed`,
    /// a status the change starts from): then the change is tried again, so
    /// the answer never refuses an order for being in an allowed status. So
    /// is a change MySQL rolled back for contention with that commit.
    async fn until_settled<F, Fut>(
        &self,
        order_id: &OrderId,
        owner: Option<UserId>,
        target: OrderStatus,
        attempt: F,
    ) -> Result<Transition, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<bool, StoreError>>,
    {
        // Once the row is there, a second try sees it; the third covers a
        // concurrent change between the two.
        const TRIES: usize = 3;
        let mut found = Transition::NotFound;
        for tried in 1..=TRIES {
            let done = match attempt().await {
                Ok(done) => done,
                Err(e) if e.is_contention() && tried < TRIES => continue,
                Err(e) => return Err(e),
            };
            found = self.outcome(order_id, done, target).await?;
            match &found {
                Transition::Refused(row)
                    if row.status == OrderStatus::Confirmed
                        && owner.is_none_or(|u| row.user_id == u.as_i64()) => {}
                _ => return Ok(found),
            }
        }
        Ok(found)
    }

    /// Cancels up to `limit` orders still `confirmed` and created before
    /// `created_before` (unpaid past the payment timeout). Rows another
    /// process is cancelling are skipped (`SKIP LOCKED`), so each order is
    /// acted on by one process. Returns the orders cancelled here.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn cancel_expired(
        &self,
        created_before: i64,
        limit: u32,
    ) -> Result<Vec<OrderRow>, StoreError> {
        // A deadlock's victim changed nothing: try again now rather than at
        // the next pass.
        backoff::retrying(3, StoreError::is_contention, || {
            self.cancel_expired_once(created_before, limit)
        })
        .await
    }

    async fn cancel_expired_once(
        &self,
        created_before: i64,
        limit: u32,
    ) -> Result<Vec<OrderRow>, StoreError> {
        self.db
            .bounded(async {
                // READ COMMITTED: the scan locks the rows it takes and no gaps.
                // Under REPEATABLE READ its next-key locks on the index
                // (status, released, created) held the gap where another
                // sweeper's cancelled rows are inserted into that index, and
                // concurrent sweepers deadlocked.
                let mut conn = self.db.pool().acquire().await?;
                sqlx::query!("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut *conn)
                    .await?;
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                // `released = 0` holds for every confirmed order; it is here
                // for the index (status, released, created).
                let mut rows = checked(
                    order_rows!(
                        "WHERE status = ? AND released = 0 AND created < ? \
                         ORDER BY created LIMIT ? FOR UPDATE SKIP LOCKED",
                        OrderStatus::Confirmed.as_str(),
                        created_before,
                        limit,
                    )
                    .fetch_all(&mut *tx)
                    .await?,
                )?;
                cancel_rows(&mut tx, &mut rows).await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await
    }

    async fn outcome(
        &self,
        order_id: &OrderId,
        done: bool,
        target: OrderStatus,
    ) -> Result<Transition, StoreError> {
        Ok(match self.order(order_id).await? {
            None => Transition::NotFound,
            Some(row) if done => Transition::Done(row),
            Some(row) if row.status == target => Transition::Already(row),
            Some(row) => Transition::Refused(row),
        })
    }
}

/// Takes `units` of `product` off `available_qty` again (a cancelled order
/// paid late took its units back), in the caller's transaction.
pub(crate) async fn take_units(
    tx: &mut sqlx::Transaction<'_, MySql>,
    product: &str,
    units: i64,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE tb_product SET available_qty = available_qty - ?, updated = ? WHERE product_id = ?",
        units,
        now,
        product,
    )
    .execute(&mut **tx)
    .await?;
    events::sold_out_if_none_left(tx, product).await
}

/// Marks `rows` (locked: `confirmed`, or `paid` and refunded) cancelled and
/// gives their units back; the rows are updated to match. Their `updated`
/// becomes the cancel's time, later than any change before it (the Redis
/// half tells one cancel of an order from a later one by it: see
/// `release_stock.lua`).
pub(crate) async fn cancel_rows(
    tx: &mut sqlx::Transaction<'_, MySql>,
    rows: &mut [OrderRow],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let latest = rows.iter().map(|r| r.updated).max().unwrap_or(0);
    let now = now_ms().max(latest.saturating_add(1));
    for r in rows.iter_mut() {
        r.status = OrderStatus::Cancelled;
        r.released = false;
        r.updated = now;
    }
    // A runtime query: its `IN` list is as long as the rows.
    let mut update = QueryBuilder::<MySql>::new("UPDATE tb_order SET status = ");
    update
        .push_bind(OrderStatus::Cancelled.as_str())
        .push(", released = 0, updated = ")
        .push_bind(now);
    update.push(" WHERE order_id IN (");
    let mut ids = update.separated(", ");
    for r in rows.iter() {
        ids.push_bind(r.order_id.as_str());
    }
    update.push(")");
    update.build().execute(&mut **tx).await?;
    let ids = rows.iter().map(|r| r.order_id.as_str());
    events::record(tx, EventKind::Cancelled, ids).await?;
    let mut units: BTreeMap<&str, i64> = BTreeMap::new();
    for r in rows.iter() {
        *units.entry(r.product_id.as_str()).or_default() += r.quantity;
    }
    for (product, units) in units {
        sqlx::query!(
            "UPDATE tb_product SET available_qty = available_qty + ?, updated = ? \
             WHERE product_id = ?",
            units,
            now,
            product,
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
