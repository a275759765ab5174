//! The report for people and spreadsheets: its timeline as CSV, its
//! summary for a terminal (`flashsale report`). The dashboard draws it
//! (`http::operators::dashboard::report`).

use super::figures::{Report, SecondView};

/// The CSV's columns, a row per second of the timeline.
pub const CSV_COLUMNS: &str = "second,accepted,refused,units,latency_p50_us,latency_p99_us,joins,line,pace,ceiling,persisted,persist_wait_max_ms,paid,timed_out,events_delivered,expired,returned,restocked,admitted";

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
    /// `admitted` under its first name, in its first place: deprecated,
    /// gone in 0.3.0.
    line: Option<i64>,
    pace: Option<i64>,
    ceiling: Option<i64>,
    persisted: u64,
    persist_wait_max_ms: Option<i64>,
    paid: u64,
    timed_out: u64,
    events_delivered: u64,
    expired: u64,
    returned: u64,
    restocked: i64,
    /// The places the room had admitted (a column added last: a
    /// spreadsheet reading the columns by place reads them as before).
    admitted: Option<i64>,
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
            line: s.admitted,
            pace: s.pace,
            ceiling: s.ceiling,
            persisted: s.persisted,
            persist_wait_max_ms: s.persist_wait_max_ms,
            paid: s.paid,
            timed_out: s.timed_out,
            events_delivered: s.events_delivered,
            expired: s.expired,
            returned: s.returned,
            restocked: s.restocked,
            admitted: s.admitted,
        }
    }
}

/// The summary's columns, a row per sale (the index of kept reports, or
/// the sales asked for).
pub const SUMMARY_COLUMNS: &str = "product_id,title,kept,start_ms,end_ms,on_sale,units_sold,sold_out_after_ms,accepted,orders,buyers_tried,buyers_joined,buyers_admitted,buyers_ordered,buyers_paid,paid,paid_late,refund_due,failed,timed_out,cancelled_by_buyers,currency,revenue,received,refunds_owed,books_ok";

/// A sale's summary as a CSV row: its fields are the columns, in order.
#[derive(serde::Serialize)]
struct SummaryRow<'a> {
    product_id: &'a str,
    title: &'a str,
    kept: bool,
    start_ms: i64,
    end_ms: i64,
    on_sale: i64,
    units_sold: i64,
    sold_out_after_ms: Option<i64>,
    accepted: u64,
    orders: i64,
    buyers_tried: u64,
    buyers_joined: Option<u64>,
    buyers_admitted: Option<u64>,
    buyers_ordered: u64,
    buyers_paid: u64,
    paid: i64,
    paid_late: i64,
    refund_due: i64,
    failed: i64,
    timed_out: u64,
    cancelled_by_buyers: u64,
    currency: Option<&'a str>,
    revenue: String,
    received: String,
    refunds_owed: String,
    books_ok: bool,
}

impl<'a> From<&'a Report> for SummaryRow<'a> {
    fn from(r: &'a Report) -> Self {
        let (s, f, p, m) = (
            &r.summary,
            &r.summary.funnel,
            &r.summary.payments,
            &r.summary.money,
        );
        Self {
            product_id: &r.product_id,
            title: &r.title,
            kept: r.kept,
            start_ms: r.start_ms,
            end_ms: r.end_ms,
            on_sale: r.initial_qty,
            units_sold: s.units_sold,
            sold_out_after_ms: s.sold_out_after_ms,
            accepted: s.accepted,
            orders: s.orders,
            buyers_tried: f.tried,
            buyers_joined: f.joined,
            buyers_admitted: f.admitted,
            buyers_ordered: f.ordered,
            buyers_paid: f.paid,
            paid: p.paid,
            paid_late: p.paid_late,
            refund_due: p.refund_due,
            failed: p.failed,
            timed_out: p.timed_out,
            cancelled_by_buyers: p.cancelled_by_buyers,
            currency: m.currency.as_deref(),
            revenue: m.revenue.to_string(),
            received: m.received.to_string(),
            refunds_owed: m.refund_due.to_string(),
            books_ok: s.books_ok,
        }
    }
}

/// Sales' summaries as CSV (RFC 4180), a row each, the header first.
pub fn summaries_csv(reports: &[Report]) -> String {
    csv_of(SUMMARY_COLUMNS, reports.iter().map(SummaryRow::from))
}

/// Rows as CSV (RFC 4180, by the `csv` crate) under `columns`, the header
/// first even with no row.
fn csv_of<T: serde::Serialize>(columns: &str, rows: impl Iterator<Item = T>) -> String {
    let write = || -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let mut out = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        out.write_record(columns.split(','))?;
        for row in rows {
            out.serialize(row)?;
        }
        Ok(out.into_inner()?)
    };
    // Numbers and text into memory: nothing but a bug can fail here.
    let bytes = write().expect("a CSV, written into memory");
    String::from_utf8(bytes).unwrap_or_default()
}

