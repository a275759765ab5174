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
//! [`Recorder`] is each process's flush of its timeline into the books,
//! once a second, with the room's readings it has.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::audit::Audit;
use super::error::BooksError;
use crate::domain::{Chain, OrderStatus, ProductId, now_ms};
use crate::metrics::Metrics;
use crate::metrics::distinct;
use crate::metrics::timeline::{self, LATENCY_BUCKETS, Merge};
use crate::sale::Room;
use crate::store::{self, SecondRow};

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

/// One second merged across processes.
#[derive(Default)]
struct Merged {
    counts: HashMap<String, u64>,
    gauges: HashMap<String, i64>,
    latency: Vec<u64>,
}

impl Merged {
    fn add(&mut self, row: &SecondRow) -> Result<(), BooksError> {
        let parse =
            |what: &str, text: &str| BooksError::Corrupt(format!("tb_sale_second {what} {text:?}"));
        let counts: HashMap<String, u64> =
            serde_json::from_str(&row.counts).map_err(|_| parse("counts", &row.counts))?;
        let gauges: HashMap<String, i64> =
            serde_json::from_str(&row.gauges).map_err(|_| parse("gauges", &row.gauges))?;
        let latency: HashMap<String, u64> =
            serde_json::from_str(&row.latency).map_err(|_| parse("latency", &row.latency))?;
        for (k, v) in counts {
            *self.counts.entry(k).or_default() += v;
        }
        for (k, v) in gauges {
            let slot = self.gauges.entry(k.clone()).or_insert(v);
            *slot = match timeline::merge_of(&k) {
                Merge::Max => (*slot).max(v),
                Merge::Sum => *slot + v,
            };
        }
        if !latency.is_empty() && self.latency.is_empty() {
            self.latency = vec![0; LATENCY_BUCKETS];
        }
        for (b, n) in latency {
            if let Some(slot) = b
                .parse::<usize>()
                .ok()
                .and_then(|b| self.latency.get_mut(b))
            {
                *slot += n;
            }
        }
        Ok(())
    }

    fn count(&self, name: &str) -> u64 {
        self.counts.get(name).copied().unwrap_or(0)
    }

    fn refused(&self) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| k.starts_with("refused."))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Raises `registers` to a row's distinct-buyers registers (each its
/// highest: every process's and second's, merged).
fn raise(registers: &mut [u8; distinct::REGISTERS], row: &SecondRow) -> Result<(), BooksError> {
    let raised: HashMap<u16, u8> = serde_json::from_str(&row.buyers)
        .map_err(|_| BooksError::Corrupt(format!("tb_sale_second buyers {:?}", row.buyers)))?;
    for (register, rank) in raised {
        if let Some(slot) = registers.get_mut(usize::from(register)) {
            *slot = (*slot).max(rank);
        }
    }
    Ok(())
}

/// The `q`-quantile (0..1) of a latency histogram, as its bucket's top (µs).
fn quantile(buckets: &[u64], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (b, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(timeline::bucket_upper(b));
        }
    }
    None
}

