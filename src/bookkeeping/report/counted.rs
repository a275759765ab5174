//! What the processes counted (`tb_sale_second`), merged: every process's
//! row of a second added up (readings: the highest stands), the seconds
//! summed into the report's counted figures, the buyers' registers raised
//! to the highest any process wrote.

use std::collections::{BTreeMap, HashMap};

use super::figures::{SecondView, Summary};
use crate::bookkeeping::error::BookkeepingError;
use crate::domain::PaymentResult;
use crate::domain::answer::{Outcome, REFUSED_PREFIX};
use crate::metrics::distinct;
use crate::metrics::timeline::{self, Count, Gauge, LATENCY_BUCKETS, PAYMENT_PREFIX};
use crate::store::SecondRow;

/// The timeline as the report reads it.
pub(super) struct Counted {
    /// The figures the processes counted (the books' are not filled in).
    pub summary: Summary,
    /// A view per second, oldest first (the room's readings carried on).
    pub seconds: Vec<SecondView>,
    /// Buyers who joined the room.
    pub joined: u64,
    /// The places the room had admitted, as last read.
    pub admitted: Option<i64>,
    /// The buyers who tried, as a sketch's registers.
    pub buyers: Box<[u8; distinct::REGISTERS]>,
}

impl Counted {
    /// The rows of every process, merged.
    pub fn of(rows: &[SecondRow]) -> Result<Self, BookkeepingError> {
        let mut by_second: BTreeMap<i64, Merged> = BTreeMap::new();
        let mut buyers = Box::new([0u8; distinct::REGISTERS]);
        for row in rows {
            by_second.entry(row.second).or_default().add(row)?;
            raise(&mut buyers, row)?;
        }
        let mut totals = Totals::default();
        let mut room = Room::default();
        let mut seconds = Vec::with_capacity(by_second.len());
        for (t, m) in &by_second {
            totals.add(*t, m);
            room.read(m);
            seconds.push(m.view(*t, &room));
        }
        let joined = totals.joined;
        Ok(Self {
            summary: totals.summary(),
            seconds,
            joined,
            admitted: room.admitted,
            buyers,
        })
    }
}

/// The seconds summed, as they come.
#[derive(Default)]
struct Totals {
    s: Summary,
    latency: Vec<u64>,
    /// Orders whose wait to be persisted was counted, and the waits.
    waited: u64,
    wait_ms: u64,
    joined: u64,
}

impl Totals {
    fn add(&mut self, t: i64, m: &Merged) {
        let s = &mut self.s;
        let accepted = m.answered(Outcome::Accepted);
        if accepted > s.peak_accepted_per_sec {
            (s.peak_accepted_per_sec, s.peak_at) = (accepted, Some(t));
        }
        s.accepted += accepted;
        s.funnel.requests += accepted + m.answered(Outcome::Replayed) + m.refused();
        for (k, v) in &m.counts {
            if let Some(code) = k.strip_prefix(REFUSED_PREFIX) {
                *s.refused.entry(code.to_owned()).or_default() += v;
            }
        }
        if self.latency.is_empty() {
            self.latency = vec![0u64; LATENCY_BUCKETS];
        }
        for (l, n) in self.latency.iter_mut().zip(&m.latency) {
            *l += n;
        }
        s.persisted += m.count(Count::Persisted);
        self.waited += m.count(Count::PersistWaited);
        self.wait_ms += m.count(Count::PersistWaitMs);
        self.joined += m.count(Count::Joins);
        s.events_delivered += m.count(Count::EventsDelivered);
        s.events_dead += m.count(Count::EventsDead);
        s.payments.timed_out += m.count(Count::TimedOut);
        s.payments.cancelled_by_buyers += m.count(Count::Cancelled);
        let lag = m.reading(Gauge::PersistLagMaxMs);
        s.persist_wait_max_ms = s.persist_wait_max_ms.max(lag);
    }

