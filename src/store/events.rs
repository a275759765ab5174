//! `tb_event`, the outbox: each change of an order written as an event in
//! the transaction that makes the change (an order persisted, paid,
//! cancelled; a payment owed back), so an event exists exactly when its
//! change does, and readers take them in `id` order.

use rust_decimal::Decimal;
use sqlx::MySql;

use super::db::{Db, StoreError};

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
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "order.confirmed",
            Self::Paid => "order.paid",
            Self::Cancelled => "order.cancelled",
            Self::RefundDue => "order.refund_due",
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
            other => return Err(StoreError::Corrupt(format!("{other:?} is no event type"))),
        })
    }
}

/// An event as readers get it, with the order's fixed details.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EventRow {
    pub id: i64,
    #[sqlx(rename = "type", try_from = "String")]
    pub kind: EventKind,
    pub order_id: String,
    pub product_id: String,
    pub user_id: i64,
    pub quantity: i64,
    pub price: Decimal,
    /// When it was recorded: MySQL's clock, epoch ms.
    pub created: i64,
}

/// MySQL's clock in epoch ms, as an SQL expression.
const DB_NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// Records `kind` for each of `orders` (their ids), in the caller's
/// transaction: one multi-row `INSERT`.
pub(super) async fn record<'a>(
    tx: &mut sqlx::Transaction<'_, MySql>,
    kind: EventKind,
    orders: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), sqlx::Error> {
    let rows = orders.len();
    if rows == 0 {
        return Ok(());
    }
    let row = format!("(?, ?, {DB_NOW_MS})");
    let mut sql = String::with_capacity(80 + rows * (row.len() + 2));
    sql.push_str("INSERT INTO tb_event (type, order_id, created) VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&row);
    }
    orders
        .fold(sqlx::query(&sql), |q, order| {
            q.bind(kind.as_str()).bind(order)
        })
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Db {
    /// How old an event must be before readers see it: the bound on a
    /// transaction (`DB_TIMEOUT_MS`) and a second.
    pub fn event_settle(&self) -> std::time::Duration {
        self.timeout() + std::time::Duration::from_secs(1)
    }

    /// Events after the cursor `after`, oldest first, at most `limit`, and
    /// only those recorded [`Db::event_settle`] or more ago by MySQL's
    /// clock: a transaction still open holds an `id` below those committed
    /// after it, and the wait lets it commit (or roll back: every
    /// transaction is bounded by `DB_TIMEOUT_MS`) before a reader moves its
    /// cursor past that id.
    pub async fn events_after(&self, after: i64, limit: u32) -> Result<Vec<EventRow>, StoreError> {
        let settle_ms = self.event_settle().as_millis() as i64;
        let sql = format!(
            "SELECT e.id, e.type, e.order_id, o.product_id, o.user_id, o.quantity, o.price, \
             e.created FROM tb_event e JOIN tb_order o ON o.order_id = e.order_id \
             WHERE e.id > ? AND e.created <= {DB_NOW_MS} - ? ORDER BY e.id LIMIT ?"
        );
        let sql = sql.as_str();
        self.call(|pool| {
            sqlx::query_as(sql)
                .bind(after)
                .bind(settle_ms)
                .bind(limit)
                .fetch_all(pool)
        })
        .await
    }
}
