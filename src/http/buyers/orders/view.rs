//! An order as clients see it.

use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{OrderStatus, PendingOrder};
use crate::sale::Progress;
use crate::store::OrderRow;

/// An order as clients see it.
#[derive(Serialize, ToSchema)]
pub struct OrderView {
    pub(super) order_id: String,
    /// `pending` (accepted, in the stream) until a worker persists it, then
    /// `confirmed`; `paid` or `cancelled` later (`cancelling` while a cancel
    /// waits for the order to be persisted).
    pub(super) status: OrderStatus,
    pub(super) user_id: u64,
    pub(super) product_id: String,
    pub(super) quantity: u64,
    pub(super) price: Decimal,
    pub(super) created: i64,
    /// Present (`true`) only when MySQL was unavailable and the order was
    /// answered from Redis: `status` is then the last state Redis knows
    /// (`pending`, `confirmed`, `cancelling` or `cancelled`; a payment is
    /// known to MySQL only). Ask again later for the books' answer.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) provisional: bool,
}

impl OrderView {
    /// An order as Redis last knew it, while MySQL cannot say more.
    pub(super) fn provisional(order: PendingOrder, progress: Progress) -> Self {
        let status = match progress {
            Progress::InStream | Progress::DeadLettered => OrderStatus::Pending,
            Progress::Persisted => OrderStatus::Confirmed,
            Progress::CancelRequested => OrderStatus::Cancelling,
            Progress::Released => OrderStatus::Cancelled,
        };
        Self {
            status,
            provisional: true,
            ..order.into()
        }
    }
}

impl OrderView {
    /// The view as JSON, byte for byte what serde writes, written straight
    /// into its buffer when its strings need no escaping (ids are
    /// validated, so they never do; anything else goes through serde): the
    /// body of every 202 (BENCHMARKS.md, "What does an accepted order cost?").
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let plain = |s: &str| s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
        if !(plain(&self.order_id) && plain(&self.product_id)) {
            // Serializing plain fields into memory does not fail.
            return serde_json::to_vec(self).unwrap_or_default();
        }
        let mut out = String::with_capacity(128 + self.order_id.len() + self.product_id.len());
        let mut number = itoa::Buffer::new();
        out.push_str("{\"order_id\":\"");
        out.push_str(&self.order_id);
        out.push_str("\",\"status\":\"");
        out.push_str(self.status.as_str());
        out.push_str("\",\"user_id\":");
        out.push_str(number.format(self.user_id));
        out.push_str(",\"product_id\":\"");
        out.push_str(&self.product_id);
        out.push_str("\",\"quantity\":");
        out.push_str(number.format(self.quantity));
        out.push_str(",\"price\":\"");
        // Writing into a String does not fail.
        let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{}", self.price));
        out.push_str("\",\"created\":");
        out.push_str(number.format(self.created));
        if self.provisional {
            out.push_str(",\"provisional\":true");
        }
        out.push('}');
        out.into_bytes()
    }
}

impl OrderView {
    /// An order as the order path answers it: its `product_id` names the
    /// sale already (`OrderPath::decide`), no stock shard to strip (a
    /// search of the id on every accepted order, BENCHMARKS.md "What does
    /// a hot sale cost?").
    pub(crate) fn of_sale(o: PendingOrder) -> Self {
        debug_assert!(!o.product_id.is_shard(), "{}", o.product_id);
        Self {
            order_id: o.order_id.into_string(),
            status: OrderStatus::Pending,
            user_id: o.user_id.get(),
            product_id: o.product_id.into_string(),
            quantity: o.quantity.get(),
            price: o.price,
            created: o.created_ms,
            provisional: false,
        }
    }
}

impl From<PendingOrder> for OrderView {
    fn from(mut o: PendingOrder) -> Self {
        // (a stock shard's order is its sale's)
        o.product_id = o.product_id.into_sale();
        Self::of_sale(o)
    }
}

impl From<OrderRow> for OrderView {
    fn from(o: OrderRow) -> Self {
        Self {
            order_id: o.order_id,
            status: o.status,
            user_id: o.user_id as u64,
            product_id: o.product_id,
            quantity: o.quantity as u64,
            price: o.price.normalize(),
            created: o.created,
            provisional: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orders_json_is_what_serde_writes() {
        let view = |order_id: &str, product_id: &str, status, provisional| OrderView {
            order_id: order_id.into(),
            status,
            user_id: 9_223_372_036_854_775_807,
            product_id: product_id.into(),
            quantity: 3,
            price: "4999.50".parse().unwrap(),
            created: 1_796_003_647_270,
            provisional,
        };
        for v in [
            view("sku-1:01a22a28cf25", "sku-1", OrderStatus::Pending, false),
            view("a:b", "a", OrderStatus::Cancelling, true),
            view("x", "é-ü", OrderStatus::Paid, false),
            // Strings that need escaping take serde's way.
            view("q\"uote", "back\\slash", OrderStatus::Confirmed, false),
            view("tab\tbed", "p", OrderStatus::Cancelled, true),
        ] {
            assert_eq!(
                String::from_utf8(v.to_json()).unwrap(),
                serde_json::to_string(&v).unwrap()
            );
        }
        let mut zero = view("o", "p", OrderStatus::Pending, false);
        zero.price = Decimal::ZERO;
        zero.created = -1;
        assert_eq!(zero.to_json(), serde_json::to_vec(&zero).unwrap());
    }
}
