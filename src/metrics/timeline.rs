//! A sale's timeline, as this process saw it: per second (by this
//! process's clock), what it counted for the sale (orders accepted and
//! refused by code, units, joins, orders persisted and how long they
//! waited, payments by result, cancels, timeouts), the room's readings (the
//! places admitted, the pace, its ceiling, buyers joined) and the order route's
//! latency (bucketed: four buckets an octave, to within 19%).
//!
//! Counted in memory where the metrics are counted (no Redis call, no
//! lock but the sale's own, uncontended but for its second's counters);
//! each second, once over, is taken by the process's flush
//! (`store::Seconds`: a row per sale, second and process, written with
//! its values, so a write tried again counts nothing twice) and the
//! report sums the processes' rows (`bookkeeping::report`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use super::distinct;
use crate::domain::PaymentResult;
use crate::domain::answer::Outcome;

/// This process's clock for its timelines: epoch milliseconds read once,
/// at start, and the monotonic clock since (the order path times its
/// answers with an `Instant` already: turning that into a second is a
/// subtraction, where reading the wall clock again was a call).
#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    start_ms: i64,
}

impl Clock {
    fn new() -> Self {
        let start_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Self {
            start: Instant::now(),
            start_ms,
        }
    }

    /// Epoch seconds at `at`.
    fn second_of(&self, at: Instant) -> i64 {
        let since = at.saturating_duration_since(self.start).as_millis() as i64;
        (self.start_ms + since).div_euclid(1000)
    }

    /// When second `s` (epoch s) is over, by the monotonic clock.
    fn end_of(&self, s: i64) -> Instant {
        let ms = ((s + 1) * 1000 - self.start_ms).max(0) as u64;
        self.start + std::time::Duration::from_millis(ms)
    }
}

/// An answer of the order route: its outcome, the units it took, when it
/// was answered and how long it took (the route's own timing: no clock
/// read here).
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub outcome: Outcome,
    pub units: u64,
    pub at: Instant,
    pub micros: u64,
}

/// Buckets of the latency histogram: four an octave from 1 µs, to ~68 s.
pub const LATENCY_BUCKETS: usize = 4 * 26;

/// A figure a process counts for a sale, second by second. What it is
/// written under in the books ([`Count::name`]) is what the report reads
/// back: one definition. The processes' counts of a second add up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Units new orders took (the order route).
    Units,
    /// Buyers who joined the waiting room.
    Joins,
    /// Orders a worker persisted into the books.
    Persisted,
    /// The persisted orders' waits from acceptance (ms, summed), and how
    /// many were timed.
    PersistWaitMs,
    PersistWaited,
    /// Orders their payment timeout cancelled.
    TimedOut,
    /// Orders their buyers cancelled.
    Cancelled,
    /// Events delivered to the shop, and given up on.
    EventsDelivered,
    EventsDead,
    /// Payment notifications heard, by result.
    Payment(PaymentResult),
}

/// The names of [`Count::Payment`] start so; the report lists them by it.
pub const PAYMENT_PREFIX: &str = "payment.";

impl Count {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Units => "units",
            Self::Joins => "joins",
            Self::Persisted => "persisted",
            Self::PersistWaitMs => "persist_wait_ms",
            Self::PersistWaited => "persist_waited",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::EventsDelivered => "events_delivered",
            Self::EventsDead => "events_dead",
            Self::Payment(result) => match result {
                PaymentResult::Paid => "payment.paid",
                PaymentResult::PaidAgain => "payment.paid_again",
                PaymentResult::RefundDue => "payment.refund_due",
                PaymentResult::AmountMismatch => "payment.amount_mismatch",
                PaymentResult::Failed => "payment.failed",
                PaymentResult::Refunded => "payment.refunded",
                PaymentResult::RefundSettled => "payment.refund_settled",
                PaymentResult::Unmatched => "payment.unmatched",
            },
        }
    }
}

/// A reading a process takes for a sale: the highest of a second stands,
/// across processes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// The places the waiting room has admitted so far.
    Admitted,
    /// The room's pace now, and the operator's ceiling (buyers a second).
    Pace,
    Ceiling,
    /// Buyers who joined the room so far.
    Joined,
    /// The longest accept-to-persist wait of a batch (ms).
    PersistLagMaxMs,
}

