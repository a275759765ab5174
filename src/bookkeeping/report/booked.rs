//! The report's figures the books know, exactly: units sold, the buyers
//! who ordered and who paid, the time to sell out, payments by result and
//! the audit's verdict.

use std::collections::{HashMap, HashSet};

use rust_decimal::Decimal;

use super::figures::{Money, SecondView, Summary, second_at};
use crate::bookkeeping::audit::SaleAudit;
use crate::domain::OrderStatus;
use crate::store::{OrderRow, Product};

/// The payments of one result: how many, their amounts summed, their
/// currency.
pub(super) type Heard = (i64, Decimal, Option<String>);

/// Fills in what the books know of `product`'s sale: its `orders`, its
/// `payments` by result and its `audit`.
pub(super) fn fill(
    s: &mut Summary,
    product: &Product,
    orders: &[OrderRow],
    payments: &HashMap<String, Heard>,
    audit: &SaleAudit,
) {
    let sold = |o: &&OrderRow| matches!(o.status, OrderStatus::Confirmed | OrderStatus::Paid);
    s.units_sold = orders.iter().filter(sold).map(|o| o.quantity).sum();
    s.funnel.ordered = buyers(orders.iter());
    s.funnel.paid = buyers(orders.iter().filter(|o| o.status == OrderStatus::Paid));
    s.sold_out_after_ms = sold_out_after(orders, product.initial_qty, product.start_time);
    let result = |r: &str| payments.get(r).map_or(0, |(count, _, _)| *count);
    s.payments.paid = result("paid");
    s.payments.paid_late = result("paid_again");
    s.payments.refund_due = result("refund_due");
    s.payments.failed = result("failed");
    s.payments.amount_mismatch = result("amount_mismatch");
    s.money = money(orders, payments);
    s.books_ok = audit.ok();
    (s.orders, s.confirmed, s.paid, s.cancelled) =
        (audit.orders, audit.confirmed, audit.paid, audit.cancelled);
}

/// Counts into the timeline what only the books know: the units each
/// second gave back (orders cancelled then, by their `updated`) and the
/// units restocks added (`restocks`: `(at, units)`, epoch ms).
pub(super) fn add_to_timeline(
    seconds: &mut Vec<SecondView>,
    orders: &[OrderRow],
    restocks: &[(i64, i64)],
) {
    for o in orders.iter().filter(|o| o.status == OrderStatus::Cancelled) {
        second_at(seconds, o.updated.div_euclid(1000)).returned += o.quantity.max(0) as u64;
    }
    for (at, units) in restocks {
        second_at(seconds, at.div_euclid(1000)).restocked += units;
    }
}

/// The paid orders' value, and what the payment side took, kept or owed.
fn money(orders: &[OrderRow], payments: &HashMap<String, Heard>) -> Money {
    let amount = |r: &str| payments.get(r).map_or(Decimal::ZERO, |(_, a, _)| *a);
    Money {
        currency: payments.values().find_map(|(_, _, c)| c.clone()),
        revenue: (orders.iter())
            .filter(|o| o.status == OrderStatus::Paid)
            .map(|o| o.price * Decimal::from(o.quantity))
            .sum::<Decimal>()
            .normalize(),
        received: (amount("paid") + amount("paid_again")).normalize(),
        refund_due: amount("refund_due").normalize(),
    }
}

/// Distinct buyers of `orders`.
fn buyers<'a>(orders: impl Iterator<Item = &'a OrderRow>) -> u64 {
    orders.map(|o| o.user_id).collect::<HashSet<_>>().len() as u64
}

/// From the start to the order that took the last unit: the books' orders
/// by acceptance (every order counts, a later cancel too: the unit was
/// taken then).
fn sold_out_after(orders: &[OrderRow], initial: i64, start_ms: i64) -> Option<i64> {
    let mut by_time: Vec<(i64, i64)> = orders.iter().map(|o| (o.created, o.quantity)).collect();
    by_time.sort_unstable();
    let mut taken = 0;
    for (at, units) in by_time {
        taken += units;
        if initial > 0 && taken >= initial {
            return Some((at - start_ms).max(0));
        }
    }
    None
}
