//! The report for people and spreadsheets: its timeline as CSV, its
//! summary for a terminal (`flashsale report`). The dashboard draws it
//! (`http::dashboard::report`).

use super::{Report, SecondView};

/// The CSV's columns, a row per second of the timeline.
pub const CSV_COLUMNS: &str = "second,accepted,refused,units,latency_p50_us,latency_p99_us,joins,line,pace,ceiling,persisted,persist_wait_max_ms,paid,timed_out,events_delivered,expired";

/// A second of the timeline as a CSV row: its fields are the columns, in
/// order (a test holds them to [`CSV_COLUMNS`]); `None` is an empty cell.
#[derive(serde::Serialize)]
struct CsvRow {
    second: i64,
    accepted: u64,
    refused: u64,
    units: u64,
    latency_p50_us: Option<u64>,
    latency_p99_us: Option<u64>,
    joins: u64,
    line: Option<i64>,
    pace: Option<i64>,
    ceiling: Option<i64>,
    persisted: u64,
    persist_wait_max_ms: Option<i64>,
    paid: u64,
    timed_out: u64,
    events_delivered: u64,
    expired: u64,
}

impl From<&SecondView> for CsvRow {
    fn from(s: &SecondView) -> Self {
        Self {
            second: s.t,
            accepted: s.accepted,
            refused: s.refused,
            units: s.units,
            latency_p50_us: s.latency_p50_us,
            latency_p99_us: s.latency_p99_us,
            joins: s.joins,
            line: s.line,
            pace: s.pace,
            ceiling: s.ceiling,
            persisted: s.persisted,
            persist_wait_max_ms: s.persist_wait_max_ms,
            paid: s.paid,
            timed_out: s.timed_out,
            events_delivered: s.events_delivered,
            expired: s.expired,
        }
    }
}

impl Report {
    /// The timeline as CSV (RFC 4180, by the `csv` crate), a row per
    /// second, the header first even with no second.
    pub fn csv(&self) -> String {
        let write = || -> Result<Vec<u8>, Box<dyn std::error::Error>> {
            let mut out = csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(Vec::new());
            out.write_record(CSV_COLUMNS.split(','))?;
            for s in &self.seconds {
                out.serialize(CsvRow::from(s))?;
            }
            Ok(out.into_inner()?)
        };
        // Numbers into memory: nothing but a bug can fail here.
        let bytes = write().expect("the report's CSV, written into memory");
        String::from_utf8(bytes).unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_columns_are_the_header() {
        let mut w = csv::Writer::from_writer(Vec::new());
        let second = SecondView {
            t: 1,
            accepted: 2,
            refused: 3,
            units: 4,
            latency_p50_us: None,
            latency_p99_us: Some(9),
            joins: 0,
            line: None,
            pace: None,
            ceiling: None,
            persisted: 0,
            persist_wait_max_ms: None,
            paid: 0,
            timed_out: 0,
            events_delivered: 0,
            expired: 0,
        };
        w.serialize(CsvRow::from(&second)).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(CSV_COLUMNS));
        assert_eq!(lines.next(), Some("1,2,3,4,,9,0,,,,0,,0,0,0,0"));
    }
}