impl Gauge {
    /// The name it is written under. [`Gauge::Admitted`] keeps its first
    /// name, `line`, which the release before reads; the next release
    /// writes it as [`Gauge::later_name`], which this one reads too.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Admitted => "line",
            Self::Pace => "pace",
            Self::Ceiling => "ceiling",
            Self::Joined => "joined",
            Self::PersistLagMaxMs => "persist_lag_max_ms",
        }
    }

    /// The name the next release writes it under, when it is renamed.
    pub const fn later_name(self) -> Option<&'static str> {
        match self {
            Self::Admitted => Some("admitted"),
            Self::Pace | Self::Ceiling | Self::Joined | Self::PersistLagMaxMs => None,
        }
    }
}

/// One second of one sale, as this process counted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Second {
    /// Epoch seconds.
    pub second: i64,
    /// Counted figures.
    pub counts: Vec<(Count, u64)>,
    /// The order route's answers, by outcome (written under
    /// [`Outcome::timeline_name`]).
    pub answers: Vec<(Outcome, u64)>,
    /// Readings: the highest this second.
    pub gauges: Vec<(Gauge, i64)>,
    /// The order route's answers by latency bucket ([`bucket`]).
    pub latency: Vec<u32>,
    /// The distinct-buyers registers this second raised, with their new
    /// rank ([`distinct`]): merged, every second's and process's, they
    /// count the buyers who tried.
    pub buyers: Vec<(u16, u8)>,
}

impl Second {
    fn new(second: i64) -> Self {
        Self {
            second,
            counts: Vec::new(),
            answers: Vec::new(),
            gauges: Vec::new(),
            latency: Vec::new(),
            buyers: Vec::new(),
        }
    }

    fn count(&mut self, what: Count, n: u64) {
        add(&mut self.counts, what, n);
    }

    fn gauge(&mut self, what: Gauge, value: i64) {
        match self.gauges.iter_mut().find(|(k, _)| *k == what) {
            Some((_, v)) => *v = (*v).max(value),
            None => self.gauges.push((what, value)),
        }
    }

    fn latency(&mut self, micros: u64) {
        if self.latency.is_empty() {
            self.latency = vec![0; LATENCY_BUCKETS];
        }
        self.latency[bucket(micros)] += 1;
    }
}

/// Adds `n` to `what` in `to`. A few figures a second: a scan beats
/// hashing.
fn add<K: PartialEq>(to: &mut Vec<(K, u64)>, what: K, n: u64) {
    match to.iter_mut().find(|(k, _)| *k == what) {
        Some((_, v)) => *v += n,
        None => to.push((what, n)),
    }
}

/// The latency bucket of `micros`: four an octave (`4·log2`, by the top
/// three bits), the last one open.
pub fn bucket(micros: u64) -> usize {
    if micros < 4 {
        return micros as usize;
    }
    let octave = 63 - micros.leading_zeros() as usize;
    let quarter = ((micros >> (octave - 2)) & 3) as usize;
    (4 * octave + quarter - 4).min(LATENCY_BUCKETS - 1)
}

/// The upper bound (µs) of latency bucket `b`.
pub fn bucket_upper(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (octave, quarter) = ((b + 4) / 4, (b + 4) % 4);
    ((4 + quarter as u64 + 1) << (octave - 2)) - 1
}

/// This process's timelines, by sale (foldhash: std's SipHash was half of
/// what counting an order cost, BENCHMARKS.md "What does the report cost?").
pub struct Timeline {
    sales: RwLock<HashMap<String, SaleSeconds, foldhash::fast::RandomState>>,
    clock: Clock,
}

impl Default for Timeline {
    fn default() -> Self {
        Self {
            sales: RwLock::default(),
            clock: Clock::new(),
        }
    }
}

/// Seconds a sale with nothing counted is kept after its last second taken.
const IDLE_SECS: i64 = 10;

/// What this process holds of a sale.
type SaleSeconds = Mutex<SaleCounts>;

/// A sale's seconds not yet written, and the buyers seen.
struct SaleCounts {
    /// Oldest first.
    seconds: VecDeque<Second>,
    /// The distinct-buyers registers (each its highest rank) since this
    /// entry was made: only a raise is written.
    buyers: Box<[u8; distinct::REGISTERS]>,
    /// When the newest second an order was counted in is over: an order
    /// answered before then is counted there without reckoning its second
    /// (a comparison, where the reckoning was a subtraction and a division).
    until: Option<Instant>,
    /// The first second the flush has not taken: a count for an earlier
    /// one (answered before the flush, counted after it) goes here, since
    /// a second is written with its values and written again would lose
    /// what it had.
    untaken: i64,
}

