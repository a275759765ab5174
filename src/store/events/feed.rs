//! The events read in `id` order ([`Events`]): the feed the outbox follows.

use std::collections::{HashMap, HashSet};

use rust_decimal::Decimal;
use sqlx::{MySql, QueryBuilder};

use super::stored::{
    Bare, DB_NOW_MS, EVENTS_PER_ROW, EventKind, EventRow, SKIP_AHEAD_ROWS, Stored, expand,
    record_sale,
};
use crate::store::db::Db;
use crate::store::error::StoreError;
use crate::store::topology::Topology;

/// A read on a Galera node that waits until the node has applied what the
/// cluster committed before it (MariaDB's `SET STATEMENT ... FOR`).
const CAUSAL: &str = "SET STATEMENT wsrep_sync_wait = 1 FOR ";

/// A row's id and how many events it holds.
struct IdEvents {
    id: i64,
    events: i32,
}

/// A stored row, and whether it is old enough to be listed.
#[derive(sqlx::FromRow)]
struct Settled {
    #[sqlx(flatten)]
    row: Stored,
    /// 1 when recorded [`Events::event_settle`] or more ago.
    settled: i64,
}

/// An order's fixed details, as events carry them.
#[derive(sqlx::FromRow)]
struct Details {
    order_id: String,
    product_id: String,
    user_id: i64,
    quantity: i64,
    price: Decimal,
}

/// The outbox's handle: its events, read in order.
#[derive(Clone)]
pub struct Events {
    db: Db,
}

