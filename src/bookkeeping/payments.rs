//! Payments from the payment side: each notification recorded once, in the
//! same MySQL transaction as the order change it makes.
//!
//! A `payment.succeeded` for the order's amount (price × quantity, in the
//! service's currency) turns `confirmed` into `paid`. The same payment twice
//! changes nothing and answers the first result. A wrong amount or currency
//! is recorded `amount_mismatch` and changes nothing; a `payment.failed` is
//! recorded and leaves the order `confirmed` until its timeout.
//!
//! A late payment, for an order its payment timeout cancelled: the order
//! takes its units again if the sale can still sell them to its buyer
//! (`retake_order.lua`: the sale open, the units there, the buyer's limit;
//! once per order) and is `paid` (`paid_again`); otherwise the payment is
//! recorded `refund_due`, owed back, never dropped. So is a second payment
//! of a paid order. The Redis half comes first: a crash before the books
//! record the payment leaves the units taken and the order `cancelled`
//! until the payment side sends the notification again (it does, until it
//! hears a 200), which finds them taken and records the payment.
//!
//! A `payment.refunded` (in full) of the payment that paid the order
//! cancels it (`order.cancelled`) and gives its units back to the sale, as
//! a buyer's cancel does; of a payment owed back, it settles it.
//!
//! A payment is recorded once per id and kind. Another delivery of the
//! same message (the same `webhook-id`) answers what the first came to. A
//! refusal (`amount_mismatch`, `unmatched`) is not that answer for another
//! message: a payment side's corrected notification of the same payment
//! (the full refund after a partial one) is decided anew, over the
//! refusal's record.

use rust_decimal::Decimal;

use super::error::BookkeepingError;
use super::orders::{OrderLife, pending_of};
use crate::domain::{Currency, OrderStatus, PaymentKind, PaymentResult, backoff};
use crate::sale::Retake;
use crate::store::{NewPayment, OrderRow, Recorded};

/// What a notification came to.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentRecord {
    pub result: PaymentResult,
    /// The order as it stands now.
    pub order: OrderRow,
    /// Recorded by an earlier delivery of the same notification.
    pub replayed: bool,
}

/// Whether a cancelled order took its units again for a late payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retaking {
    NotTried,
    Taken,
    Refused,
}

/// What a notification means for the order as it stands, in `currency`;
/// `refunded` is what the refunded payment came to for this order. `None`:
/// the order must try to take its units again first.
pub fn decide(
    p: &NewPayment,
    order: &OrderRow,
    refunded: Option<PaymentResult>,
    currency: Currency,
    retaking: Retaking,
) -> Option<PaymentResult> {
    if p.kind == PaymentKind::Failed {
        return Some(PaymentResult::Failed);
    }
    let due = order.price * Decimal::from(order.quantity);
    if p.currency != currency || p.amount != due {
        return Some(PaymentResult::AmountMismatch);
    }
    Some(match (p.kind, order.status) {
        (PaymentKind::Succeeded, OrderStatus::Confirmed) => PaymentResult::Paid,
        (PaymentKind::Succeeded, OrderStatus::Cancelled) => match retaking {
            Retaking::NotTried => return None,
            Retaking::Taken => PaymentResult::PaidAgain,
            Retaking::Refused => PaymentResult::RefundDue,
        },
        (PaymentKind::Succeeded, _) => PaymentResult::RefundDue,
        (_, status) => match refunded {
            Some(PaymentResult::Paid | PaymentResult::PaidAgain) if status == OrderStatus::Paid => {
                PaymentResult::Refunded
            }
            Some(PaymentResult::RefundDue) => PaymentResult::RefundSettled,
            _ => PaymentResult::Unmatched,
        },
    })
}

/// Whether notification `p` is decided anew over the record `before` of
/// the same payment (id and kind): `before` was a refusal and `p` is
/// another message for the same order (a payment side's corrected
/// resend). Another delivery of the same message is answered as before.
fn supersedes(p: &NewPayment, before: &Recorded) -> bool {
    before.result.is_refusal()
        && before.webhook_id != p.webhook_id
        && before.order_id == p.order_id.as_str()
}

/// Tries of one notification: a deadlock's victim, or a second delivery
/// racing the first to insert its row, changed nothing and is tried again.
const ATTEMPTS: usize = 3;

