//! A sale's timeline, as this process saw it: per second (by this
//! process's clock), what it counted for the sale (orders accepted and
//! refused by code, units, joins, orders persisted and how long they
//! waited, payments by result, cancels, timeouts), the room's readings (the
//! line, the pace, its ceiling, buyers joined) and the order route's
//! latency (bucketed: four buckets an octave, to within 19%).
//!
//! Counted in memory where the metrics are counted (no Redis call, no
//! lock but the sale's own, uncontended but for its second's counters);
//! each second, once over, is taken by the process's flush
//! (`store::Seconds`: a row per sale, second and process, written with
//! its values, so a write tried again counts nothing twice) and the
//! report sums the processes' rows (`books::report`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::distinct;

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

/// An answer of the order route: its outcome (`accepted`, `replayed` or
/// the error code), the units it took, when it was answered and how long
/// it took (the route's own timing: no clock read here).
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub outcome: &'static str,
    pub units: u64,
    pub at: Instant,
    pub micros: u64,
}

/// Buckets of the latency histogram: four an octave from 1 µs, to ~68 s.
pub const LATENCY_BUCKETS: usize = 4 * 26;

/// How a figure of a second merges across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Counted: the processes' counts add up.
    Sum,
    /// Read (a gauge): the highest reading stands.
    Max,
}

