//! A sale's report: how it went, from its timeline (what every process
//! counted per second, `store::Seconds`) and its books (orders, payments,
//! the audit's verdict). Live while the sale runs; made once more and kept
//! when it retires (`tb_sale_report`), so it outlives the sale's Redis keys.
//!
//! What each figure means and how exact it is: docs/report.md. In short,
//! what the books know is exact (orders, buyers, units, payments by
//! result, the verdict); the rest is counted by the processes, a second at
//! a time (a process that crashed loses its last second or two), and the
//! latency is bucketed (to within 19%).
//!
//! The parts: `counted` merges what the processes counted, `booked`
//! what the books know, `room` the waiting room's figures, `render` the
//! CSV and the terminal's summary; [`Recorder`] is each process's flush of
//! its timeline into the books, once a second, with the room's readings
//! it has.

mod booked;
mod counted;
mod recorder;
mod render;
mod room;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use self::counted::Counted;
use self::room::RanOut;
use super::audit::Audit;
use super::error::BooksError;
use crate::domain::{ProductId, now_ms};
use crate::metrics::distinct;
use crate::sale::Room;
use crate::store;

pub use self::recorder::Recorder;
pub use self::render::CSV_COLUMNS;

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
    pub wait: Option<Wait>,
    /// Refused orders by code.
    pub refused: BTreeMap<String, u64>,
    pub payments: PaymentFigures,
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
    /// Places the line reached: buyers admitted (with a room).
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
pub struct Wait {
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
    /// The room's line, pace and ceiling as read that second (carried on).
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
}

/// The report's handle: what it reads.
#[derive(Clone)]
pub struct Reports {
    /// The rooms' places (which admitted buyers ordered).
    room: Room,
    seconds: store::Seconds,
    products: store::Products,
    orders: store::Orders,
    payments: store::Payments,
    audit: Audit,
}

impl Reports {
    pub fn new(
        audit: Audit,
        room: Room,
        (seconds, products, orders, payments): (
            store::Seconds,
            store::Products,
            store::Orders,
            store::Payments,
        ),
    ) -> Self {
        Self {
            room,
            seconds,
            products,
            orders,
            payments,
            audit,
        }
    }

    /// The sale's report: the one kept at its retirement, or made now.
    pub async fn report(&self, id: &ProductId) -> Result<Report, BooksError> {
        if let Some(kept) = self.seconds.report(id).await?
            && let Ok(report) = serde_json::from_str::<Report>(&kept)
        {
            return Ok(report);
        }
        self.make(id).await
    }

    /// Makes the report at the sale's retirement and keeps it (the first
    /// one kept stands).
    pub async fn keep(&self, id: &ProductId) -> Result<(), BooksError> {
        if self.seconds.report(id).await?.is_some() {
            return Ok(());
        }
        let mut report = self.make(id).await?;
        report.kept = true;
        let text = serde_json::to_string(&report)
            .map_err(|e| BooksError::Corrupt(format!("a report as JSON: {e}")))?;
        self.seconds.keep_report(id, &text, report.made_ms).await?;
        Ok(())
    }

    /// Deletes the sale's timeline once its report is kept (the report
    /// holds its seconds); without a kept report it stays. The rows
    /// deleted.
    pub async fn forget_timeline(&self, id: &ProductId) -> Result<u64, BooksError> {
        if self.seconds.report(id).await?.is_none() {
            return Ok(0);
        }
        Ok(self.seconds.forget(id).await?)
    }

    /// The report as the books and the timeline stand now.
    pub async fn make(&self, id: &ProductId) -> Result<Report, BooksError> {
        let product = self
            .products
            .product(id)
            .await?
            .ok_or(BooksError::NoProduct)?;
        let counted = Counted::of(&self.seconds.of(id).await?)?;
        let orders = self.orders.orders_of_product(id).await?;
        let payments: HashMap<String, i64> =
            self.payments.results_of(id).await?.into_iter().collect();
        let audit = self.audit.sale(&product).await?;

        let mut s = counted.summary;
        let mut seconds = counted.seconds;
        booked::fill(&mut s, &product, &orders, &payments, &audit);
        // Every buyer who ordered tried: an estimate a little short is
        // raised to them.
        s.funnel.tried = distinct::estimate(&counted.buyers).max(s.funnel.ordered);
        if product.room_admit_per_sec.is_some() {
            let joined = counted.joined;
            s.funnel.joined = Some(joined);
            s.funnel.admitted = counted.line.map(|l| (l.max(0) as u64).min(joined));
            s.funnel.admitted_unused = s
                .funnel
                .admitted
                .map(|a| a.saturating_sub(s.funnel.ordered));
            let reached = room::reached(&seconds, joined);
            s.wait = room::wait_in_line(&seconds, product.start_time.div_euclid(1000), &reached);
            // Which admitted buyers ordered: the room's places (while its
            // keys are there: the report kept at retirement has them).
            if let (Some(places), Some(window)) =
                (self.room.places(id).await?, product.room_admission_secs)
            {
                let ordered: HashSet<u64> = orders.iter().map(|o| o.user_id as u64).collect();
                let now = now_ms().div_euclid(1000);
                let ran_out = RanOut::of(&places, &reached, &ordered, (i64::from(window), now));
                s.funnel.admitted_unused = Some(ran_out.unused);
                s.funnel.expired = Some(ran_out.by_second.values().sum());
                room::add_expired(&mut seconds, &ran_out.by_second);
            }
        }
        Ok(Report {
            product_id: product.product_id.clone(),
            title: product.title.clone(),
            made_ms: now_ms(),
            kept: false,
            start_ms: product.start_time,
            end_ms: product.end_time,
            initial_qty: product.initial_qty,
            summary: s,
            seconds,
        })
    }
}