impl OrderLife {
    /// Records a verified notification (see the module docs). Refused:
    /// an order the books do not hold (`NotFound`: whether it ever
    /// existed is not said), an order still pending in its stream
    /// (`Pending`: the sender retries shortly), a payment id recorded for
    /// another order (`PaymentIdReused`). Recorded, it is kept in Redis
    /// too, for a failover of the books that loses it (`put_back`).
    #[tracing::instrument(level = "debug", skip_all, fields(payment_id = %p.payment_id, order_id = %p.order_id, kind = p.kind.as_str()))]
    pub async fn record_payment(
        &self,
        p: &NewPayment,
        currency: Currency,
    ) -> Result<PaymentRecord, BookkeepingError> {
        let conflict = |e: &BookkeepingError| {
            let again = matches!(e, BookkeepingError::Store(e) if e.is_conflict());
            if again {
                self.payments.count_retry();
            }
            again
        };
        let record =
            backoff::retrying(ATTEMPTS, conflict, || self.record_once(p, currency)).await?;
        self.note(p, &currency).await?;
        Ok(record)
    }

    /// One try: the store locks what the decision reads, the books decide,
    /// the store records it. A late payment of a cancelled order tries to
    /// take its units again first, outside the transaction (a Redis call),
    /// then decides on the order as it then stands.
    async fn record_once(
        &self,
        p: &NewPayment,
        currency: Currency,
    ) -> Result<PaymentRecord, BookkeepingError> {
        let mut retaking = Retaking::NotTried;
        loop {
            let mut locked = self.payments.lock(p).await?;
            if let Some(before) = locked.before.take_if(|b| !supersedes(p, b)) {
                drop(locked);
                return self
                    .recorded_before(p, before.result, &before.order_id)
                    .await;
            }
            let Some(order) = &locked.order else {
                drop(locked);
                return Err(self.no_order(p).await?);
            };
            match decide(p, order, locked.refunded, currency, retaking) {
                Some(result) => {
                    let order = locked.record(p, result).await?;
                    self.after_payment(p, result, &order).await?;
                    return Ok(PaymentRecord {
                        result,
                        order,
                        replayed: false,
                    });
                }
                None => {
                    let row = order.clone();
                    drop(locked);
                    retaking = self.retake(p, &row).await?;
                }
            }
        }
    }

    /// The same notification, recorded before: its first result.
    async fn recorded_before(
        &self,
        p: &NewPayment,
        result: PaymentResult,
        order_id: &str,
    ) -> Result<PaymentRecord, BookkeepingError> {
        if order_id != p.order_id.as_str() {
            return Err(BookkeepingError::PaymentIdReused);
        }
        let order = self.orders.order(&p.order_id).await?.ok_or_else(|| {
            BookkeepingError::Corrupt(format!(
                "a payment for {} and no order",
                p.order_id.as_str()
            ))
        })?;
        Ok(PaymentRecord {
            result,
            order,
            replayed: true,
        })
    }

    /// Why a notification for an order the books do not hold is refused.
    /// Told 202 and not in the books: pending, asked again. A Redis that
    /// does not answer is a 503 (never a 404 for an order that may exist),
    /// and an order the workers persisted between the two reads is pending
    /// too (asked again, found).
    async fn no_order(&self, p: &NewPayment) -> Result<BookkeepingError, BookkeepingError> {
        let Some((_, product)) = crate::domain::OrderId::parse(p.order_id.as_str()) else {
            return Ok(BookkeepingError::NotFound);
        };
        Ok(match self.accepted.find(&p.order_id, &product).await? {
            Some(_) => BookkeepingError::Pending,
            None if self.orders.order(&p.order_id).await?.is_some() => BookkeepingError::Pending,
            None => BookkeepingError::NotFound,
        })
    }

    /// A late payment's cancelled order takes its units again, if the sale
    /// can still sell them to its buyer. A cancel whose Redis half is not
    /// done yet is finished first (the units must be back to be retaken).
    async fn retake(&self, p: &NewPayment, row: &OrderRow) -> Result<Retaking, BookkeepingError> {
        if !row.released {
            self.release(row).await?;
        }
        Ok(
            match self.accepted.retake(&pending_of(row)?, row.updated).await? {
                Retake::Taken => Retaking::Taken,
                Retake::Refused(why) => {
                    tracing::info!(order_id = %row.order_id, payment_id = %p.payment_id, why,
                        "a late payment: the units are not there for it");
                    Retaking::Refused
                }
            },
        )
    }