/// One second of one sale, as this process counted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Second {
    /// Epoch seconds.
    pub second: i64,
    /// Counted figures, by name (`units`, `joins`, ...).
    pub counts: Vec<(&'static str, u64)>,
    /// The order route's answers, by outcome (`accepted`, `replayed` or
    /// the error code: see [`answer_name`]).
    pub answers: Vec<(&'static str, u64)>,
    /// Readings, by name (`line`, `pace`, ...): the highest this second.
    pub gauges: Vec<(&'static str, i64)>,
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

    fn count(&mut self, name: &'static str, n: u64) {
        add(&mut self.counts, name, n);
    }

    fn gauge(&mut self, name: &'static str, value: i64) {
        match self.gauges.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => *v = (*v).max(value),
            None => self.gauges.push((name, value)),
        }
    }

    fn latency(&mut self, micros: u64) {
        if self.latency.is_empty() {
            self.latency = vec![0; LATENCY_BUCKETS];
        }
        self.latency[bucket(micros)] += 1;
    }
}

/// Adds `n` to `name` in `to`. A few names a second: a scan beats
/// hashing (the same literal is most often the same pointer: compared
/// first).
fn add(to: &mut Vec<(&'static str, u64)>, name: &'static str, n: u64) {
    match to
        .iter_mut()
        .find(|(k, _)| std::ptr::eq(*k, name) || *k == name)
    {
        Some((_, v)) => *v += n,
        None => to.push((name, n)),
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

/// What this process holds of a sale.
type SaleSeconds = Arc<Mutex<SaleCounts>>;

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
}

impl Default for SaleCounts {
    fn default() -> Self {
        Self {
            seconds: VecDeque::new(),
            buyers: Box::new([0; distinct::REGISTERS]),
            until: None,
        }
    }
}

impl SaleCounts {
    /// The second `now`, begun if it is new.
    fn second(&mut self, now: i64) -> &mut Second {
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

impl Timeline {
    /// Epoch seconds now, by the timelines' clock (the flush's `before`).
    pub fn now_s(&self) -> i64 {
        self.clock.second_of(Instant::now())
    }

    fn sale(&self, product: &str) -> SaleSeconds {
        if let Some(s) = self
            .sales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(product)
        {
            return s.clone();
        }
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(product.to_owned())
            .or_default()
            .clone()
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

    /// The sale's counts, under its lock.
    fn sale_at(&self, product: &str, add: impl FnOnce(&mut SaleCounts)) {
        {
            let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
            if let Some(sale) = sales.get(product) {
                add(&mut sale.lock().unwrap_or_else(|e| e.into_inner()));
                return;
            }
        }
        let sale = self.sale(product);
        add(&mut sale.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Counts `n` of `name` for the sale this second.
    pub fn count(&self, product: &str, name: &'static str, n: u64) {
        if n > 0 {
            self.with_now(product, |s| s.count(name, n));
        }
    }

    /// A reading of `name` for the sale this second (the highest stands).
    pub fn gauge(&self, product: &str, name: &'static str, value: i64) {
        self.with_now(product, |s| s.gauge(name, value));
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
                s.count("units", answer.units);
            }
            s.latency(answer.micros);
        });
    }

    /// The seconds over (before `before`, epoch s), taken out to be written.
    pub fn take_settled(&self, before: i64) -> Vec<(String, Second)> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (product, sale) in sales.iter() {
            let seconds = &mut sale.lock().unwrap_or_else(|e| e.into_inner()).seconds;
            while seconds.front().is_some_and(|s| s.second < before) {
                if let Some(s) = seconds.pop_front() {
                    out.push((product.clone(), s));
                }
            }
        }
        drop(sales);
        // Sales with nothing left and nothing new go (a retired sale's).
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| {
                !s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .seconds
                    .is_empty()
            });
        out
    }

    /// Seconds a write did not take, back for the next flush.
    pub fn put_back(&self, seconds: Vec<(String, Second)>) {
        for (product, second) in seconds.into_iter().rev() {
            let sale = self.sale(&product);
            sale.lock()
                .unwrap_or_else(|e| e.into_inner())
                .seconds
                .push_front(second);
        }
    }
}

/// The written name of an order answer's outcome (counted as it comes,
/// no mapping on the order path): `accepted`, `replayed`, or
/// `refused.<code>`.
pub fn answer_name(outcome: &str) -> &'static str {
    match outcome {
        "accepted" => "accepted",
        "replayed" => "replayed",
        "sold_out" => "refused.sold_out",
        "insufficient_stock" => "refused.insufficient_stock",
        "limit_exceeded" => "refused.limit_exceeded",
        "sale_not_started" => "refused.sale_not_started",
        "sale_ended" => "refused.sale_ended",
        "sale_paused" => "refused.sale_paused",
        "admission_required" => "refused.admission_required",
        "admission_expired" => "refused.admission_expired",
        "rate_limited" => "refused.rate_limited",
        "overloaded" => "refused.overloaded",
        "unavailable" => "refused.unavailable",
        "idempotency_key_reused" => "refused.idempotency_key_reused",
        "forbidden" => "refused.forbidden",
        _ => "refused.other",
    }
}

/// How the figure `name` merges across processes.
pub fn merge_of(name: &str) -> Merge {
    match name {
        "line" | "pace" | "ceiling" | "joined" | "waiting" | "persist_lag_max_ms" => Merge::Max,
        _ => Merge::Sum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        t.order(p, 7, answer("accepted", 2, 800));
        t.order(p, 7, answer("sold_out", 0, 50));
        t.order(p, 8, answer("sold_out", 0, 50));
        t.count(p, "joins", 3);
        t.gauge(p, "line", 5);
        t.gauge(p, "line", 4);
        assert!(t.take_settled(0).is_empty(), "not over yet");
        let now = t.now_s();
        let taken = t.take_settled(now + 2);
        assert!(!taken.is_empty());
        let counts: u64 = taken
            .iter()
            .flat_map(|(_, s)| s.counts.iter())
            .filter(|(k, _)| *k == "units")
            .map(|(_, v)| v)
            .sum();
        assert_eq!(counts, 2);
        let line = taken
            .iter()
            .flat_map(|(_, s)| s.gauges.iter())
            .find(|(k, _)| *k == "line")
            .map(|(_, v)| *v);
        assert_eq!(line, Some(5));
        // Each buyer raised its register once: two buyers, two raises.
        let raised: Vec<_> = taken.iter().flat_map(|(_, s)| s.buyers.clone()).collect();
        assert_eq!(raised.len(), 2, "{raised:?}");
        assert!(raised.contains(&distinct::place(7)) && raised.contains(&distinct::place(8)));
        assert!(t.take_settled(now + 2).is_empty(), "taken once");
        t.put_back(taken);
        assert!(!t.take_settled(now + 2).is_empty(), "put back");
    }
}
