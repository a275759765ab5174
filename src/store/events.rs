//! `tb_event`, the outbox: each change of an order written as an event in
//! the transaction that makes the change (an order persisted, paid,
//! cancelled; a payment owed back), and the sale's own (sold out, ended,
//! retired), so an event exists exactly when its change does, and readers
//! take them in `id` order.

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

/// Events as [`EventRow`]s: each with its order's fixed details.
const EVENTS: &str = "SELECT e.id, e.type, e.order_id, \
     COALESCE(o.product_id, e.product_id) AS product_id, o.user_id, o.quantity, o.price, \
     e.created FROM tb_event e LEFT JOIN tb_order o ON o.order_id = e.order_id";

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

/// Records a sale's own event, in the caller's transaction.
pub(super) async fn record_sale(
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
pub(super) async fn sold_out_if_none_left(
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

impl Db {
    /// Records `sale.ended` for `product` once (the first call after its
    /// end; `tb_product.end_announced` remembers it); true when this call did.
    pub async fn announce_end(&self, product: &str) -> Result<bool, StoreError> {
        self.transaction(|tx| {
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
            "{EVENTS} WHERE e.id > ? AND e.created <= {DB_NOW_MS} - ? ORDER BY e.id LIMIT ?"
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

/// Where delivery to an endpoint stands, for the process that holds its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Every event up to this id is delivered (or dead-lettered).
    pub delivered_up_to: i64,
    /// Failed attempts of the next event.
    pub attempts: u32,
    /// Not before this (epoch ms): the back-off after a failure.
    pub next_attempt: i64,
}

/// A dead-lettered event.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize, utoipa::ToSchema)]
pub struct DeadEvent {
    pub endpoint: String,
    pub event_id: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub dead_at: i64,
    pub replay: bool,
}

fn clip(error: &str) -> &str {
    match error.char_indices().nth(500) {
        Some((i, _)) => &error[..i],
        None => error,
    }
}

impl Db {
    /// Takes (or renews) the lease on delivery to `endpoint` for `owner`
    /// until `until` (epoch ms); `None` while another process holds it.
    pub async fn lease_delivery(
        &self,
        endpoint: &str,
        owner: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<Delivery>, StoreError> {
        self.transaction(|tx| {
            Box::pin(async move {
                sqlx::query("INSERT IGNORE INTO tb_event_delivery (endpoint) VALUES (?)")
                    .bind(endpoint)
                    .execute(&mut **tx)
                    .await?;
                let taken = sqlx::query(
                    "UPDATE tb_event_delivery SET lease_owner = ?, lease_until = ? \
                     WHERE endpoint = ? AND (lease_owner = ? OR lease_until < ? OR lease_owner IS NULL)",
                )
                .bind(owner)
                .bind(until)
                .bind(endpoint)
                .bind(owner)
                .bind(now)
                .execute(&mut **tx)
                .await?
                .rows_affected();
                if taken == 0 {
                    return Ok(None);
                }
                let (delivered_up_to, attempts, next_attempt): (i64, i32, i64) = sqlx::query_as(
                    "SELECT delivered_up_to, attempts, next_attempt FROM tb_event_delivery \
                     WHERE endpoint = ?",
                )
                .bind(endpoint)
                .fetch_one(&mut **tx)
                .await?;
                Ok(Some(Delivery {
                    delivered_up_to,
                    attempts: attempts.max(0) as u32,
                    next_attempt,
                }))
            })
        })
        .await
    }

    /// Event `id` was delivered: the cursor moves on (only for the lease's
    /// holder, and only forward).
    pub async fn delivered(
        &self,
        endpoint: &str,
        owner: &str,
        id: i64,
    ) -> Result<bool, StoreError> {
        let moved = self
            .call(|pool| {
                sqlx::query(
                    "UPDATE tb_event_delivery SET delivered_up_to = ?, attempts = 0, \
                     next_attempt = 0, last_error = NULL \
                     WHERE endpoint = ? AND lease_owner = ? AND delivered_up_to < ?",
                )
                .bind(id)
                .bind(endpoint)
                .bind(owner)
                .bind(id)
                .execute(pool)
            })
            .await?
            .rows_affected();
        Ok(moved == 1)
    }

    /// The next event's delivery failed: its attempts, when to try again,
    /// and why; `acked`: the last event delivered before it this pass.
    pub async fn delivery_failed(
        &self,
        endpoint: &str,
        owner: &str,
        acked: Option<i64>,
        attempts: u32,
        next_attempt: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        self.call(|pool| {
            sqlx::query(
                "UPDATE tb_event_delivery SET attempts = ?, next_attempt = ?, last_error = ?, \
                 delivered_up_to = GREATEST(delivered_up_to, COALESCE(?, 0)) \
                 WHERE endpoint = ? AND lease_owner = ?",
            )
            .bind(attempts as i32)
            .bind(next_attempt)
            .bind(clip(error))
            .bind(acked)
            .bind(endpoint)
            .bind(owner)
            .execute(pool)
        })
        .await
        .map(drop)
    }

    /// Event `id` exhausted its attempts: into the dead letters, and the
    /// cursor moves past it, in one transaction.
    pub async fn dead_letter_event(
        &self,
        endpoint: &str,
        owner: &str,
        id: i64,
        attempts: u32,
        error: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.transaction(|tx| {
            Box::pin(async move {
                let moved = sqlx::query(
                    "UPDATE tb_event_delivery SET delivered_up_to = ?, attempts = 0, \
                     next_attempt = 0, last_error = NULL \
                     WHERE endpoint = ? AND lease_owner = ? AND delivered_up_to < ?",
                )
                .bind(id)
                .bind(endpoint)
                .bind(owner)
                .bind(id)
                .execute(&mut **tx)
                .await?
                .rows_affected();
                if moved == 1 {
                    sqlx::query(
                        "INSERT IGNORE INTO tb_event_dead \
                         (endpoint, event_id, attempts, last_error, dead_at) VALUES (?, ?, ?, ?, ?)",
                    )
                    .bind(endpoint)
                    .bind(id)
                    .bind(attempts as i32)
                    .bind(clip(error))
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
                }
                Ok(())
            })
        })
        .await
    }

    /// The dead letters, oldest first (at most 1,000).
    pub async fn dead_events(&self) -> Result<Vec<DeadEvent>, StoreError> {
        self.call(|pool| {
            sqlx::query_as(
                "SELECT endpoint, event_id, attempts, last_error, dead_at, replay FROM tb_event_dead \
                 ORDER BY event_id, endpoint LIMIT 1000",
            )
            .fetch_all(pool)
        })
        .await
    }

    /// Asks for dead letters to be delivered again (all, or one event's):
    /// the delivery loop tries each once per pass until it goes through.
    /// Returns how many were asked.
    pub async fn replay_dead_events(&self, event_id: Option<i64>) -> Result<u64, StoreError> {
        self.call(|pool| {
            sqlx::query("UPDATE tb_event_dead SET replay = 1 WHERE (? IS NULL OR event_id = ?)")
                .bind(event_id)
                .bind(event_id)
                .execute(pool)
        })
        .await
        .map(|r| r.rows_affected())
    }

    /// The dead letters asked to be replayed, with their events.
    pub async fn replays(&self, endpoint: &str, limit: u32) -> Result<Vec<EventRow>, StoreError> {
        let sql = format!(
            "{EVENTS} JOIN tb_event_dead d ON d.event_id = e.id \
             WHERE d.endpoint = ? AND d.replay = 1 ORDER BY d.event_id LIMIT ?"
        );
        let sql = sql.as_str();
        self.call(|pool| {
            sqlx::query_as(sql)
                .bind(endpoint)
                .bind(limit)
                .fetch_all(pool)
        })
        .await
    }

    /// A replayed dead letter went through (`true`: gone) or failed again.
    pub async fn replayed(
        &self,
        endpoint: &str,
        event_id: i64,
        ok: bool,
        error: &str,
    ) -> Result<(), StoreError> {
        self.call(|pool| async move {
            match ok {
                true => {
                    sqlx::query("DELETE FROM tb_event_dead WHERE endpoint = ? AND event_id = ?")
                        .bind(endpoint)
                        .bind(event_id)
                        .execute(pool)
                        .await
                }
                false => sqlx::query(
                    "UPDATE tb_event_dead SET replay = 0, attempts = attempts + 1, last_error = ? \
                     WHERE endpoint = ? AND event_id = ?",
                )
                .bind(clip(error))
                .bind(endpoint)
                .bind(event_id)
                .execute(pool)
                .await,
            }
        })
        .await
        .map(drop)
    }

    /// How many dead letters wait (all endpoints).
    pub async fn dead_event_count(&self) -> Result<i64, StoreError> {
        self.call(|pool| sqlx::query_scalar("SELECT COUNT(*) FROM tb_event_dead").fetch_one(pool))
            .await
    }

    /// The newest event's id (0: none), for the delivery lag.
    pub async fn last_event_id(&self) -> Result<i64, StoreError> {
        self.call(|pool| {
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM tb_event").fetch_one(pool)
        })
        .await
    }
}