impl Events {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Records `sale.ended` for `product` once (the first call after its
    /// end; `tb_product.end_announced` remembers it); true when this call did.
    pub async fn announce_end(&self, product: &str) -> Result<bool, StoreError> {
        self.db
            .transaction(|tx| {
                Box::pin(async move {
                    let marked = sqlx::query!(
                        "UPDATE tb_product SET end_announced = 1 \
                         WHERE product_id = ? AND end_announced = 0",
                        product,
                    )
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                    if marked == 1 {
                        record_sale(tx, EventKind::Ended, product).await?;
                    }
                    Ok(marked == 1)
                })
            })
            .await
    }

    /// How old an event must be before readers see it: the bound on a
    /// transaction (`DB_TIMEOUT_MS`) and a second.
    pub fn event_settle(&self) -> std::time::Duration {
        self.db.timeout() + std::time::Duration::from_secs(1)
    }

    /// Events after the cursor `after`, oldest first, at most `limit`, up
    /// to the first one recorded less than [`Self::event_settle`] ago by
    /// MySQL's clock: a page never goes past an event it does not list.
    ///
    /// Why the wait: a transaction still open holds an `id` below those
    /// committed after it, and the wait lets it commit (or roll back: every
    /// transaction is bounded by `DB_TIMEOUT_MS`) before a reader moves its
    /// cursor past that id. Why stop at the first young row rather than
    /// leave it out: ids are not in time order across Galera's nodes (each
    /// node hands out its own, `auto_increment_increment`), so a row with a
    /// lower id can be younger than the next; leaving it out and listing
    /// the next would move the cursor past it for good.
    ///
    /// On Galera the read is causal (`wsrep_sync_wait = 1`): the node
    /// answers once it has applied every commit the cluster certified
    /// before the read, so a row another node committed is never missing
    /// from a read that lists rows after it because this node's applier
    /// lags (a lag bounded by `DB_TIMEOUT_MS`, as every call).
    pub async fn events_after(&self, after: i64, limit: u32) -> Result<Vec<EventRow>, StoreError> {
        let settle_ms = self.event_settle().as_millis() as i64;
        let causal = match self.db.topology().get() {
            Topology::Unknown => self.db.read_topology().await?,
            known => known,
        } == Topology::Galera;
        // The cursor's own row may hold events after it; every later row
        // holds at least one: `limit` + 1 rows always make a full page.
        let sql = format!(
            "{}SELECT id, type, order_id, orders, product_id, created, \
             CAST(created <= {DB_NOW_MS} - ? AS SIGNED) AS settled \
             FROM tb_event WHERE id >= ? ORDER BY id LIMIT ?",
            if causal { CAUSAL } else { "" }
        );
        let sql = sql.as_str();
        let read: Vec<Settled> = self
            .db
            .call(|pool| {
                // A runtime query: prefixed by `CAUSAL` on Galera only.
                sqlx::query_as(sql)
                    .bind(settle_ms)
                    .bind(after.div_euclid(EVENTS_PER_ROW))
                    .bind(i64::from(limit) + 1)
                    .fetch_all(pool)
            })
            .await?;
        let rows: Vec<Stored> = read
            .into_iter()
            .take_while(|r| r.settled != 0)
            .map(|r| r.row)
            .collect();
        let page: Vec<Bare> = expand(rows)
            .into_iter()
            .filter(|e| e.id > after)
            .take(limit as usize)
            .collect();
        self.with_details(page).await
    }

    /// Joins each order's fixed details to its events (one lookup per
    /// page); an event whose order is not in `tb_order` is corrupt books
    /// (events are written in the transaction that writes or changes it).
    pub(super) async fn with_details(&self, bare: Vec<Bare>) -> Result<Vec<EventRow>, StoreError> {
        let mut details: HashMap<String, Details> = HashMap::new();
        let wanted: Vec<&str> = {
            let mut seen = HashSet::new();
            bare.iter()
                .filter_map(|b| b.order_id.as_deref())
                .filter(|id| seen.insert(*id))
                .collect()
        };
        for chunk in wanted.chunks(1_000) {
            let rows: Vec<Details> = self
                .db
                .call(|pool| {
                    // A runtime query: its `IN` list is as long as `chunk`.
                    let mut q = QueryBuilder::<MySql>::new(
                        "SELECT order_id, product_id, user_id, quantity, price FROM tb_order \
                         FORCE INDEX (uk_order_id) WHERE order_id IN (",
                    );
                    let mut ids = q.separated(", ");
                    for id in chunk {
                        ids.push_bind(*id);
                    }
                    q.push(")");
                    async move { q.build_query_as().fetch_all(pool).await }
                })
                .await?;
            details.extend(rows.into_iter().map(|d| (d.order_id.clone(), d)));
        }
        bare.into_iter()
            .map(|b| {
                let (order_id, product_id, user_id, quantity, price) = match b.order_id {
                    Some(id) => {
                        let d = details.get(&id).ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "event {} of order {id}, not in tb_order",
                                b.id
                            ))
                        })?;
                        (
                            Some(id),
                            d.product_id.clone(),
                            Some(d.user_id),
                            Some(d.quantity),
                            Some(d.price),
                        )
                    }
                    None => (None, b.product_id.unwrap_or_default(), None, None, None),
                };
                Ok(EventRow {
                    id: b.id,
                    kind: b.kind,
                    order_id,
                    product_id,
                    user_id,
                    quantity,
                    price,
                    created: b.created,
                })
            })
            .collect()
    }

    /// The newest event's id (0: none).
    /// After a failover that may have lost rows: the next events' ids jump
    /// [`SKIP_AHEAD_ROWS`] rows past the newest this server holds, so no
    /// id the old primary gave an event (lost with it) is given to another
    /// (a receiver deduplicating by `webhook-id` would drop it, a feed's
    /// cursor would pass it). Returns the first row id from now on.
    pub async fn skip_ahead(&self) -> Result<i64, StoreError> {
        let newest: Option<i64> = self
            .db
            .call(|pool| sqlx::query_scalar!("SELECT MAX(id) FROM tb_event").fetch_one(pool))
            .await?;
        let next = newest.unwrap_or(0) + SKIP_AHEAD_ROWS;
        let alter = format!("ALTER TABLE tb_event AUTO_INCREMENT = {next}");
        self.db
            .call(|pool| sqlx::raw_sql(&alter).execute(pool))
            .await?;
        Ok(next)
    }

    pub async fn last_event_id(&self) -> Result<i64, StoreError> {
        let last: Option<(i64, i32)> = self
            .db
            .call(|pool| {
                sqlx::query_as!(
                    IdEvents,
                    "SELECT id, events FROM tb_event ORDER BY id DESC LIMIT 1"
                )
                .fetch_optional(pool)
            })
            .await?
            .map(|r| (r.id, r.events));
        Ok(last.map_or(0, |(id, n)| {
            id.saturating_mul(EVENTS_PER_ROW) + i64::from(n.max(1)) - 1
        }))
    }

    /// How many events come after `after` (for the delivery lag): exact
    /// over the next 10,000 rows, and beyond them one per row (a lower
    /// bound), so the count costs a bounded read however far behind.
    pub async fn events_behind(&self, after: i64) -> Result<i64, StoreError> {
        const ROWS: i64 = 10_000;
        let from = after.div_euclid(EVENTS_PER_ROW);
        let near: Vec<(i64, i32)> = self
            .db
            .call(|pool| {
                sqlx::query_as!(
                    IdEvents,
                    "SELECT id, events FROM tb_event WHERE id >= ? ORDER BY id LIMIT ?",
                    from,
                    ROWS,
                )
                .fetch_all(pool)
            })
            .await?
            .into_iter()
            .map(|r| (r.id, r.events))
            .collect();
        let mut behind = 0;
        for &(id, n) in &near {
            let n = i64::from(n.max(1));
            behind += match id == from {
                // The cursor's own row: the events after its place in it.
                true => (n - 1 - after.rem_euclid(EVENTS_PER_ROW)).max(0),
                false => n,
            };
        }
        if near.len() as i64 == ROWS {
            let last = self.last_event_id().await?.div_euclid(EVENTS_PER_ROW);
            behind += (last - near.last().map_or(from, |r| r.0)).max(0);
        }
        Ok(behind)
    }
}
