//! Payments from the payment side: each notification recorded once, in the
//! same MySQL transaction as the order change it makes.
//!
//! A `payment.succeeded` for the order's amount (price × quantity, in the
//! service's currency) turns `confirmed` into `paid`. The same payment twice
//! changes nothing and answers the first result. A payment for an order
//! that cannot take it (cancelled by its payment timeout before the money
//! came, or paid already by another payment) is recorded `refund_due`:
//! the money is owed back, never dropped. A wrong amount or currency is
//! recorded `amount_mismatch` and changes nothing; a `payment.failed` is
//! recorded and leaves the order `confirmed` until its timeout.

use rust_decimal::Decimal;

use super::error::BooksError;
use super::orders::Books;
use crate::domain::{Currency, OrderStatus, PaymentKind, PaymentResult};
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

/// What a notification means for the order as it stands, in `currency`.
pub fn decide(p: &NewPayment, order: &OrderRow, currency: Currency) -> PaymentResult {
    match p.kind {
        PaymentKind::Failed => PaymentResult::Failed,
        PaymentKind::Succeeded => {
            let due = order.price * Decimal::from(order.quantity);
            if p.currency != currency || p.amount != due {
                return PaymentResult::AmountMismatch;
            }
            match order.status {
                OrderStatus::Confirmed => PaymentResult::Paid,
                _ => PaymentResult::RefundDue,
            }
        }
    }
}

impl Books {
    /// Records a verified notification (see the module docs). Refused:
    /// an order the books do not hold (`NotFound`: whether it ever
    /// existed is not said), an order still pending in its stream
    /// (`Pending`: the sender retries shortly), a payment id recorded for
    /// another order (`PaymentIdReused`).
    pub async fn record_payment(
        &self,
        p: &NewPayment,
        currency: Currency,
    ) -> Result<PaymentRecord, BooksError> {
        match self
            .db
            .record_payment(p, &|p, o| decide(p, o, currency))
            .await?
        {
            Recorded::Now(result, order) => {
                if result != PaymentResult::Paid {
                    tracing::warn!(order_id = %p.order_id.as_str(), payment_id = %p.payment_id,
                        result = result.as_str(), "a payment the order could not take");
                }
                Ok(PaymentRecord {
                    result,
                    order,
                    replayed: false,
                })
            }
            Recorded::Before { order_id, .. } if order_id != p.order_id.as_str() => {
                Err(BooksError::PaymentIdReused)
            }
            Recorded::Before { result, .. } => {
                let order = self.db.order(&p.order_id).await?.ok_or_else(|| {
                    BooksError::Corrupt(format!(
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
            Recorded::NoOrder => {
                let Some((_, product)) = crate::domain::OrderId::parse(p.order_id.as_str()) else {
                    return Err(BooksError::NotFound);
                };
                match self.sales.orders.find(&p.order_id, &product).await {
                    Ok(Some(_)) => Err(BooksError::Pending),
                    _ => Err(BooksError::NotFound),
                }
            }
        }
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
            decide(&ok, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Paid
        );
        // The same value written otherwise is the same amount.
        let ok = paid("37.5000", "CNY", PaymentKind::Succeeded);
        assert_eq!(
            decide(&ok, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Paid
        );
        for (amount, currency) in [("12.50", "CNY"), ("37.49", "CNY"), ("37.50", "USD")] {
            let p = paid(amount, currency, PaymentKind::Succeeded);
            assert_eq!(
                decide(&p, &order(OrderStatus::Confirmed), cny),
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
            assert_eq!(decide(&p, &order(status), cny), PaymentResult::RefundDue);
        }
        let failed = paid("37.50", "CNY", PaymentKind::Failed);
        assert_eq!(
            decide(&failed, &order(OrderStatus::Confirmed), cny),
            PaymentResult::Failed
        );
    }
}