    /// The counted figures, the means and quantiles reckoned.
    fn summary(self) -> Summary {
        let mut s = self.s;
        s.persist_wait_mean_ms = (self.waited > 0).then(|| self.wait_ms / self.waited);
        s.latency_p50_us = quantile(&self.latency, 0.5);
        s.latency_p99_us = quantile(&self.latency, 0.99);
        s.latency_max_us = quantile(&self.latency, 1.0);
        s
    }
}

/// The room's readings, carried on across the seconds that have none (what
/// was admitted never goes back).
#[derive(Default)]
struct Room {
    admitted: Option<i64>,
    pace: Option<i64>,
    ceiling: Option<i64>,
}

impl Room {
    fn read(&mut self, m: &Merged) {
        self.admitted = (m.reading(Gauge::Admitted).or(self.admitted)).max(self.admitted);
        self.pace = m.reading(Gauge::Pace).or(self.pace);
        self.ceiling = m.reading(Gauge::Ceiling).or(self.ceiling);
    }
}

/// One second merged across processes.
#[derive(Default)]
struct Merged {
    counts: HashMap<String, u64>,
    gauges: HashMap<String, i64>,
    latency: Vec<u64>,
}

impl Merged {
    fn add(&mut self, row: &SecondRow) -> Result<(), BookkeepingError> {
        let counts: HashMap<String, u64> = parse("counts", &row.counts)?;
        let gauges: HashMap<String, i64> = parse("gauges", &row.gauges)?;
        let latency: HashMap<String, u64> = parse("latency", &row.latency)?;
        for (k, v) in counts {
            *self.counts.entry(k).or_default() += v;
        }
        // Readings: the highest stands (a name this release does not know
        // too: every figure of this column is a reading).
        for (k, v) in gauges {
            let kept = self.gauges.entry(k).or_insert(v);
            *kept = (*kept).max(v);
        }
        if !latency.is_empty() && self.latency.is_empty() {
            self.latency = vec![0; LATENCY_BUCKETS];
        }
        for (b, n) in latency {
            if let Some(bucket) = b
                .parse::<usize>()
                .ok()
                .and_then(|b| self.latency.get_mut(b))
            {
                *bucket += n;
            }
        }
        Ok(())
    }

    fn count(&self, what: Count) -> u64 {
        self.counts.get(what.name()).copied().unwrap_or(0)
    }

    fn answered(&self, outcome: Outcome) -> u64 {
        self.counts
            .get(outcome.timeline_name())
            .copied()
            .unwrap_or(0)
    }

    /// The reading of `what`, under its name or its later one (a process
    /// of the next release beside this one's), the highest.
    fn reading(&self, what: Gauge) -> Option<i64> {
        let later = what.later_name().and_then(|n| self.gauges.get(n));
        self.gauges.get(what.name()).max(later).copied()
    }

    /// This second as the report shows it, the room as read until then.
    fn view(&self, t: i64, room: &Room) -> SecondView {
        SecondView {
            t,
            accepted: self.answered(Outcome::Accepted),
            refused: self.refused(),
            units: self.count(Count::Units),
            latency_p50_us: quantile(&self.latency, 0.5),
            latency_p99_us: quantile(&self.latency, 0.99),
            joins: self.count(Count::Joins),
            admitted: room.admitted,
            line: room.admitted,
            pace: room.pace,
            ceiling: room.ceiling,
            persisted: self.count(Count::Persisted),
            persist_wait_max_ms: self.reading(Gauge::PersistLagMaxMs),
            paid: self.count(Count::Payment(PaymentResult::Paid))
                + self.count(Count::Payment(PaymentResult::PaidAgain)),
            timed_out: self.count(Count::TimedOut),
            events_delivered: self.count(Count::EventsDelivered),
            // From the room's places and the books, when the report is made.
            expired: 0,
            returned: 0,
            restocked: 0,
            refused_by: self.by_prefix(REFUSED_PREFIX),
            payments_by: self.by_prefix(PAYMENT_PREFIX),
        }
    }

