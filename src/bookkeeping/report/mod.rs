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
//! The parts: `figures` is what a report holds, `counted` merges what the
//! processes counted, `booked`
//! what the books know, `room` the waiting room's figures, `render` the
//! CSV and the terminal's summary; [`Recorder`] is each process's flush of
//! its timeline into the books, once a second, with the room's readings
//! it has.

mod booked;
mod counted;
mod figures;
mod recorder;
mod render;
mod room;

use std::collections::{HashMap, HashSet};

use self::counted::Counted;
use self::room::RanOut;
use super::audit::Audit;
use super::error::BookkeepingError;
use crate::domain::{ProductId, now_ms};
use crate::metrics::distinct;
use crate::sale::Room;
use crate::store;

pub use self::figures::{
    Funnel, LineWait, Money, PaymentFigures, REFUNDS_LISTED, RefundDue, Report, SecondView, Summary,
};
pub use self::recorder::Recorder;
pub use self::render::{CSV_COLUMNS, SUMMARY_COLUMNS, span, summaries_csv};

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
    pub async fn report(&self, id: &ProductId) -> Result<Report, BookkeepingError> {
        if let Some(kept) = self.seconds.report(id).await?
            && let Ok(mut report) = serde_json::from_str::<Report>(&kept)
        {
            report.seconds.iter_mut().for_each(SecondView::kept);
            return Ok(report);
        }
        self.make(id).await
    }

    /// Makes the report at the sale's retirement and keeps it (the first
    /// one kept stands).
    pub async fn keep(&self, id: &ProductId) -> Result<(), BookkeepingError> {
        if self.seconds.report(id).await?.is_some() {
            return Ok(());
        }
        let mut report = self.make(id).await?;
        report.kept = true;
        let json = |r: &Report| {
            serde_json::to_string(r)
                .map_err(|e| BookkeepingError::Corrupt(format!("a report as JSON: {e}")))
        };
        let text = json(&report)?;
        let summary = json(&report.without_timeline())?;
        self.seconds
            .keep_report(id, (&text, &summary), report.made_ms)
            .await?;
        Ok(())
    }

    /// The kept reports without their timelines (the index of past
    /// sales), newest first, at most `limit`, kept before `before` (epoch
    /// ms) when given.
    pub async fn kept(
        &self,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Report>, BookkeepingError> {
        let mut out = Vec::new();
        for (product, _, summary) in self.seconds.kept_reports(before, limit).await? {
            let text = match summary {
                Some(text) => text,
                // Kept before summaries were: the whole report, once.
                None => match ProductId::parse(&product) {
                    Ok(id) => self.seconds.report(&id).await?.unwrap_or_default(),
                    Err(_) => continue,
                },
            };
            if let Ok(report) = serde_json::from_str::<Report>(&text) {
                out.push(report.without_timeline());
            }
        }
        Ok(out)
    }

    /// Deletes the sale's timeline once its report is kept (the report
    /// holds its seconds); without a kept report it stays. The rows
    /// deleted.
    pub async fn forget_timeline(&self, id: &ProductId) -> Result<u64, BookkeepingError> {
        if self.seconds.report(id).await?.is_none() {
            return Ok(0);
        }
        Ok(self.seconds.forget(id).await?)
    }

    /// The report as the books and the timeline stand now.
    pub async fn make(&self, id: &ProductId) -> Result<Report, BookkeepingError> {
        let product = self
            .products
            .product(id)
            .await?
            .ok_or(BookkeepingError::NoProduct)?;
        let counted = Counted::of(&self.seconds.of(id).await?)?;
        let orders = self.orders.orders_of_product(id).await?;
        let payments: HashMap<String, booked::Heard> = self
            .payments
            .results_of(id)
            .await?
            .into_iter()
            .map(|(result, count, amount, currency)| (result, (count, amount, currency)))
            .collect();
        let audit = self.audit.sale(&product).await?;

        let mut s = counted.summary;
        let mut seconds = counted.seconds;
        booked::fill(&mut s, &product, &orders, &payments, &audit);
        let restocks = self.products.restock_times(id).await?;
        let refunds_due = (self.payments.refunds_due_of(id, REFUNDS_LISTED).await?)
            .into_iter()
            .map(
                |(payment_id, order_id, user_id, amount, currency, received_ms)| RefundDue {
                    payment_id,
                    order_id,
                    user_id,
                    amount: amount.normalize(),
                    currency,
                    received_ms,
                },
            )
            .collect();
        booked::add_to_timeline(&mut seconds, &orders, &restocks);
        // Every buyer who ordered tried: an estimate a little short is
        // raised to them.
        s.funnel.tried = distinct::estimate(&counted.buyers).max(s.funnel.ordered);
        if product.room_ceiling_per_sec.is_some() {
            let joined = counted.joined;
            s.funnel.joined = Some(joined);
            s.funnel.admitted = counted.admitted.map(|l| (l.max(0) as u64).min(joined));
            s.funnel.admitted_unused = s
                .funnel
                .admitted
                .map(|a| a.saturating_sub(s.funnel.ordered));
            let start_s = product.start_time.div_euclid(1000);
            let admitted = room::admitted_at(&seconds, joined, start_s);
            s.wait = room::wait_in_line(&seconds, start_s, &admitted);
            // Which admitted buyers ordered: the room's places (while its
            // keys are there: the report kept at retirement has them).
            if let (Some(places), Some(window)) =
                (self.room.places(id).await?, product.room_admission_secs)
            {
                let ordered: HashSet<u64> = orders.iter().map(|o| o.user_id as u64).collect();
                let now = now_ms().div_euclid(1000);
                let ran_out = RanOut::of(&places, &admitted, &ordered, i64::from(window), now);
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
            pauses: self.products.pauses_of(id).await?,
            refunds_due,
        })
    }
}
