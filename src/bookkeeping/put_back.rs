//! What a failover of the books lost and Redis still holds, put back.
//!
//! A promoted asynchronous replica lacks the commits it had not received.
//! The orders come back from their sales' streams (`worker::repair`); the
//! rest of an order's life after its 202 comes back from what Redis keeps
//! of it:
//!
//! - **Cancels and payment timeouts.** Their Redis half (the units given
//!   back, `release_stock.lua`) follows the commit, so an order whose units
//!   are back in the sale (in its `released` set, not taken again since)
//!   was cancelled: if the books say `confirmed`, the cancel was lost, and
//!   it is made again (as the payment timeout's, `order.cancelled`; the
//!   units are not given back twice: the Redis half finds them back).
//! - **Payments.** Every notification the books record is kept in the
//!   sale's `payments` hash before it is answered 200 ([`OrderLife::note`]); a
//!   kept notification the books do not hold is recorded again, in the
//!   order it first came, and decided as it would be now (the units of a
//!   late payment may have gone meanwhile: `refund_due`). The payment
//!   side's resend of it is then another delivery of a recorded message.
//!
//! Each thing put back is returned for the operator's list (`tb_put_back`).

use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::error::BookkeepingError;
use super::orders::{Cancelled, OrderLife};
use crate::domain::{Currency, OrderId, OrderStatus, PaymentKind, ProductId, now_ms};
use crate::store::{NewPayment, PutBack};

/// Orders asked of the books at once.
const PAGE: usize = 500;

/// A payment notification as the sale's `payments` hash keeps it (its
/// kind and id are the field's: [`field`]).
#[derive(Debug, Serialize, Deserialize)]
struct Noted {
    #[serde(skip)]
    payment_id: String,
    #[serde(skip)]
    kind: String,
    order_id: String,
    amount: String,
    currency: String,
    webhook_id: String,
    /// The currency the service sold in when it was recorded.
    sale_currency: String,
    /// When it was recorded (epoch ms): payments are put back in this order.
    noted_ms: i64,
}

impl Noted {
    fn of(p: &NewPayment, currency: &Currency) -> Self {
        Self {
            payment_id: p.payment_id.clone(),
            kind: p.kind.as_str().to_owned(),
            order_id: p.order_id.as_str().to_owned(),
            amount: p.amount.to_string(),
            currency: p.currency.as_str().to_owned(),
            webhook_id: p.webhook_id.clone(),
            sale_currency: currency.as_str().to_owned(),
            noted_ms: now_ms(),
        }
    }

    /// The notification again, and the currency it was decided in.
    fn payment(&self) -> Result<(NewPayment, Currency), String> {
        let (order_id, _) = OrderId::parse(&self.order_id).ok_or("an order id")?;
        let payment = NewPayment {
            payment_id: self.payment_id.clone(),
            kind: PaymentKind::try_from(self.kind.clone()).map_err(|e| e.to_string())?,
            order_id,
            amount: Decimal::from_str(&self.amount).map_err(|e| e.to_string())?,
            currency: Currency::parse(&self.currency).map_err(|e| e.to_string())?,
            webhook_id: self.webhook_id.clone(),
        };
        let sold_in = Currency::parse(&self.sale_currency).map_err(|e| e.to_string())?;
        Ok((payment, sold_in))
    }
}

/// The field of a payment in its sale's `payments` hash: its kind and id
/// (the books record a payment once per both).
fn field(kind: PaymentKind, payment_id: &str) -> String {
    format!("{}:{payment_id}", kind.as_str())
}

/// A kept payment: its field and record.
fn read(field: &str, record: &str) -> Result<Noted, String> {
    let (kind, payment_id) = field.split_once(':').ok_or("no kind")?;
    let mut noted: Noted = serde_json::from_str(record).map_err(|e| e.to_string())?;
    noted.kind = kind.to_owned();
    noted.payment_id = payment_id.to_owned();
    Ok(noted)
}

impl OrderLife {
    /// Keeps a payment the books recorded beside its sale's orders in
    /// Redis (while the sale is there), for a failover of the books that
    /// loses it. Before the 200:
    /// a notification not kept is not answered, and the payment side's
    /// resend (answered as recorded) keeps it.
    pub(super) async fn note(
        &self,
        p: &NewPayment,
        currency: &Currency,
    ) -> Result<(), BookkeepingError> {
        let Some((_, product)) = OrderId::parse(p.order_id.as_str()) else {
            return Ok(());
        };
        let record = serde_json::to_string(&Noted::of(p, currency))
            .map_err(|e| BookkeepingError::Corrupt(e.to_string()))?;
        // Not kept: the sale is gone from Redis (retired), and so is
        // what a repair would put back.
        self.accepted
            .note_payment(&product, &field(p.kind, &p.payment_id), &record)
            .await?;
        Ok(())
    }

