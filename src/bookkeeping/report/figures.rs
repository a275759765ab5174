//! What a report holds: its figures, its funnel, its timeline a second at
//! a time (JSON as the API answers it; the kept report as stored).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A sale's report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub product_id: String,
    pub title: String,
    /// When it was made (epoch ms).
    pub made_ms: i64,
    /// Made at the sale's retirement and kept (false: live, made now).
    pub kept: bool,
    pub start_ms: i64,
    pub end_ms: i64,
    /// The units on sale, restocks counted.
    pub initial_qty: i64,
    pub summary: Summary,
    /// The timeline, a second at a time (only seconds with something).
    pub seconds: Vec<SecondView>,
    /// When the sale was paused and resumed: `(true: paused / false:
    /// resumed, at)` (epoch ms), in order (the charts' marks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pauses: Vec<(bool, i64)>,
    /// The payments owed back, to act on (oldest first, at most
    /// [`REFUNDS_LISTED`]; `summary.payments.refund_due` counts them all).
    #[serde(default)]
    pub refunds_due: Vec<RefundDue>,
}

/// Refunds owed a report lists at most.
pub const REFUNDS_LISTED: u32 = 1000;

/// A payment taken for an order that could not have it (the order was
/// cancelled and its units gone): owed back to the buyer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RefundDue {
    pub payment_id: String,
    pub order_id: String,
    pub user_id: i64,
    pub amount: rust_decimal::Decimal,
    pub currency: String,
    /// When the payment was heard (epoch ms).
    pub received_ms: i64,
}

impl Report {
    /// The report without its seconds: the index's row.
    pub fn without_timeline(&self) -> Report {
        Report {
            product_id: self.product_id.clone(),
            title: self.title.clone(),
            made_ms: self.made_ms,
            kept: self.kept,
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            initial_qty: self.initial_qty,
            summary: self.summary.clone(),
            seconds: Vec::new(),
            pauses: self.pauses.clone(),
            refunds_due: Vec::new(),
        }
    }
}

/// The report's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// From the start to the order that took the last unit (the books'
    /// orders by their acceptance time); `None`: never sold out.
    pub sold_out_after_ms: Option<i64>,
    /// The most orders accepted in one second, and when (epoch s).
    pub peak_accepted_per_sec: u64,
    pub peak_at: Option<i64>,
    /// Orders answered 202 (new, not replays), as the processes counted.
    pub accepted: u64,
    /// Units the books hold sold (confirmed and paid).
    pub units_sold: i64,
    pub funnel: Funnel,
    /// The wait in line, from the room's own numbers; `None` without a room.
    pub wait: Option<LineWait>,
    /// Refused orders by code.
    pub refused: BTreeMap<String, u64>,
    pub payments: PaymentFigures,
    /// The money, as the books hold it (reports kept before it was
    /// reckoned have none).
    #[serde(default)]
    pub money: Money,
    /// The order route's answers for the sale: latency (µs, bucketed).
    pub latency_p50_us: Option<u64>,
    pub latency_p99_us: Option<u64>,
    pub latency_max_us: Option<u64>,
    /// Events delivered to the shop's endpoints (each delivery; a
    /// redelivery after a crash counts again), and given up on.
    pub events_delivered: u64,
    pub events_dead: u64,
    /// Orders the workers persisted, their mean and longest wait (ms).
    pub persisted: u64,
    pub persist_wait_mean_ms: Option<u64>,
    pub persist_wait_max_ms: Option<i64>,
    /// The books' verdict: the audit's checks all hold.
    pub books_ok: bool,
    pub orders: i64,
    pub confirmed: i64,
    pub paid: i64,
    pub cancelled: i64,
}

/// Who went how far.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Funnel {
    /// Order requests answered for the sale (any answer; a buyer may send
    /// many).
    pub requests: u64,
    /// Distinct buyers (verified) who sent them: estimated (HyperLogLog,
    /// all but exact below a few thousand, ~1.6% above).
    #[serde(default)]
    pub tried: u64,
    /// Buyers who joined the room (with a room).
    pub joined: Option<u64>,
    /// Places the room admitted (with a room).
    pub admitted: Option<u64>,
    /// Of them, buyers who did not order: their admission ran out unused
    /// (or has not yet).
    pub admitted_unused: Option<u64>,
    /// Of those, the admissions that have run out (the timeline's
    /// `expired`, second by second).
    #[serde(default)]
    pub expired: Option<u64>,
    /// Buyers with an order in the books.
    pub ordered: u64,
    /// Buyers with a paid order.
    pub paid: u64,
}