impl Default for SaleCounts {
    fn default() -> Self {
        Self {
            seconds: VecDeque::new(),
            buyers: Box::new([0; distinct::REGISTERS]),
            until: None,
            untaken: i64::MIN,
        }
    }
}

impl SaleCounts {
    /// The second `now` (or the first one not taken), begun if it is new.
    fn second(&mut self, now: i64) -> &mut Second {
        let now = now.max(self.untaken);
        if self.seconds.back().is_none_or(|s| s.second < now) {
            self.seconds.push_back(Second::new(now));
        }
        // A second the flush already took gets nothing more: the newest
        // one is as late as `now`, or later.
        self.seconds
            .back_mut()
            .unwrap_or_else(|| unreachable!("a second was just pushed"))
    }
}

impl SaleCounts {
    /// Second `at` itself, begun in its place if it is new (`None`: the
    /// flush took it).
    fn exactly(&mut self, at: i64) -> Option<&mut Second> {
        if at < self.untaken {
            return None;
        }
        let i = match self.seconds.binary_search_by_key(&at, |s| s.second) {
            Ok(i) => i,
            Err(i) => {
                if i == self.seconds.len() {
                    // An order counted next reckons its second anew (not
                    // this one's, if it was answered before).
                    self.until = None;
                }
                self.seconds.insert(i, Second::new(at));
                i
            }
        };
        self.seconds.get_mut(i)
    }
}

impl Timeline {
    /// Epoch seconds now, by the timelines' clock (the flush's `before`).
    pub fn now_s(&self) -> i64 {
        self.clock.second_of(Instant::now())
    }

    /// The sale's second now (taken under the sale's lock, so that a second
    /// the flush took gets nothing more). A sale seen before is counted
    /// under the table's read lock, with no reference taken.
    fn with_now(&self, product: &str, f: impl FnOnce(&mut Second)) {
        self.at(product, self.clock.second_of(Instant::now()), f);
    }

    /// The sale's second `now` (epoch s), as `with_now`.
    fn at(&self, product: &str, now: i64, f: impl FnOnce(&mut Second)) {
        self.sale_at(product, |sale| f(sale.second(now)));
    }

    /// The sale's counts, under its lock, with the table locked the while:
    /// a sale new to the table is counted under its write lock, so the
    /// flush (which drops the sales it emptied under that lock) never
    /// drops an entry between its making and its first count.
    fn sale_at(&self, product: &str, add: impl FnOnce(&mut SaleCounts)) {
        {
            let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
            if let Some(sale) = sales.get(product) {
                add(&mut sale.lock().unwrap_or_else(|e| e.into_inner()));
                return;
            }
        }
        let mut sales = self.sales.write().unwrap_or_else(|e| e.into_inner());
        let sale = sales.entry(product.to_owned()).or_default();
        add(sale.get_mut().unwrap_or_else(|e| e.into_inner()));
    }

    /// Readings for the sale in the second of `at` (the highest of each
    /// stands), or nowhere when the flush has taken that second: a later
    /// second would date them wrong.
    pub fn gauges_at(&self, product: &str, at: Instant, readings: &[(Gauge, i64)]) {
        let second = self.clock.second_of(at);
        self.sale_at(product, |sale| {
            if let Some(s) = sale.exactly(second) {
                for (what, value) in readings {
                    s.gauge(*what, *value);
                }
            }
        });
    }

    /// Counts `n` of `what` for the sale this second.
    pub fn count(&self, product: &str, what: Count, n: u64) {
        if n > 0 {
            self.with_now(product, |s| s.count(what, n));
        }
    }

    /// A reading of `what` for the sale this second (the highest stands).
    pub fn gauge(&self, product: &str, what: Gauge, value: i64) {
        self.with_now(product, |s| s.gauge(what, value));
    }

    /// An answer of the order route to `buyer` (verified) for the sale.
    pub fn order(&self, product: &str, buyer: u64, answer: Answered) {
        self.sale_at(product, |sale| {
            let (register, rank) = distinct::place(buyer);
            let seen = &mut sale.buyers[usize::from(register)];
            let raised = *seen < rank;
            if raised {
                *seen = rank;
            }
            let s = match sale.until {
                Some(until) if answer.at < until && !sale.seconds.is_empty() => sale
                    .seconds
                    .back_mut()
                    .unwrap_or_else(|| unreachable!("not empty")),
                _ => {
                    let now = self.clock.second_of(answer.at);
                    sale.until = Some(self.clock.end_of(now));
                    sale.second(now)
                }
            };
            if raised {
                s.buyers.push((register, rank));
            }
            add(&mut s.answers, answer.outcome, 1);
            if answer.units > 0 {
                s.count(Count::Units, answer.units);
            }
            s.latency(answer.micros);
        });
    }