impl Report {
    /// The timeline as CSV (RFC 4180), a row per second, the header
    /// first even with no second.
    pub fn csv(&self) -> String {
        csv_of(CSV_COLUMNS, self.seconds.iter().map(CsvRow::from))
    }

    /// The summary for a terminal (`flashsale report`): a line per part.
    pub fn text(&self) -> String {
        let s = &self.summary;
        let kept = match self.kept {
            true => ", kept at retirement",
            false => ", live",
        };
        let mut out = format!("{} ({}){kept}\n", self.product_id, self.title);
        out.push_str(&format!(
            "  sold out after {}; peak {} accepted/s; {} accepted, {} of {} units sold\n",
            secs(s.sold_out_after_ms),
            s.peak_accepted_per_sec,
            s.accepted,
            s.units_sold,
            self.initial_qty
        ));
        out.push_str(&self.funnel_line());
        if let Some(w) = &s.wait {
            out.push_str(&format!(
                "  wait in line: p50 {}, p90 {}, max {} ({} buyers)\n",
                secs(Some(w.p50_ms)),
                secs(Some(w.p90_ms)),
                secs(Some(w.max_ms)),
                w.buyers
            ));
        }
        out.push_str(&self.refused_line());
        out.push_str(&self.payments_line());
        out.push_str(&self.books_lines());
        out
    }

    fn funnel_line(&self) -> String {
        let f = &self.summary.funnel;
        let or_none = |v: Option<u64>, say: fn(u64) -> String| v.map_or(String::new(), say);
        format!(
            "  funnel: {} requests from {} buyers{}{}{}, {} buyers ordered, {} paid\n",
            f.requests,
            f.tried,
            or_none(f.joined, |j| format!(", {j} joined")),
            or_none(f.admitted, |a| format!(", {a} admitted")),
            or_none(f.expired, |e| format!(" ({e} ran out unused)")),
            f.ordered,
            f.paid
        )
    }

    fn refused_line(&self) -> String {
        let refused: Vec<String> = (self.summary.refused.iter())
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        match refused.is_empty() {
            true => "  refused: none\n".to_owned(),
            false => format!("  refused: {}\n", refused.join(", ")),
        }
    }

    fn payments_line(&self) -> String {
        let p = &self.summary.payments;
        let m = &self.summary.money;
        let currency = m.currency.as_deref().unwrap_or("-");
        format!(
            "  payments: {} paid, {} paid late, {} refund due, {} failed, {} amount mismatch; {} timed out, {} cancelled by buyers\n\
             \x20 money ({currency}): revenue {}, received {}, refunds owed {}\n",
            p.paid,
            p.paid_late,
            p.refund_due,
            p.failed,
            p.amount_mismatch,
            p.timed_out,
            p.cancelled_by_buyers,
            m.revenue,
            m.received,
            m.refund_due,
        )
    }

    /// The order path, persisting, events and the books' verdict.
    fn books_lines(&self) -> String {
        let s = &self.summary;
        let ms =
            |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{:.1} ms", v as f64 / 1000.0));
        let verdict = if s.books_ok { "balanced" } else { "MISMATCH" };
        format!(
            "  order latency: p50 {}, p99 {}; persisted {} (mean wait {}, max {})\n\
             \x20 events: {} delivered, {} given up\n\
             \x20 books: {verdict} ({} orders: {} confirmed, {} paid, {} cancelled)\n",
            ms(s.latency_p50_us),
            ms(s.latency_p99_us),
            s.persisted,
            secs(s.persist_wait_mean_ms.map(|v| v as i64)),
            secs(s.persist_wait_max_ms),
            s.events_delivered,
            s.events_dead,
            s.orders,
            s.confirmed,
            s.paid,
            s.cancelled
        )
    }
}

/// Milliseconds for a person (`-`: none): under a second in
/// milliseconds (a 22 ms wait read "0.0 s"), else in seconds.
fn secs(v: Option<i64>) -> String {
    v.map_or("-".to_owned(), span)
}