/// The `q`-quantile of sorted values.
fn pick(sorted: &[i64], q: f64) -> i64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
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

    /// The report as the books and the timeline stand now.
    pub async fn make(&self, id: &ProductId) -> Result<Report, BooksError> {
        let product = self
            .products
            .product(id)
            .await?
            .ok_or(BooksError::NoProduct)?;
        let rows = self.seconds.of(id).await?;
        let mut by_second: BTreeMap<i64, Merged> = BTreeMap::new();
        let mut buyers = [0u8; distinct::REGISTERS];
        for row in &rows {
            by_second.entry(row.second).or_default().add(row)?;
            raise(&mut buyers, row)?;
        }
        let orders = self.orders.orders_of_product(id).await?;
        let payments: HashMap<String, i64> =
            self.payments.results_of(id).await?.into_iter().collect();
        let audit = self.audit.sale(&product).await?;
        let has_room = product.room_admit_per_sec.is_some();

        let mut s = Summary::default();
        let mut latency = vec![0u64; LATENCY_BUCKETS];
        let mut seconds = Vec::with_capacity(by_second.len());
        let (mut line, mut pace, mut ceiling) = (None, None, None);
        for (t, m) in &by_second {
            let accepted = m.count("accepted");
            if accepted > s.peak_accepted_per_sec {
                (s.peak_accepted_per_sec, s.peak_at) = (accepted, Some(*t));
            }
            s.accepted += accepted;
            s.funnel.requests += accepted + m.count("replayed") + m.refused();
            for (k, v) in &m.counts {
                if let Some(code) = k.strip_prefix("refused.") {
                    *s.refused.entry(code.to_owned()).or_default() += v;
                }
            }
            for (l, n) in latency.iter_mut().zip(&m.latency) {
                *l += n;
            }
            s.persisted += m.count("persisted");
            s.events_delivered += m.count("events_delivered");
            s.events_dead += m.count("events_dead");
            s.payments.timed_out += m.count("timed_out");
            s.payments.cancelled_by_buyers += m.count("cancelled");
            let lag = m.gauges.get("persist_lag_max_ms").copied();
            s.persist_wait_max_ms = s.persist_wait_max_ms.max(lag);
            line = m.gauges.get("line").copied().or(line).max(line);
            pace = m.gauges.get("pace").copied().or(pace);
            ceiling = m.gauges.get("ceiling").copied().or(ceiling);
            seconds.push(SecondView {
                t: *t,
                accepted,
                refused: m.refused(),
                units: m.count("units"),
                latency_p50_us: quantile(&m.latency, 0.5),
                latency_p99_us: quantile(&m.latency, 0.99),
                joins: m.count("joins"),
                line,
                pace,
                ceiling,
                persisted: m.count("persisted"),
                persist_wait_max_ms: lag,
                paid: m.count("payment.paid") + m.count("payment.paid_again"),
                timed_out: m.count("timed_out"),
                events_delivered: m.count("events_delivered"),
                expired: 0,
            });
        }
        let waited: u64 = by_second.values().map(|m| m.count("persist_waited")).sum();
        let wait_ms: u64 = by_second.values().map(|m| m.count("persist_wait_ms")).sum();
        s.persist_wait_mean_ms = (waited > 0).then(|| wait_ms / waited);
        s.latency_p50_us = quantile(&latency, 0.5);
        s.latency_p99_us = quantile(&latency, 0.99);
        s.latency_max_us = quantile(&latency, 1.0);

        // From the books.
        let sold =
            |o: &&store::OrderRow| matches!(o.status, OrderStatus::Confirmed | OrderStatus::Paid);
        s.units_sold = orders.iter().filter(sold).map(|o| o.quantity).sum();
        s.funnel.ordered = orders
            .iter()
            .map(|o| o.user_id)
            .collect::<HashSet<_>>()
            .len() as u64;
        // Every buyer who ordered tried: an estimate a little short is
        // raised to them.
        s.funnel.tried = distinct::estimate(&buyers).max(s.funnel.ordered);
        s.funnel.paid = orders
            .iter()
            .filter(|o| o.status == OrderStatus::Paid)
            .map(|o| o.user_id)
            .collect::<HashSet<_>>()
            .len() as u64;
        s.sold_out_after_ms = sold_out_after(&orders, product.initial_qty, product.start_time);
        let result = |r: &str| payments.get(r).copied().unwrap_or(0);
        s.payments.paid = result("paid");
        s.payments.paid_late = result("paid_again");
        s.payments.refund_due = result("refund_due");
        s.payments.failed = result("failed");
        s.payments.amount_mismatch = result("amount_mismatch");
        s.books_ok = audit.ok();
        (s.orders, s.confirmed, s.paid, s.cancelled) =
            (audit.orders, audit.confirmed, audit.paid, audit.cancelled);

        if has_room {
            let joined: u64 = by_second.values().map(|m| m.count("joins")).sum();
            s.funnel.joined = Some(joined);
            s.funnel.admitted = line.map(|l| (l.max(0) as u64).min(joined));
            s.funnel.admitted_unused = s
                .funnel
                .admitted
                .map(|a| a.saturating_sub(s.funnel.ordered));
            s.wait = wait_in_line(&seconds, product.start_time.div_euclid(1000), joined);
            // Which admitted buyers ordered: the room's places (while its
            // keys are there: the report kept at retirement has them).
            if let (Some(places), Some(window)) =
                (self.room.places(id).await?, product.room_admission_secs)
            {
                let ordered: HashSet<u64> = orders.iter().map(|o| o.user_id as u64).collect();
                let ran_out = RanOut::of(&places, &reached(&seconds, joined), &ordered, {
                    (i64::from(window), now_ms().div_euclid(1000))
                });
                s.funnel.admitted_unused = Some(ran_out.unused);
                s.funnel.expired = Some(ran_out.by_second.values().sum());
                add_expired(&mut seconds, &ran_out.by_second);
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

/// From the start to the order that took the last unit: the books' orders
/// by acceptance (every order counts, a later cancel too: the unit was
/// taken then).
fn sold_out_after(orders: &[store::OrderRow], initial: i64, start_ms: i64) -> Option<i64> {
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

/// The wait in line, from the room's numbers a second at a time: the
/// `k`-th place was reached in the first second the line stood at `k` or
/// more; the buyers who joined before the start (drawn at it) waited from
/// the start, the later ones from the second their join was counted (the
/// `n`-th late joiner holds place `early + n`).
fn wait_in_line(seconds: &[SecondView], start_s: i64, joined: u64) -> Option<Wait> {
    let early: u64 = seconds
        .iter()
        .filter(|s| s.t < start_s)
        .map(|s| s.joins)
        .sum();
    let mut joins = Vec::new(); // late joiner n (from 1) -> second
    for s in seconds {
        if s.t >= start_s {
            joins.extend(std::iter::repeat_n(s.t, s.joins as usize));
        }
    }
    let reached = reached(seconds, joined);
    let mut waits: Vec<i64> = reached
        .iter()
        .enumerate()
        .filter_map(|(i, at)| {
            let place = i as u64 + 1;
            let from = if place <= early {
                start_s
            } else {
                *joins.get((place - early - 1) as usize)?
            };
            Some((at - from).max(0) * 1000)
        })
        .collect();
    if waits.is_empty() {
        return None;
    }
    waits.sort_unstable();
    Some(Wait {
        buyers: waits.len() as u64,
        p50_ms: pick(&waits, 0.5),
        p90_ms: pick(&waits, 0.9),
        max_ms: *waits.last().unwrap_or(&0),
    })
}

/// The second the line reached each place (from 1: index 0 is place 1),
/// by the timeline's readings of the line.
fn reached(seconds: &[SecondView], joined: u64) -> Vec<i64> {
    let mut reached = Vec::new();
    let mut line = 0u64;
    for s in seconds {
        if let Some(l) = s.line {
            let l = (l.max(0) as u64).min(joined);
            while line < l {
                line += 1;
                reached.push(s.t);
            }
        }
    }
    reached
}

/// Admissions that ran out unused: of the places the line reached, those
/// whose buyer has no order, each in the second its admission ran out
/// (the second the line reached it, plus the admission's window; a
/// pause's lengthening not counted).
#[derive(Debug, Default, PartialEq)]
struct RanOut {
    /// Admitted buyers without an order (their admission ran out, or has
    /// not yet).
    unused: u64,
    /// Of them, those whose admission ran out, by the second it did.
    by_second: BTreeMap<i64, u64>,
}

impl RanOut {
    /// `places`: `(user, place)` of every buyer with a place; `reached`:
    /// the second each place was reached; `(window, now)`: the
    /// admission's window and the second now.
    fn of(
        places: &[(u64, u64)],
        reached: &[i64],
        ordered: &HashSet<u64>,
        (window, now): (i64, i64),
    ) -> Self {
        let mut out = Self::default();
        for (user, place) in places {
            let Some(at) = place.checked_sub(1).and_then(|i| reached.get(i as usize)) else {
                continue;
            };
            if ordered.contains(user) {
                continue;
            }
            out.unused += 1;
            let ends = at + window;
            if ends < now {
                *out.by_second.entry(ends).or_default() += 1;
            }
        }
        out
    }
}

/// Counts `expired` into the timeline's seconds: a second with nothing
/// else counted is added, the room's readings carried on into it.
fn add_expired(seconds: &mut Vec<SecondView>, expired: &BTreeMap<i64, u64>) {
    for (t, n) in expired {
        match seconds.binary_search_by_key(t, |s| s.t) {
            Ok(i) => seconds[i].expired += n,
            Err(i) => {
                let before = i.checked_sub(1).map(|b| &seconds[b]);
                let view = SecondView {
                    t: *t,
                    expired: *n,
                    line: before.and_then(|b| b.line),
                    pace: before.and_then(|b| b.pace),
                    ceiling: before.and_then(|b| b.ceiling),
                    ..SecondView::default()
                };
                seconds.insert(i, view);
            }
        }
    }
}

impl Report {
    /// The timeline as CSV, a row per second.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "second,accepted,refused,units,latency_p50_us,latency_p99_us,joins,line,pace,ceiling,persisted,persist_wait_max_ms,paid,timed_out,events_delivered,expired\n",
        );
        let opt = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
        let optu = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        for s in &self.seconds {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                s.t,
                s.accepted,
                s.refused,
                s.units,
                optu(s.latency_p50_us),
                optu(s.latency_p99_us),
                s.joins,
                opt(s.line),
                opt(s.pace),
                opt(s.ceiling),
                s.persisted,
                opt(s.persist_wait_max_ms),
                s.paid,
                s.timed_out,
                s.events_delivered,
                s.expired
            ));
        }
        out
    }

    /// The summary for a terminal (`flashsale report`).
    pub fn text(&self) -> String {
        let s = &self.summary;
        let ms =
            |v: Option<i64>| v.map_or("-".to_owned(), |v| format!("{:.1} s", v as f64 / 1000.0));
        let us =
            |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{:.1} ms", v as f64 / 1000.0));
        let mut out = format!(
            "{} ({}){}\n",
            self.product_id,
            self.title,
            if self.kept {
                ", kept at retirement"
            } else {
                ", live"
            }
        );
        out.push_str(&format!(
            "  sold out after {}; peak {} accepted/s; {} accepted, {} of {} units sold\n",
            ms(s.sold_out_after_ms),
            s.peak_accepted_per_sec,
            s.accepted,
            s.units_sold,
            self.initial_qty
        ));
        let f = &s.funnel;
        out.push_str(&format!(
            "  funnel: {} requests from {} buyers{}{}{}, {} buyers ordered, {} paid\n",
            f.requests,
            f.tried,
            f.joined.map_or(String::new(), |j| format!(", {j} joined")),
            f.admitted
                .map_or(String::new(), |a| format!(", {a} admitted")),
            f.expired
                .map_or(String::new(), |e| format!(" ({e} ran out unused)")),
            f.ordered,
            f.paid
        ));
        if let Some(w) = &s.wait {
            out.push_str(&format!(
                "  wait in line: p50 {}, p90 {}, max {} ({} buyers)\n",
                ms(Some(w.p50_ms)),
                ms(Some(w.p90_ms)),
                ms(Some(w.max_ms)),
                w.buyers
            ));
        }
        let refused: Vec<String> = s.refused.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push_str(&format!(
            "  refused: {}\n",
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(", ")
            }
        ));
        let p = &s.payments;
        out.push_str(&format!(
            "  payments: {} paid, {} paid late, {} refund due, {} failed, {} amount mismatch; {} timed out, {} cancelled by buyers\n",
            p.paid, p.paid_late, p.refund_due, p.failed, p.amount_mismatch, p.timed_out, p.cancelled_by_buyers
        ));
        out.push_str(&format!(
            "  order latency: p50 {}, p99 {}; persisted {} (mean wait {}, max {})\n",
            us(s.latency_p50_us),
            us(s.latency_p99_us),
            s.persisted,
            ms(s.persist_wait_mean_ms.map(|v| v as i64)),
            ms(s.persist_wait_max_ms)
        ));
        out.push_str(&format!(
            "  events: {} delivered, {} given up\n",
            s.events_delivered, s.events_dead
        ));
        out.push_str(&format!(
            "  books: {} ({} orders: {} confirmed, {} paid, {} cancelled)\n",
            if s.books_ok { "balanced" } else { "MISMATCH" },
            s.orders,
            s.confirmed,
            s.paid,
            s.cancelled
        ));
        out
    }
}