    /// The seconds over (before `before`, epoch s), taken out to be written.
    pub fn take_settled(&self, before: i64) -> Vec<(String, Second)> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (product, sale) in sales.iter() {
            let sale = &mut *sale.lock().unwrap_or_else(|e| e.into_inner());
            while sale.seconds.front().is_some_and(|s| s.second < before) {
                if let Some(s) = sale.seconds.pop_front() {
                    sale.untaken = sale.untaken.max(s.second + 1);
                    out.push((product.clone(), s));
                }
            }
        }
        drop(sales);
        // Sales with nothing left and nothing new for a while go (a
        // retired sale's): by then no count answered before a taken
        // second was over is still on its way.
        let idle = before.saturating_sub(IDLE_SECS);
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| {
                let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
                !s.seconds.is_empty() || s.untaken > idle
            });
        out
    }

    /// Seconds a write did not take, back for the next flush.
    pub fn put_back(&self, seconds: Vec<(String, Second)>) {
        for (product, second) in seconds.into_iter().rev() {
            self.sale_at(&product, |sale| sale.seconds.push_front(second));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_count_for_a_second_taken_goes_to_the_next_one() {
        let t = Timeline::default();
        let units = |taken: Vec<(String, Second)>| -> Vec<(i64, u64)> {
            taken
                .iter()
                .map(|(_, s)| (s.second, s.counts.iter().map(|(_, n)| n).sum()))
                .collect()
        };
        t.at("sku-1", 100, |s| s.count(Count::Units, 5));
        assert_eq!(units(t.take_settled(101)), [(100, 5)]);
        // Answered in second 100, counted once the flush took it: written
        // again, 100's row would say 1 where it said 5.
        t.at("sku-1", 100, |s| s.count(Count::Units, 1));
        t.at("sku-1", 102, |s| s.count(Count::Units, 2));
        assert_eq!(units(t.take_settled(103)), [(101, 1), (102, 2)]);
        // Idle a while, the sale's entry goes; a new count begins anew.
        assert!(t.take_settled(103 + IDLE_SECS).is_empty());
        assert!(t.sales.read().unwrap().is_empty());
    }

    #[test]
    fn a_reading_is_dated_by_when_it_was_read_not_when_it_was_sampled() {
        let t = Timeline::default();
        let p = "sku-1";
        // "Now" a while after the timeline's clock began.
        let now = Instant::now() + Duration::from_secs(10);
        let second = t.clock.second_of(now);
        let admitted = |taken: &[(String, Second)]| -> Vec<(i64, i64)> {
            taken
                .iter()
                .filter_map(|(_, s)| {
                    Some((
                        s.second,
                        *s.gauges
                            .iter()
                            .find(|(n, _)| *n == Gauge::Admitted)
                            .map(|(_, v)| v)?,
                    ))
                })
                .collect()
        };
        // Read 3 s ago and 1 s ago, sampled now (each twice: every tick
        // while fresh): each in its own second, not this one.
        for _ in 0..2 {
            t.gauges_at(p, now - Duration::from_secs(3), &[(Gauge::Admitted, 10)]);
            t.gauges_at(p, now - Duration::from_secs(1), &[(Gauge::Admitted, 14)]);
        }
        t.gauges_at(p, now, &[(Gauge::Admitted, 15)]);
        let taken = t.take_settled(second + 1);
        assert_eq!(
            admitted(&taken),
            [(second - 3, 10), (second - 1, 14), (second, 15)]
        );
        // A reading of a second the flush took goes nowhere (later, it
        // would say nothing was admitted until then).
        t.gauges_at(p, now - Duration::from_secs(2), &[(Gauge::Admitted, 12)]);
        assert!(t.take_settled(i64::MAX).is_empty());
    }

    #[test]
    fn a_count_racing_the_flush_is_never_lost() {
        // Each count makes its sale's entry anew (a new name, or one the
        // flush just emptied and dropped) while a flush takes every second
        // and drops the sales it emptied.
        let t = Timeline::default();
        let (writers, each) = (3, 20_000u64);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let taken = std::thread::scope(|scope| {
            for w in 0..writers {
                let (t, done) = (&t, &done);
                scope.spawn(move || {
                    for i in 0..each {
                        t.count(&format!("sku-{w}-{}", i % 7), Count::Units, 1);
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            let mut taken = 0u64;
            let units = |seconds: Vec<(String, Second)>| -> u64 {
                seconds
                    .iter()
                    .flat_map(|(_, s)| s.counts.iter())
                    .map(|(_, n)| n)
                    .sum()
            };
            while done.load(std::sync::atomic::Ordering::SeqCst) < writers {
                taken += units(t.take_settled(i64::MAX));
            }
            taken + units(t.take_settled(i64::MAX))
        });
        assert_eq!(taken, writers as u64 * each);
    }

    #[test]
    fn latency_buckets_are_a_quarter_octave_and_ordered() {
        let mut last = 0;
        for micros in 1..200_000u64 {
            let b = bucket(micros);
            assert!(b >= last, "{micros}");
            assert!(micros <= bucket_upper(b), "{micros} in {b}");
            if b > 0 {
                assert!(micros > bucket_upper(b - 1), "{micros} in {b}");
            }
            last = b;
        }
        // Within 25% of its bucket's top above the first octaves.
        assert_eq!(bucket_upper(bucket(1_000)), 1_023);
        assert_eq!(bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    /// Each figure has a name of its own, the one the report reads back.
    #[test]
    fn every_figure_has_its_own_name() {
        use PaymentResult as P;
        let payments = [
            P::Paid,
            P::PaidAgain,
            P::RefundDue,
            P::AmountMismatch,
            P::Failed,
            P::Refunded,
            P::RefundSettled,
            P::Unmatched,
        ];
        let mut names: Vec<&str> = [
            Count::Units,
            Count::Joins,
            Count::Persisted,
            Count::PersistWaitMs,
            Count::PersistWaited,
            Count::TimedOut,
            Count::Cancelled,
            Count::EventsDelivered,
            Count::EventsDead,
        ]
        .into_iter()
        .chain(payments.map(Count::Payment))
        .map(Count::name)
        .chain(Outcome::all().map(Outcome::timeline_name))
        .collect();
        for p in payments {
            assert!(Count::Payment(p).name().starts_with(PAYMENT_PREFIX));
        }
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "two figures share a name");
    }

    #[test]
    fn a_second_once_over_is_taken_once_and_counts_add() {
        let t = Timeline::default();
        let p = "sku-1";
        let answer = |outcome, units, micros| Answered {
            outcome,
            units,
            at: Instant::now(),
            micros,
        };
        let sold_out = Outcome::Refused(crate::domain::answer::Code::SoldOut);
        t.order(p, 7, answer(Outcome::Accepted, 2, 800));
        t.order(p, 7, answer(sold_out, 0, 50));
        t.order(p, 8, answer(sold_out, 0, 50));
        t.count(p, Count::Joins, 3);
        t.gauge(p, Gauge::Admitted, 5);
        t.gauge(p, Gauge::Admitted, 4);
        assert!(t.take_settled(0).is_empty(), "not over yet");
        let now = t.now_s();
        let taken = t.take_settled(now + 2);
        assert!(!taken.is_empty());
        let counts: u64 = taken
            .iter()
            .flat_map(|(_, s)| s.counts.iter())
            .filter(|(k, _)| *k == Count::Units)
            .map(|(_, v)| v)
            .sum();
        assert_eq!(counts, 2);
        let answers: u64 = taken
            .iter()
            .flat_map(|(_, s)| s.answers.iter())
            .filter(|(o, _)| *o == sold_out)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(answers, 2);
        let admitted = taken
            .iter()
            .flat_map(|(_, s)| s.gauges.iter())
            .find(|(k, _)| *k == Gauge::Admitted)
            .map(|(_, v)| *v);
        assert_eq!(admitted, Some(5));
        // Each buyer raised its register once: two buyers, two raises.
        let raised: Vec<_> = taken.iter().flat_map(|(_, s)| s.buyers.clone()).collect();
        assert_eq!(raised.len(), 2, "{raised:?}");
        assert!(raised.contains(&distinct::place(7)) && raised.contains(&distinct::place(8)));
        assert!(t.take_settled(now + 2).is_empty(), "taken once");
        t.put_back(taken);
        assert!(!t.take_settled(now + 2).is_empty(), "put back");
    }
}
