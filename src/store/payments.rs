//! `tb_payment`: each payment notification recorded once, in the same
//! transaction as the order change it makes (so a payment and its change
//! exist together or not at all).

use rust_decimal::Decimal;

use super::db::{Db, StoreError};
use super::events::{self, EventKind};
use super::lifecycle;
use super::orders::{OrderRow, ROW};
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

/// What recording a notification found.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Recorded now, with this result; the order as it is now.
    Now(PaymentResult, OrderRow),
    /// Recorded before (the same payment id and kind): its first result,
    /// and the order it was for.
    Before {
        result: PaymentResult,
        order_id: String,
    },
    /// No such order in the books.
    NoOrder,
    /// Nothing recorded: `decide` asks for the order (cancelled) to take
    /// its units again first (`retake_order.lua`), then to be asked again.
    MustRetake(OrderRow),
}

/// What the books decide for a notification: the order as it stands
/// (locked), and for a refund, what the refunded payment came to for this
/// order (`None`: the books hold no such payment for it). `None` asks for
/// a retake first ([`Recorded::MustRetake`]).
pub type Decide<'a> =
    &'a (dyn Fn(&NewPayment, &OrderRow, Option<PaymentResult>) -> Option<PaymentResult> + Sync);

impl Db {
    /// Records a notification once: locks the order, returns the first
    /// result if this payment was recorded already, otherwise asks
    /// `decide` what it means for the order as it stands, applies it
    /// (`paid`: `confirmed` → `paid`) and records it, in one transaction.
    /// A payment timeout cancelling the same order waits for the lock, or
    /// made its change first: either way one of the two sees the other's.
    pub async fn record_payment(
        &self,
        p: &NewPayment,
        decide: Decide<'_>,
    ) -> Result<Recorded, StoreError> {
        // Two deliveries of one notification at once: the second waits for
        // the order's lock, then finds the first's row.
        let retry = |e: &StoreError| {
            e.is_contention()
                || matches!(e, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
        };
        self.retrying(3, retry, || self.record_once(p, decide))
            .await
    }

    async fn record_once(
        &self,
        p: &NewPayment,
        decide: Decide<'_>,
    ) -> Result<Recorded, StoreError> {
        self.transaction(|tx| {
            Box::pin(async move {
                let row: Option<OrderRow> = sqlx::query_as(&format!(
                    "SELECT {ROW} FROM tb_order FORCE INDEX (uk_order_id) \
                     WHERE order_id = ? FOR UPDATE"
                ))
                .bind(p.order_id.as_str())
                .fetch_optional(&mut **tx)
                .await?;
                let before: Option<(String, String)> = sqlx::query_as(
                    "SELECT result, order_id FROM tb_payment \
                     WHERE payment_id = ? AND kind = ? FOR UPDATE",
                )
                .bind(&p.payment_id)
                .bind(p.kind.as_str())
                .fetch_optional(&mut **tx)
                .await?;
                if let Some((result, order_id)) = before {
                    let result = PaymentResult::try_from(result)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    return Ok(Recorded::Before { result, order_id });
                }
                let Some(mut row) = row else {
                    return Ok(Recorded::NoOrder);
                };
                let refunded = if p.kind == PaymentKind::Refunded {
                    let found: Option<(String,)> = sqlx::query_as(
                        "SELECT result FROM tb_payment \
                         WHERE payment_id = ? AND kind = ? AND order_id = ?",
                    )
                    .bind(&p.payment_id)
                    .bind(PaymentKind::Succeeded.as_str())
                    .bind(p.order_id.as_str())
                    .fetch_optional(&mut **tx)
                    .await?;
                    match found {
                        Some((r,)) => Some(
                            PaymentResult::try_from(r)
                                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                        ),
                        None => None,
                    }
                } else {
                    None
                };
                let Some(result) = decide(p, &row, refunded) else {
                    return Ok(Recorded::MustRetake(row));
                };
                let now = now_ms();
                match result {
                    PaymentResult::Paid | PaymentResult::PaidAgain => {
                        let from = row.status;
                        sqlx::query(
                            "UPDATE tb_order FORCE INDEX (uk_order_id) \
                             SET status = ?, released = 0, updated = ? \
                             WHERE order_id = ? AND status = ?",
                        )
                        .bind(OrderStatus::Paid.as_str())
                        .bind(now)
                        .bind(p.order_id.as_str())
                        .bind(from.as_str())
                        .execute(&mut **tx)
                        .await?;
                        if from == OrderStatus::Cancelled {
                            // The cancel gave its units back; they are the
                            // order's again.
                            lifecycle::take_units(tx, &row.product_id, row.quantity, now).await?;
                        }
                        row.status = OrderStatus::Paid;
                        row.released = false;
                        row.updated = now;
                        events::record(tx, EventKind::Paid, [row.order_id.as_str()].into_iter())
                            .await?;
                    }
                    PaymentResult::Refunded => {
                        lifecycle::cancel_rows(tx, std::slice::from_mut(&mut row)).await?;
                    }
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
                sqlx::query(
                    "INSERT INTO tb_payment \
                     (payment_id, kind, order_id, amount, currency, result, webhook_id, received) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(&p.payment_id)
                .bind(p.kind.as_str())
                .bind(p.order_id.as_str())
                .bind(p.amount)
                .bind(p.currency.as_str())
                .bind(result.as_str())
                .bind(&p.webhook_id)
                .bind(now)
                .execute(&mut **tx)
                .await?;
                Ok(Recorded::Now(result, row))
            })
        })
        .await
    }
}