    /// The counts named `<prefix><what>`, by what.
    fn by_prefix(&self, prefix: &str) -> BTreeMap<String, u64> {
        (self.counts.iter())
            .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_owned(), *v)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }

    fn refused(&self) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| k.starts_with(REFUSED_PREFIX))
            .map(|(_, v)| v)
            .sum()
    }
}

/// A row's column `what` (JSON), read.
fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, BookkeepingError> {
    serde_json::from_str(text)
        .map_err(|_| BookkeepingError::Corrupt(format!("tb_sale_second {what} {text:?}")))
}

/// Raises `registers` to a row's distinct-buyers registers (each its
/// highest: every process's and second's, merged).
fn raise(
    registers: &mut [u8; distinct::REGISTERS],
    row: &SecondRow,
) -> Result<(), BookkeepingError> {
    let raised: HashMap<u16, u8> = parse("buyers", &row.buyers)?;
    for (register, rank) in raised {
        if let Some(kept) = registers.get_mut(usize::from(register)) {
            *kept = (*kept).max(rank);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(second: i64, source: &str, counts: &str, gauges: &str, latency: &str) -> SecondRow {
        SecondRow {
            second,
            source: source.into(),
            counts: counts.into(),
            gauges: gauges.into(),
            latency: latency.into(),
            buyers: "{}".into(),
        }
    }

    #[test]
    fn the_processes_rows_add_up_and_readings_take_the_highest() {
        let rows = [
            row(
                10,
                "a",
                r#"{"accepted":3,"refused.sold_out":2,"units":3,"joins":4}"#,
                r#"{"line":5,"pace":10}"#,
                r#"{"40":3}"#,
            ),
            row(
                10,
                "b",
                r#"{"accepted":2,"refused.sold_out":1,"units":2}"#,
                r#"{"line":7,"pace":9}"#,
                r#"{"40":1,"60":1}"#,
            ),
            row(11, "a", r#"{"accepted":1,"units":1}"#, "{}", r#"{"40":1}"#),
        ];
        let c = Counted::of(&rows).unwrap();
        assert_eq!(c.summary.accepted, 6);
        assert_eq!(c.summary.refused, [("sold_out".to_owned(), 3)].into());
        assert_eq!(c.summary.funnel.requests, 9);
        assert_eq!(
            (c.summary.peak_accepted_per_sec, c.summary.peak_at),
            (5, Some(10))
        );
        assert_eq!((c.joined, c.admitted), (4, Some(7)));
        let s: Vec<_> = c
            .seconds
            .iter()
            .map(|s| (s.t, s.accepted, s.refused, s.admitted))
            .collect();
        assert_eq!(s, [(10, 5, 3, Some(7)), (11, 1, 0, Some(7))], "carried on");
        // 6 answers: 5 in bucket 40, 1 in bucket 60.
        assert_eq!(c.summary.latency_p50_us, Some(timeline::bucket_upper(40)));
        assert_eq!(c.summary.latency_max_us, Some(timeline::bucket_upper(60)));
        // The next release writes the places admitted as `admitted`: read
        // too, beside this release's `line`, the highest standing.
        let later = [
            row(12, "a", "{}", r#"{"line":8}"#, "{}"),
            row(12, "b", "{}", r#"{"admitted":9}"#, "{}"),
            row(13, "b", "{}", r#"{"admitted":10}"#, "{}"),
        ];
        let c = Counted::of(&later).unwrap();
        let read: Vec<_> = c.seconds.iter().map(|s| (s.t, s.admitted)).collect();
        assert_eq!(read, [(12, Some(9)), (13, Some(10))]);
        assert!(Counted::of(&[row(1, "a", "not json", "{}", "{}")]).is_err());
    }
}
