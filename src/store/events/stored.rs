//! What an event is and how it is stored: its kinds, its row, the places in a row,
//! and recording it in the transaction that makes its change.

use rust_decimal::Decimal;
use sqlx::MySql;

use crate::store::error::StoreError;

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
/// × `EVENTS_PER_ROW` + its place in the row. A transaction that changes many orders
/// at once (a worker's batch of persisted orders, the sweeper's batch of
/// cancels) writes one row for all of them, not one per order: the outbox
/// then costs a batch one small insert (BENCHMARKS.md, "The outbox").
pub const EVENTS_PER_ROW: i64 = 10_000;

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

pub(super) const STORED: &str =
    "SELECT id, type, order_id, orders, product_id, created FROM tb_event";

/// One event of a stored row, before its order's details are joined.
pub(super) struct Bare {
    pub(super) id: i64,
    pub(super) kind: EventKind,
    /// The order, or `None` for a sale's event (then `product_id`).
    pub(super) order_id: Option<String>,
    pub(super) product_id: Option<String>,
    pub(super) created: i64,
}

/// The events of `rows`, in id order.
pub(super) fn expand(rows: Vec<Stored>) -> Vec<Bare> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let base = r.id.saturating_mul(EVENTS_PER_ROW);
        match (r.orders, r.order_id) {
            (Some(orders), _) => {
                for (i, order) in orders.split(',').enumerate().take(EVENTS_PER_ROW as usize) {
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

/// MySQL's clock in epoch ms, as an SQL expression.
/// The database's time now, epoch ms (written out in the query macros'
/// SQL, which must be literals; a test holds them to this text).
pub(super) const DB_NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// Records `kind` for each of `orders` (their ids), in the caller's
/// transaction: one row for one order, one row for many (up to [`EVENTS_PER_ROW`]
/// each), so a batch pays one small insert, not one per order.
pub(crate) async fn record<'a>(
    tx: &mut sqlx::Transaction<'_, MySql>,
    kind: EventKind,
    orders: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), sqlx::Error> {
    let orders: Vec<&str> = orders.collect();
    for chunk in orders.chunks(EVENTS_PER_ROW as usize) {
        match chunk {
            [] => {}
            [one] => {
                // `created`: DB_NOW_MS, written out (a macro's SQL is a literal).
                sqlx::query!(
                    "INSERT INTO tb_event (type, order_id, created) \
                     VALUES (?, ?, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED))",
                    kind.as_str(),
                    *one,
                )
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
                let events = many.len() as i64;
                sqlx::query!(
                    "INSERT INTO tb_event (type, orders, events, created) \
                     VALUES (?, ?, ?, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED))",
                    kind.as_str(),
                    joined,
                    events,
                )
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
    sqlx::query!(
        "INSERT INTO tb_event (type, product_id, created) \
         VALUES (?, ?, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED))",
        kind.as_str(),
        product,
    )
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
    sqlx::query!(
        "INSERT INTO tb_event (type, product_id, created) \
         SELECT ?, product_id, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED) \
         FROM tb_product WHERE product_id = ? AND available_qty = 0",
        EventKind::SoldOut.as_str(),
        product,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod db_now_tests {
    use super::DB_NOW_MS;

    /// The query macros write the database's time out: each time as
    /// `DB_NOW_MS` says it.
    #[test]
    fn the_written_out_times_are_db_now_ms() {
        let source = include_str!("stored.rs");
        // (Built here, so that this test's own text is not counted.)
        let needle = ["UNIX_", "TIMESTAMP("].concat();
        let times = source.matches(needle.as_str()).count();
        assert!(times >= 5, "{times}");
        assert_eq!(source.matches(DB_NOW_MS).count(), times);
    }
}
