//! `tb_payment` ([`Payments`]): each payment notification recorded once, in
//! the same transaction as the order change it makes (so a payment and its
//! change exist together or not at all).
//!
//! The books decide what a notification means; the store reads and writes.
//! [`Payments::lock`] opens the transaction and locks what the decision
//! reads (the order, an earlier record of the same payment, the payment a
//! refund refers to); the books decide on those facts; [`Locked::record`]
//! writes the decision and commits. Dropped unrecorded, the transaction
//! rolls back.

use rust_decimal::Decimal;
use sqlx::{MySql, Transaction};

use super::db::Db;
use super::error::StoreError;
use super::events::{self, EventKind};
use super::orders::transitions::{cancel_rows, take_units};
use super::orders::{OrderRow, order_rows};
use crate::domain::{Currency, OrderId, OrderStatus, PaymentKind, PaymentResult, now_ms};

/// A notification as received, verified.
#[derive(Debug, Clone)]
pub struct NewPayment {
    pub payment_id: String,
    pub kind: PaymentKind,
    pub order_id: OrderId,
    pub amount: Decimal,
    pub currency: Currency,
    /// The message's `webhook-id`, kept for the operator.
    pub webhook_id: String,
}

/// The payments table's handle.
#[derive(Clone)]
pub struct Payments {
    db: Db,
}

/// What the books hold of a notification, locked until it is recorded.
pub struct Locked {
    tx: Transaction<'static, MySql>,
    db: Db,
    /// The order it is for (`None`: no such order in the books).
    pub order: Option<OrderRow>,
    /// This payment (id and kind) recorded before.
    pub before: Option<Recorded>,
    /// For a refund: what the refunded payment came to for this order
    /// (`None`: the books hold no such payment for it).
    pub refunded: Option<PaymentResult>,
    /// The payment has a record (`before`): [`Locked::record`] replaces it.
    replacing: bool,
}

/// A payment as the books recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub result: PaymentResult,
    /// The order it was for.
    pub order_id: String,
    /// The notification that was recorded (Standard Webhooks' message id:
    /// the same on every delivery of one message).
    pub webhook_id: String,
}

impl Payments {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Counts a notification's transaction tried again after contention
    /// (`flashsale_db_retries_total`): the books retry it whole.
    pub fn count_retry(&self) {
        self.db.count_retry();
    }

    /// What the notifications of a sale's orders came to: `(result,
    /// notifications, their amounts summed, a currency of theirs)`.
    pub async fn results_of(
        &self,
        product: &crate::domain::ProductId,
    ) -> Result<Vec<(String, i64, Decimal, Option<String>)>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                sqlx::query!(
                    "SELECT p.result, COUNT(*) AS `notifications!: i64`, \
                     COALESCE(SUM(p.amount), 0) AS `amount!: Decimal`, \
                     MAX(p.currency) AS `currency?: String` \
                     FROM tb_payment p JOIN tb_order o ON o.order_id = p.order_id \
                     WHERE o.product_id = ? GROUP BY p.result",
                    product.as_str(),
                )
                .fetch_all(pool)
                .await
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.result, r.notifications, r.amount, r.currency))
            .collect())
    }

    /// A sale's payments whose result is `refund_due` (taken for orders
    /// that could not have them), oldest first, at most `limit`:
    /// `(payment_id, order_id, user_id, amount, currency, received)`.
    pub async fn refunds_due_of(
        &self,
        product: &crate::domain::ProductId,
        limit: u32,
    ) -> Result<Vec<RefundDueRow>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                sqlx::query!(
                    "SELECT p.payment_id, p.order_id, o.user_id, p.amount, p.currency, p.received \
                     FROM tb_payment p JOIN tb_order o ON o.order_id = p.order_id \
                     WHERE o.product_id = ? AND p.result = 'refund_due' \
                     ORDER BY p.received, p.payment_id LIMIT ?",
                    product.as_str(),
                    limit,
                )
                .fetch_all(pool)
                .await
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.payment_id,
                    r.order_id,
                    r.user_id,
                    r.amount,
                    r.currency,
                    r.received,
                )
            })
            .collect())
    }

    /// Which of `payments` (kind, payment id) the books hold.
    pub async fn recorded(
        &self,
        payments: &[(PaymentKind, &str)],
    ) -> Result<std::collections::HashSet<(String, String)>, StoreError> {
        if payments.is_empty() {
            return Ok(Default::default());
        }
        let rows: Vec<(String, String)> = self
            .db
            .call(|pool| async move {
                // A runtime query: its `IN` list is as long as `payments`.
                let mut q = sqlx::QueryBuilder::<MySql>::new(
                    "SELECT kind, payment_id FROM tb_payment WHERE payment_id IN (",
                );
                let mut list = q.separated(", ");
                for (_, id) in payments {
                    list.push_bind(*id);
                }
                q.push(")");
                q.build_query_as().fetch_all(pool).await
            })
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// Opens the notification's transaction and reads, locked, what its
    /// decision needs: the order (`FOR UPDATE`: a payment timeout cancelling
    /// it waits, or made its change first), an earlier record of the same
    /// payment, and for a refund the payment it refers to.
    #[tracing::instrument(level = "debug", skip_all, fields(payment_id = %p.payment_id, order_id = %p.order_id))]
    pub async fn lock(&self, p: &NewPayment) -> Result<Locked, StoreError> {
        let mut tx = self.db.begin().await?;
        let read = self.db.bounded(async {
            let order = order_rows!(
                "FORCE INDEX (uk_order_id) WHERE order_id = ? FOR UPDATE",
                p.order_id.as_str(),
            )
            .fetch_optional(&mut *tx)
            .await?
            .map(OrderRow::try_from)
            .transpose()?;
            let before = recorded(&mut tx, &p.payment_id, p.kind, None, Lock::ForUpdate).await?;
            let refunded = match (p.kind, &order) {
                (PaymentKind::Refunded, Some(_)) => {
                    let paid = PaymentKind::Succeeded;
                    recorded(&mut tx, &p.payment_id, paid, Some(&p.order_id), Lock::Read).await?
                }
                _ => None,
            };
            Ok((order, before, refunded.map(|r| r.result)))
        });
        let (order, before, refunded) = read.await?;
        Ok(Locked {
            tx,
            db: self.db.clone(),
            order,
            replacing: before.is_some(),
            before,
            refunded,
        })
    }
}

