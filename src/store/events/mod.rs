//! `tb_event`, the outbox: each change of an order written as an event in
//! the transaction that makes the change (an order persisted, paid,
//! cancelled; a payment owed back), and the sale's own (sold out, ended,
//! retired), so an event exists exactly when its change does, and readers
//! take them in `id` order.

use std::collections::{HashMap, HashSet};

use rust_decimal::Decimal;
use sqlx::{MySql, QueryBuilder};

mod delivery;

use super::db::Db;
use super::error::StoreError;
pub use delivery::{DeadEvent, Deliveries, Delivery};

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub enum EventKind {
    /// Persisted: in the books, awaiting payment.
    #[serde(rename = "order.confirmed")]
    Confirmed,
    #[serde(rename = "order.paid")]
    Paid,
    /// By its buyer or its payment timeout; its units back on sale.
    #[serde(rename = "order.cancelled")]
    Cancelled,
    /// Money taken for an order that could not have it: owed back.
    #[serde(rename = "order.refund_due")]
    RefundDue,
    /// Every unit of the sale is in the books as sold (again, after
    /// cancels gave some back).
    #[serde(rename = "sale.sold_out")]
    SoldOut,
    /// Past its end (or closed early), as the workers' retirement pass saw.
    #[serde(rename = "sale.ended")]
    Ended,
    /// Settled: its final audit recorded.
    #[serde(rename = "sale.retired")]
    Retired,
    /// An operator paused it: orders are refused until it resumes.
    #[serde(rename = "sale.paused")]
    Paused,
    #[serde(rename = "sale.resumed")]
    Resumed,
    /// An operator added units to it (or took some away).
    #[serde(rename = "sale.restocked")]
    Restocked,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "order.confirmed",
            Self::Paid => "order.paid",
            Self::Cancelled => "order.cancelled",
            Self::RefundDue => "order.refund_due",
            Self::SoldOut => "sale.sold_out",
            Self::Ended => "sale.ended",
            Self::Retired => "sale.retired",
            Self::Paused => "sale.paused",
            Self::Resumed => "sale.resumed",
            Self::Restocked => "sale.restocked",
        }
    }
}

impl TryFrom<String> for EventKind {
    type Error = StoreError;

    fn try_from(s: String) -> Result<Self, StoreError> {
        Ok(match s.as_str() {
            "order.confirmed" => Self::Confirmed,
            "order.paid" => Self::Paid,
            "order.cancelled" => Self::Cancelled,
            "order.refund_due" => Self::RefundDue,
            "sale.sold_out" => Self::SoldOut,
            "sale.ended" => Self::Ended,
            "sale.retired" => Self::Retired,
            "sale.paused" => Self::Paused,
            "sale.resumed" => Self::Resumed,
            "sale.restocked" => Self::Restocked,
            other => return Err(StoreError::Corrupt(format!("{other:?} is no event type"))),
        })
    }
}

/// An event as readers get it, with the order's fixed details (`None` for
/// a sale's own event).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EventRow {
    pub id: i64,
    #[sqlx(rename = "type", try_from = "String")]
    pub kind: EventKind,
    pub order_id: Option<String>,
    pub product_id: String,
    pub user_id: Option<i64>,
    pub quantity: Option<i64>,
    pub price: Option<Decimal>,
    /// When it was recorded: MySQL's clock, epoch ms.
    pub created: i64,
}

/// Events one `tb_event` row holds at most: an event's id is its row's id
/// × `SLOTS` + its place in the row. A transaction that changes many orders
/// at once (a worker's batch of persisted orders, the sweeper's batch of
/// cancels) writes one row for all of them, not one per order: the outbox
/// then costs a batch one small insert (BENCHMARKS.md, "The outbox").
pub const SLOTS: i64 = 10_000;

/// How far event ids jump after a failover of the books: more rows than a
/// replica can lag behind its primary (a row per persisted batch or per
/// change; a million rows is hours of a sale's peak).
pub const SKIP_AHEAD_ROWS: i64 = 1_000_000;

/// A `tb_event` row as stored: one order's event (`order_id`), several
/// orders' (`orders`, comma-separated, `events` of them) or a sale's
/// (`product_id`).
#[derive(sqlx::FromRow)]
pub(super) struct Stored {
    id: i64,
    #[sqlx(rename = "type", try_from = "String")]
    kind: EventKind,
    order_id: Option<String>,
    orders: Option<String>,
    product_id: Option<String>,
    created: i64,
}

/// A stored row, and whether it is old enough to be listed.
#[derive(sqlx::FromRow)]
struct Settled {
    #[sqlx(flatten)]
    row: Stored,
    /// 1 when recorded [`Events::event_settle`] or more ago.
    settled: i64,
}

pub(super) const STORED: &str =
    "SELECT id, type, order_id, orders, product_id, created FROM tb_event";

/// One event of a stored row, before its order's details are joined.
pub(super) struct Bare {
    id: i64,
    kind: EventKind,
    /// The order, or `None` for a sale's event (then `product_id`).
    order_id: Option<String>,
    product_id: Option<String>,
    created: i64,
}

