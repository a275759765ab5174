//! The report for people and spreadsheets: its timeline as CSV, its
//! summary for a terminal (`flashsale report`). The dashboard draws it
//! (`http::dashboard::report`).

use super::Report;

/// The CSV's columns, a row per second of the timeline.
pub const CSV_COLUMNS: &str = "second,accepted,refused,units,latency_p50_us,latency_p99_us,joins,line,pace,ceiling,persisted,persist_wait_max_ms,paid,timed_out,events_delivered,expired";

impl Report {
    /// The timeline as CSV, a row per second.
    pub fn csv(&self) -> String {
        let mut out = format!("{CSV_COLUMNS}\n");
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