/// A span of milliseconds for a person: `22 ms`, `1.5 s`.
pub fn span(ms: i64) -> String {
    match ms.unsigned_abs() < 1000 {
        true => format!("{ms} ms"),
        false => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::super::figures::{Funnel, LineWait, Money, PaymentFigures, Summary};
    use super::*;

    /// A sale with a room, refusals, payments and a wait: every line.
    fn sample(kept: bool, wait: Option<LineWait>) -> Report {
        Report {
            product_id: "sku-1".into(),
            title: "Phone".into(),
            made_ms: 0,
            kept,
            start_ms: 0,
            end_ms: 0,
            initial_qty: 100,
            summary: Summary {
                sold_out_after_ms: Some(12_345),
                peak_accepted_per_sec: 77,
                accepted: 100,
                units_sold: 100,
                funnel: Funnel {
                    requests: 5000,
                    tried: 900,
                    joined: Some(800),
                    admitted: Some(300),
                    expired: Some(12),
                    ordered: 100,
                    paid: 80,
                    ..Funnel::default()
                },
                wait,
                refused: [
                    ("sold_out".to_owned(), 4000),
                    ("limit_exceeded".to_owned(), 3),
                ]
                .into(),
                payments: PaymentFigures {
                    paid: 78,
                    paid_late: 2,
                    refund_due: 1,
                    failed: 4,
                    amount_mismatch: 0,
                    timed_out: 20,
                    cancelled_by_buyers: 5,
                },
                latency_p50_us: Some(1_234),
                latency_p99_us: None,
                persisted: 100,
                persist_wait_mean_ms: Some(250),
                persist_wait_max_ms: Some(900),
                events_delivered: 300,
                events_dead: 1,
                books_ok: true,
                orders: 100,
                confirmed: 15,
                paid: 80,
                cancelled: 5,
                money: Money {
                    currency: Some("CNY".into()),
                    revenue: "399200".parse().expect("a decimal"),
                    received: "399200".parse().expect("a decimal"),
                    refund_due: "4999.5".parse().expect("a decimal"),
                },
                ..Summary::default()
            },
            seconds: Vec::new(),
            pauses: Vec::new(),
            refunds_due: Vec::new(),
        }
    }

    #[test]
    fn a_span_under_a_second_reads_in_milliseconds() {
        assert_eq!(span(22), "22 ms", "not 0.0 s");
        assert_eq!(span(999), "999 ms");
        assert_eq!(span(1_000), "1.0 s");
        assert_eq!(span(12_345), "12.3 s");
    }

    #[test]
    fn the_summary_for_a_terminal_says_each_part_on_its_line() {
        let wait = LineWait {
            buyers: 300,
            p50_ms: 1500,
            p90_ms: 4000,
            max_ms: 9000,
        };
        assert_eq!(sample(true, Some(wait)).text(), TEXT);
        let live = sample(false, None).text();
        assert!(live.starts_with("sku-1 (Phone), live\n"), "{live}");
        assert!(!live.contains("wait in line"), "{live}");
        let mut none = sample(false, None);
        none.summary.refused.clear();
        assert!(none.text().contains("  refused: none\n"));
    }

    const TEXT: &str = "\
sku-1 (Phone), kept at retirement
  sold out after 12.3 s; peak 77 accepted/s; 100 accepted, 100 of 100 units sold
  funnel: 5000 requests from 900 buyers, 800 joined, 300 admitted (12 ran out unused), 100 buyers ordered, 80 paid
  wait in line: p50 1.5 s, p90 4.0 s, max 9.0 s (300 buyers)
  refused: limit_exceeded 3, sold_out 4000
  payments: 78 paid, 2 paid late, 1 refund due, 4 failed, 0 amount mismatch; 20 timed out, 5 cancelled by buyers
  money (CNY): revenue 399200, received 399200, refunds owed 4999.5
  order latency: p50 1.2 ms, p99 -; persisted 100 (mean wait 250 ms, max 900 ms)
  events: 300 delivered, 1 given up
  books: balanced (100 orders: 15 confirmed, 80 paid, 5 cancelled)
";

    #[test]
    fn a_summary_rows_columns_are_the_header_and_a_title_is_quoted() {
        let r = Report {
            product_id: "sku-1".into(),
            title: "Phone, \"X\"".into(),
            made_ms: 0,
            kept: true,
            start_ms: 1,
            end_ms: 2,
            initial_qty: 3,
            summary: Default::default(),
            seconds: Vec::new(),
            pauses: Vec::new(),
            refunds_due: Vec::new(),
        };
        let text = summaries_csv(&[r]);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(SUMMARY_COLUMNS));
        assert_eq!(
            lines.next(),
            Some("sku-1,\"Phone, \"\"X\"\"\",true,1,2,3,0,,0,0,0,,,0,0,0,0,0,0,0,0,,0,0,0,false")
        );
    }

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
            admitted: Some(7),
            line: None,
            pace: None,
            ceiling: None,
            persisted: 0,
            persist_wait_max_ms: None,
            paid: 0,
            timed_out: 0,
            events_delivered: 0,
            expired: 0,
            returned: 2,
            restocked: -1,
            ..SecondView::default()
        };
        w.serialize(CsvRow::from(&second)).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(CSV_COLUMNS));
        assert_eq!(lines.next(), Some("1,2,3,4,,9,0,7,,,0,,0,0,0,0,2,-1,7"));
    }
}