/// The events of `rows`, in id order.
pub(super) fn expand(rows: Vec<Stored>) -> Vec<Bare> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let base = r.id.saturating_mul(SLOTS);
        match (r.orders, r.order_id) {
            (Some(orders), _) => {
                for (i, order) in orders.split(',').enumerate().take(SLOTS as usize) {
                    out.push(Bare {
                        id: base + i as i64,
                        kind: r.kind,
                        order_id: Some(order.to_owned()),
                        product_id: None,
                        created: r.created,
                    });
                }
            }
            (None, order_id) => out.push(Bare {
                id: base,
                kind: r.kind,
                order_id,
                product_id: r.product_id,
                created: r.created,
            }),
        }
    }
    out
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

/// MySQL's clock in epoch ms, as an SQL expression.
const DB_NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// Records `kind` for each of `orders` (their ids), in the caller's
/// transaction: one row for one order, one row for many (up to [`SLOTS`]
/// each), so a batch pays one small insert, not one per order.
pub(crate) async fn record<'a>(
    tx: &mut sqlx::Transaction<'_, MySql>,
    kind: EventKind,
    orders: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), sqlx::Error> {
    let orders: Vec<&str> = orders.collect();
    for chunk in orders.chunks(SLOTS as usize) {
        match chunk {
            [] => {}
            [one] => {
                sqlx::query(&format!(
                    "INSERT INTO tb_event (type, order_id, created) VALUES (?, ?, {DB_NOW_MS})"
                ))
                .bind(kind.as_str())
                .bind(*one)
                .execute(&mut **tx)
                .await?;
            }
            many => {
                let mut joined = String::with_capacity(many.iter().map(|o| o.len() + 1).sum());
                for (i, o) in many.iter().enumerate() {
                    if i > 0 {
                        joined.push(',');
                    }
                    joined.push_str(o);
                }
                sqlx::query(&format!(
                    "INSERT INTO tb_event (type, orders, events, created) VALUES (?, ?, ?, {DB_NOW_MS})"
                ))
                .bind(kind.as_str())
                .bind(joined)
                .bind(many.len() as i64)
                .execute(&mut **tx)
                .await?;
            }
        }
    }
    Ok(())
}

/// Records a sale's own event, in the caller's transaction.
pub(crate) async fn record_sale(
    tx: &mut sqlx::Transaction<'_, MySql>,
    kind: EventKind,
    product: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO tb_event (type, product_id, created) VALUES (?, ?, {DB_NOW_MS})"
    ))
    .bind(kind.as_str())
    .bind(product)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records `sale.sold_out` if the caller's transaction, which just took
/// units off `product`'s `available_qty`, left none: one statement, the
/// product's row already locked by that update.
pub(crate) async fn sold_out_if_none_left(
    tx: &mut sqlx::Transaction<'_, MySql>,
    product: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO tb_event (type, product_id, created) \
         SELECT ?, product_id, {DB_NOW_MS} FROM tb_product \
         WHERE product_id = ? AND available_qty = 0"
    ))
    .bind(EventKind::SoldOut.as_str())
    .bind(product)
    .execute(&mut **tx)
    .await?;
    Ok(())
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
                    let marked = sqlx::query(
                        "UPDATE tb_product SET end_announced = 1 \
                     WHERE product_id = ? AND end_announced = 0",
                    )
                    .bind(product)
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
    pub async fn events_after(&self, after: i64, limit: u32) -> Result<Vec<EventRow>, StoreError> {
        let settle_ms = self.event_settle().as_millis() as i64;
        // The cursor's own row may hold events after it; every later row
        // holds at least one: `limit` + 1 rows always make a full page.
        let sql = format!(
            "SELECT id, type, order_id, orders, product_id, created, \
             CAST(created <= {DB_NOW_MS} - ? AS SIGNED) AS settled \
             FROM tb_event WHERE id >= ? ORDER BY id LIMIT ?"
        );
        let sql = sql.as_str();
        let read: Vec<Settled> = self
            .db
            .call(|pool| {
                sqlx::query_as(sql)
                    .bind(settle_ms)
                    .bind(after.div_euclid(SLOTS))
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
            .call(|pool| sqlx::query_scalar("SELECT MAX(id) FROM tb_event").fetch_one(pool))
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
                sqlx::query_as("SELECT id, events FROM tb_event ORDER BY id DESC LIMIT 1")
                    .fetch_optional(pool)
            })
            .await?;
        Ok(last.map_or(0, |(id, n)| {
            id.saturating_mul(SLOTS) + i64::from(n.max(1)) - 1
        }))
    }

    /// How many events come after `after` (for the delivery lag): exact
    /// over the next 10,000 rows, and beyond them one per row (a lower
    /// bound), so the count costs a bounded read however far behind.
    pub async fn events_behind(&self, after: i64) -> Result<i64, StoreError> {
        const ROWS: i64 = 10_000;
        let from = after.div_euclid(SLOTS);
        let near: Vec<(i64, i32)> = self
            .db
            .call(|pool| {
                sqlx::query_as("SELECT id, events FROM tb_event WHERE id >= ? ORDER BY id LIMIT ?")
                    .bind(from)
                    .bind(ROWS)
                    .fetch_all(pool)
            })
            .await?;
        let mut behind = 0;
        for &(id, n) in &near {
            let n = i64::from(n.max(1));
            behind += match id == from {
                // The cursor's own row: the events after its place in it.
                true => (n - 1 - after.rem_euclid(SLOTS)).max(0),
                false => n,
            };
        }
        if near.len() as i64 == ROWS {
            let last = self.last_event_id().await?.div_euclid(SLOTS);
            behind += (last - near.last().map_or(from, |r| r.0)).max(0);
        }
        Ok(behind)
    }
}