/// How often a process writes its timeline.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Seconds a process keeps while the books do not take them (then the
/// oldest go, said in the log): ten minutes of a sale's.
const KEPT_WHILE_UNWRITTEN: usize = 600;

/// A process's flush of its timelines into the books, with the room's
/// readings it holds (each second).
pub struct Recorder {
    pub metrics: Arc<Metrics>,
    pub seconds: store::Seconds,
    pub room: Option<Room>,
    /// This process's name in the rows (drawn at start).
    pub source: String,
}

impl Recorder {
    pub fn source_name() -> String {
        let mut bytes = [0u8; 4];
        let _ = getrandom::fill(&mut bytes);
        format!("{}-{}", std::process::id(), crate::domain::hex(&bytes))
    }

    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => {
                    // What is counted so far, this second included.
                    self.flush(i64::MAX).await;
                    return;
                }
            }
            self.sample_rooms();
            self.flush(self.metrics.timeline.now_s()).await;
        }
    }

    /// The room's line, pace and ceiling as this process last read them.
    fn sample_rooms(&self) {
        let Some(room) = &self.room else { return };
        let timeline = &self.metrics.timeline;
        for (product, r) in room.readings() {
            let p = product.as_str();
            timeline.gauge(p, "line", r.admitted_places() as i64);
            timeline.gauge(p, "pace", r.pace.round() as i64);
            timeline.gauge(p, "ceiling", i64::from(r.ceiling));
            timeline.gauge(p, "joined", r.joined() as i64);
        }
    }

    async fn flush(&self, before: i64) {
        let timeline = &self.metrics.timeline;
        let mut taken = timeline.take_settled(before);
        if taken.is_empty() {
            return;
        }
        if let Err(e) = self.seconds.write(&self.source, &taken).await {
            tracing::warn!(error = %Chain(&e), seconds = taken.len(), "the sales' timelines not written yet; kept for the next try");
            if taken.len() > KEPT_WHILE_UNWRITTEN {
                let dropped = taken.len() - KEPT_WHILE_UNWRITTEN;
                taken.drain(..dropped);
                tracing::warn!(
                    dropped,
                    "the sales' oldest timeline seconds dropped while the books are away"
                );
            }
            timeline.put_back(taken);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t: i64, line: Option<i64>) -> SecondView {
        SecondView {
            t,
            line,
            ..SecondView::default()
        }
    }

    #[test]
    fn an_admission_runs_out_unused_in_the_second_its_window_ends() {
        // The line reached places 1-2 at 100, 3-4 at 102 (and no further).
        let seconds = [
            second(100, Some(2)),
            second(101, None),
            second(102, Some(4)),
        ];
        let reached = reached(&seconds, 10);
        assert_eq!(reached, [100, 100, 102, 102]);
        // Buyers 7 (place 1) and 9 (place 3) ordered; 8 (2) and 5 (4) did
        // not; 6 (place 5) was never admitted.
        let places = [(7, 1), (8, 2), (9, 3), (5, 4), (6, 5)];
        let ordered: HashSet<u64> = [7, 9].into();
        let at = |now| RanOut::of(&places, &reached, &ordered, (3, now));
        assert_eq!(
            at(104),
            RanOut {
                unused: 2,
                by_second: [(103, 1)].into()
            },
            "place 4's runs out at 105"
        );
        assert_eq!(at(200).by_second, [(103, 1), (105, 1)].into());

        // Counted into the timeline: a second without a row gets one.
        let mut timeline = seconds.to_vec();
        add_expired(&mut timeline, &at(200).by_second);
        let got: Vec<(i64, u64, Option<i64>)> =
            timeline.iter().map(|s| (s.t, s.expired, s.line)).collect();
        assert_eq!(
            got,
            [
                (100, 0, Some(2)),
                (101, 0, None),
                (102, 0, Some(4)),
                (103, 1, Some(4)),
                (105, 1, Some(4))
            ]
        );
    }
}