/// The wait from joining (or the start, for those who joined before it) to
/// the admission, in whole seconds of the timeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LineWait {
    pub buyers: u64,
    pub p50_ms: i64,
    pub p90_ms: i64,
    pub max_ms: i64,
}

/// Payments by result (the books'), and orders their timeout cancelled
/// (the workers' count).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PaymentFigures {
    pub paid: i64,
    /// Paid after the timeout had cancelled the order, units still there.
    pub paid_late: i64,
    pub refund_due: i64,
    pub failed: i64,
    pub amount_mismatch: i64,
    pub timed_out: u64,
    /// Orders their buyers cancelled (the workers' and instances' count,
    /// once each: a repeated cancel is not counted again).
    pub cancelled_by_buyers: u64,
}

/// One second of the timeline, every process's counts added up.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SecondView {
    /// Epoch seconds.
    pub t: i64,
    pub accepted: u64,
    pub refused: u64,
    pub units: u64,
    pub latency_p50_us: Option<u64>,
    pub latency_p99_us: Option<u64>,
    pub joins: u64,
    /// The places the room had admitted, its pace and its ceiling, as read
    /// that second (carried on).
    #[serde(default)]
    pub admitted: Option<i64>,
    /// `admitted` under its first name: deprecated, written for the
    /// release before (it reads it) and read from the reports it kept
    /// ([`SecondView::kept`]); gone in 0.3.0.
    #[serde(default)]
    pub line: Option<i64>,
    pub pace: Option<i64>,
    pub ceiling: Option<i64>,
    pub persisted: u64,
    pub persist_wait_max_ms: Option<i64>,
    pub paid: u64,
    pub timed_out: u64,
    pub events_delivered: u64,
    /// Admissions that ran out unused this second (with a room).
    #[serde(default)]
    pub expired: u64,
    /// Units given back to the sale this second: the books' orders
    /// cancelled then (by their buyers, their payment timeout or a refund),
    /// by the time of their cancel (left out when 0, as `restocked`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub returned: u64,
    /// Units restocks added this second (taken away: negative), the books'.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restocked: i64,
    /// The refusals this second, by code (`refused` is their sum).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused_by: BTreeMap<String, u64>,
    /// The payments' notifications this second, by result (`paid`,
    /// `paid_again`, `refund_due`, `failed`, `amount_mismatch`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub payments_by: BTreeMap<String, u64>,
}

impl SecondView {
    /// A second of a report kept by the release before: its places
    /// admitted are under their first name only.
    pub(super) fn kept(&mut self) {
        self.admitted = self.admitted.or(self.line);
        self.line = self.admitted;
    }
}

/// A count left out of the JSON when it is 0 (most seconds have none).
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// The timeline's second `t`, added where nothing was counted: the room's
/// readings carried on into it.
pub(super) fn second_at(seconds: &mut Vec<SecondView>, t: i64) -> &mut SecondView {
    let i = match seconds.binary_search_by_key(&t, |s| s.t) {
        Ok(i) => i,
        Err(i) => {
            let before = i.checked_sub(1).map(|b| &seconds[b]);
            let view = SecondView {
                t,
                admitted: before.and_then(|b| b.admitted),
                line: before.and_then(|b| b.admitted),
                pace: before.and_then(|b| b.pace),
                ceiling: before.and_then(|b| b.ceiling),
                ..SecondView::default()
            };
            seconds.insert(i, view);
            i
        }
    };
    &mut seconds[i]
}

/// A sale's money, in its payments' currency (exact: the books' sums).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Money {
    /// The payments' currency (`None`: no payment heard).
    pub currency: Option<String>,
    /// The paid orders' value: their units at the sale's price.
    pub revenue: rust_decimal::Decimal,
    /// What the payment side took for orders that kept it (paid, and paid
    /// late while the order could still be had).
    pub received: rust_decimal::Decimal,
    /// What was taken for orders that could not have it: owed back.
    pub refund_due: rust_decimal::Decimal,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_kept_by_the_release_before_has_its_places_admitted() {
        // The release before wrote the places admitted as `line` only.
        let mut before = serde_json::to_value(SecondView {
            t: 7,
            line: Some(5),
            ..SecondView::default()
        })
        .unwrap();
        before.as_object_mut().unwrap().remove("admitted");
        let mut read: SecondView = serde_json::from_value(before).unwrap();
        read.kept();
        assert_eq!((read.admitted, read.line), (Some(5), Some(5)));
        // This release writes both, under both names.
        let now = serde_json::to_value(&read).unwrap();
        assert_eq!((&now["admitted"], &now["line"]), (&5.into(), &5.into()));
    }
}