    /// Makes again the cancels of `product` the books lost (see the module
    /// docs); what was put back.
    pub async fn put_back_cancels(
        &self,
        product: &ProductId,
    ) -> Result<Vec<PutBack>, BookkeepingError> {
        let released = self.accepted.released_orders(product).await?;
        let mut done = Vec::new();
        for page in released.chunks(PAGE) {
            let ids: Vec<&str> = page.iter().map(String::as_str).collect();
            let statuses = self.orders.statuses(&ids).await?;
            for id in ids {
                if statuses.get(id) != Some(&OrderStatus::Confirmed) {
                    continue;
                }
                let Some((order_id, _)) = OrderId::parse(id) else {
                    continue;
                };
                if let Cancelled::Done(row) = self.cancel(&order_id, product, None).await? {
                    tracing::warn!(order_id = %row.order_id,
                        "a cancel the books had lost (its units were back in the sale): made again");
                    done.push(PutBack {
                        what: "cancel".into(),
                        order_id: row.order_id,
                        item: String::new(),
                        result: None,
                        put_back: now_ms(),
                    });
                }
            }
        }
        Ok(done)
    }

    /// Records again the payments of `product` the books lost (see the
    /// module docs), oldest first; what was put back.
    pub async fn put_back_payments(
        &self,
        product: &ProductId,
    ) -> Result<Vec<PutBack>, BookkeepingError> {
        let mut noted: Vec<Noted> = Vec::new();
        for (field, record) in self.accepted.noted_payments(product).await? {
            match read(&field, &record) {
                Ok(n) => noted.push(n),
                Err(why) => tracing::warn!(field, why, "a kept payment that does not parse"),
            }
        }
        noted.sort_by_key(|n| n.noted_ms);
        let mut done = Vec::new();
        for page in noted.chunks(PAGE) {
            let mut payments = Vec::with_capacity(page.len());
            for n in page {
                match n.payment() {
                    Ok(p) => payments.push(p),
                    Err(why) => {
                        tracing::warn!(payment_id = %n.payment_id, why, "a kept payment that does not parse")
                    }
                }
            }
            let keys: Vec<(PaymentKind, &str)> = payments
                .iter()
                .map(|(p, _)| (p.kind, p.payment_id.as_str()))
                .collect();
            let held = self.payments.recorded(&keys).await?;
            for (p, currency) in &payments {
                let key = (p.kind.as_str().to_owned(), p.payment_id.clone());
                if held.contains(&key) {
                    continue;
                }
                let record = self.record_payment(p, *currency).await?;
                if record.replayed {
                    continue;
                }
                tracing::warn!(order_id = %p.order_id.as_str(), payment_id = %p.payment_id,
                    kind = p.kind.as_str(), amount = %p.amount, result = record.result.as_str(),
                    "a payment the books had lost (kept in Redis): recorded again");
                done.push(PutBack {
                    what: "payment".into(),
                    order_id: p.order_id.as_str().to_owned(),
                    item: field(p.kind, &p.payment_id),
                    result: Some(record.result.as_str().to_owned()),
                    put_back: now_ms(),
                });
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_payment_reads_back_as_it_was_recorded() {
        let cny = Currency::parse("CNY").unwrap();
        let p = NewPayment {
            payment_id: "pay:1".into(),
            kind: PaymentKind::Refunded,
            order_id: OrderId::generate(&ProductId::parse("sku-1").unwrap()),
            amount: "37.50".parse().unwrap(),
            currency: Currency::parse("USD").unwrap(),
            webhook_id: "msg_1".into(),
        };
        let kept = serde_json::to_string(&Noted::of(&p, &cny)).unwrap();
        let (back, sold_in) = read(&field(p.kind, &p.payment_id), &kept)
            .unwrap()
            .payment()
            .unwrap();
        assert_eq!(sold_in, cny);
        assert_eq!(back.payment_id, p.payment_id);
        assert_eq!(back.kind, p.kind);
        assert_eq!(back.order_id, p.order_id);
        assert_eq!(back.amount, p.amount);
        assert_eq!(back.currency, p.currency);
        assert_eq!(back.webhook_id, p.webhook_id);
        // The kind comes first: a payment id may hold a colon.
        assert_eq!(field(p.kind, &p.payment_id), "payment.refunded:pay:1");
    }
}