    /// What follows a recorded payment: a refunded order's units go back
    /// to the sale (its Redis half, as a cancel's); the rest is logged.
    async fn after_payment(
        &self,
        p: &NewPayment,
        result: PaymentResult,
        order: &OrderRow,
    ) -> Result<(), BookkeepingError> {
        match result {
            PaymentResult::Paid => {}
            PaymentResult::PaidAgain => {
                tracing::info!(order_id = %order.order_id, payment_id = %p.payment_id,
                    "a late payment took the order's units again: paid");
            }
            PaymentResult::Refunded => {
                tracing::info!(order_id = %order.order_id, payment_id = %p.payment_id,
                    "refunded: the order is cancelled, its units go back");
                self.release_refunded(order).await?;
            }
            _ => {
                tracing::warn!(order_id = %p.order_id.as_str(), payment_id = %p.payment_id,
                    result = result.as_str(), "a payment the order could not take");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OrderId;

    fn order(status: OrderStatus) -> OrderRow {
        OrderRow {
            order_id: "sku-1:00".into(),
            user_id: 1,
            product_id: "sku-1".into(),
            quantity: 3,
            price: Decimal::new(1250, 2),
            status,
            created: 0,
            updated: 0,
            released: false,
            idempotency_key: None,
        }
    }

    fn d(p: &NewPayment, o: &OrderRow, c: Currency) -> PaymentResult {
        decide(p, o, None, c, Retaking::Refused).expect("decided")
    }

    fn paid(amount: &str, currency: &str, kind: PaymentKind) -> NewPayment {
        NewPayment {
            payment_id: "pay_1".into(),
            kind,
            order_id: OrderId::from_trusted("sku-1:00".into()),
            amount: amount.parse().unwrap(),
            currency: Currency::parse(currency).unwrap(),
            webhook_id: "msg_1".into(),
        }
    }

    #[test]
    fn the_amount_is_price_times_quantity_in_the_sales_currency() {
        let cny = Currency::parse("CNY").unwrap();
        let ok = paid("37.50", "CNY", PaymentKind::Succeeded);
        assert_eq!(
            d(&ok, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Paid
        );
        // The same value written otherwise is the same amount.
        let ok = paid("37.5000", "CNY", PaymentKind::Succeeded);
        assert_eq!(
            d(&ok, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Paid
        );
        for (amount, currency) in [("12.50", "CNY"), ("37.49", "CNY"), ("37.50", "USD")] {
            let p = paid(amount, currency, PaymentKind::Succeeded);
            assert_eq!(
                d(&p, &order(OrderStatus::Confirmed), cny),
                PaymentResult::AmountMismatch,
                "{amount} {currency}"
            );
        }
    }

    #[test]
    fn money_for_an_order_that_cannot_take_it_is_owed_back() {
        let cny = Currency::parse("CNY").unwrap();
        let p = paid("37.50", "CNY", PaymentKind::Succeeded);
        for status in [OrderStatus::Cancelled, OrderStatus::Paid] {
            assert_eq!(d(&p, &order(status), cny), PaymentResult::RefundDue);
        }
        let failed = paid("37.50", "CNY", PaymentKind::Failed);
        assert_eq!(
            d(&failed, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Failed
        );
    }

    #[test]
    fn a_late_payment_tries_the_units_first() {
        let cny = Currency::parse("CNY").unwrap();
        let p = paid("37.50", "CNY", PaymentKind::Succeeded);
        let cancelled = order(OrderStatus::Cancelled);
        assert_eq!(decide(&p, &cancelled, None, cny, Retaking::NotTried), None);
        assert_eq!(
            decide(&p, &cancelled, None, cny, Retaking::Taken),
            Some(PaymentResult::PaidAgain)
        );
        // A wrong amount never takes units.
        let wrong = paid("1.00", "CNY", PaymentKind::Succeeded);
        assert_eq!(
            decide(&wrong, &cancelled, None, cny, Retaking::NotTried),
            Some(PaymentResult::AmountMismatch)
        );
    }

    #[test]
    fn a_refund_cancels_only_an_order_its_payment_paid() {
        let cny = Currency::parse("CNY").unwrap();
        let r = paid("37.50", "CNY", PaymentKind::Refunded);
        let at = |status, before| decide(&r, &order(status), before, cny, Retaking::NotTried);
        for before in [PaymentResult::Paid, PaymentResult::PaidAgain] {
            assert_eq!(
                at(OrderStatus::Paid, Some(before)),
                Some(PaymentResult::Refunded)
            );
        }
        assert_eq!(
            at(OrderStatus::Paid, Some(PaymentResult::RefundDue)),
            Some(PaymentResult::RefundSettled)
        );
        for (status, before) in [
            (OrderStatus::Paid, None),
            (OrderStatus::Confirmed, None),
            (OrderStatus::Cancelled, Some(PaymentResult::Paid)),
            (OrderStatus::Paid, Some(PaymentResult::Failed)),
        ] {
            assert_eq!(
                at(status, before),
                Some(PaymentResult::Unmatched),
                "{status:?} {before:?}"
            );
        }
        let partial = paid("10.00", "CNY", PaymentKind::Refunded);
        assert_eq!(
            decide(
                &partial,
                &order(OrderStatus::Paid),
                Some(PaymentResult::Paid),
                cny,
                Retaking::NotTried
            ),
            Some(PaymentResult::AmountMismatch)
        );
    }
}