impl Locked {
    /// Applies `result` to the order (`paid`: `confirmed` or `cancelled` →
    /// `paid`; `refunded`: cancelled, its units given back), records the
    /// payment (over its earlier record, when it has one: the books decided
    /// that this notification supersedes it) and commits; the order as it
    /// is now. Call only with an order.
    pub async fn record(
        mut self,
        p: &NewPayment,
        result: PaymentResult,
    ) -> Result<OrderRow, StoreError> {
        let mut row = self
            .order
            .take()
            .ok_or_else(|| StoreError::Corrupt("a payment recorded without its order".into()))?;
        let (db, mut tx, replacing) = (self.db, self.tx, self.replacing);
        db.bounded(async {
            let now = now_ms();
            apply(&mut tx, result, &mut row, now).await?;
            // The record's fields, bound in one order for either statement.
            macro_rules! write {
                ($sql:literal) => {
                    sqlx::query!(
                        $sql,
                        p.order_id.as_str(),
                        p.amount,
                        p.currency.as_str(),
                        result.as_str(),
                        &p.webhook_id,
                        now,
                        &p.payment_id,
                        p.kind.as_str(),
                    )
                };
            }
            let write = if replacing {
                write!(
                    "UPDATE tb_payment SET order_id = ?, amount = ?, currency = ?, result = ?, \
                     webhook_id = ?, received = ? WHERE payment_id = ? AND kind = ?"
                )
            } else {
                write!(
                    "INSERT INTO tb_payment \
                     (order_id, amount, currency, result, webhook_id, received, payment_id, kind) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                )
            };
            write.execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(row)
        })
        .await
    }
}

/// How a payment's record is read in its transaction.
#[derive(Debug, Clone, Copy)]
enum Lock {
    /// Locked until the transaction ends (`FOR UPDATE`).
    ForUpdate,
    /// A plain read.
    Read,
}

/// A `tb_payment` record as read.
struct PaymentRecord {
    result: String,
    order_id: String,
    webhook_id: String,
}

/// The record of payment `id` of `kind` (for `order`, when given).
async fn recorded(
    tx: &mut Transaction<'static, MySql>,
    id: &str,
    kind: PaymentKind,
    order: Option<&OrderId>,
    lock: Lock,
) -> Result<Option<Recorded>, StoreError> {
    let order = order.map(OrderId::as_str);
    // The same read, locked or not (`$lock` ends the statement).
    macro_rules! read {
        ($lock:literal) => {
            sqlx::query_as!(
                PaymentRecord,
                "SELECT result, order_id, webhook_id FROM tb_payment \
                 WHERE payment_id = ? AND kind = ? AND (? IS NULL OR order_id = ?)"
                    + $lock,
                id,
                kind.as_str(),
                order,
                order,
            )
            .fetch_optional(&mut **tx)
            .await?
        };
    }
    let found = match lock {
        Lock::ForUpdate => read!(" FOR UPDATE"),
        Lock::Read => read!(""),
    };
    found
        .map(
            |PaymentRecord {
                 result,
                 order_id,
                 webhook_id,
             }| {
                let result = PaymentResult::try_from(result)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(Recorded {
                    result,
                    order_id,
                    webhook_id,
                })
            },
        )
        .transpose()
}

/// What `result` changes of the order, in the payment's transaction.
async fn apply(
    tx: &mut Transaction<'static, MySql>,
    result: PaymentResult,
    row: &mut OrderRow,
    now: i64,
) -> Result<(), StoreError> {
    match result {
        PaymentResult::Paid | PaymentResult::PaidAgain => {
            let from = row.status;
            sqlx::query!(
                "UPDATE tb_order FORCE INDEX (uk_order_id) \
                 SET status = ?, released = 0, updated = ? \
                 WHERE order_id = ? AND status = ?",
                OrderStatus::Paid.as_str(),
                now,
                &row.order_id,
                from.as_str(),
            )
            .execute(&mut **tx)
            .await?;
            if from == OrderStatus::Cancelled {
                // The cancel gave its units back; they are the order's again.
                take_units(tx, &row.product_id, row.quantity, now).await?;
            }
            row.status = OrderStatus::Paid;
            row.released = false;
            row.updated = now;
            events::record(tx, EventKind::Paid, [row.order_id.as_str()].into_iter()).await?;
        }
        PaymentResult::Refunded => cancel_rows(tx, std::slice::from_mut(row)).await?,
        PaymentResult::RefundDue => {
            events::record(
                tx,
                EventKind::RefundDue,
                [row.order_id.as_str()].into_iter(),
            )
            .await?;
        }
        PaymentResult::AmountMismatch
        | PaymentResult::Failed
        | PaymentResult::RefundSettled
        | PaymentResult::Unmatched => {}
    }
    Ok(())
}

/// A payment owed back: `(payment_id, order_id, user_id, amount,
/// currency, received)` (epoch ms).
pub type RefundDueRow = (String, String, i64, Decimal, String, i64);
