//! `GET /admin/dashboard/report/{product_id}`: a sale's report as a page:
//! its figures, then its timeline drawn as SVG here (no script, no third
//! party: the pages' CSP holds), and the funnel.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::board::Dashboard;
use super::chart::{Axis, Gaps, Mark, Series, chart, funnel, when};
use super::door::PageSignedIn;
use crate::bookkeeping::Report;
use crate::bookkeeping::report::SecondView;
use crate::http::error::ApiError;
use crate::http::extract::SalePath;
use crate::http::pages::html;

pub(super) async fn page(
    State(dashboard): State<Arc<Dashboard>>,
    _: PageSignedIn,
    SalePath(id): SalePath,
) -> Response {
    match dashboard.desk.reports.report(&id).await {
        Ok(report) => html(StatusCode::OK, render(&report)),
        Err(e) => ApiError::from(e).into_response(),
    }
}

fn secs(ms: Option<i64>) -> String {
    ms.map_or("–".into(), crate::bookkeeping::report::span)
}

fn millis(us: Option<u64>) -> String {
    us.map_or("–".into(), |us| format!("{:.1} ms", us as f64 / 1000.0))
}

/// The page: its figures, the funnel, the refusals, the charts (maud
/// escapes every text and attribute: a title is text, never markup).
pub fn render(r: &Report) -> String {
    let f = &r.summary.funnel;
    // Buyers, step by step, each step some of the one before: with a room
    // they join and are admitted before they order (those who tried to
    // order without joining, bots among them, are among the figures, not
    // a step); without one, they try first.
    let tried = f.joined.is_none().then_some(f.tried);
    let steps: [(&str, Option<u64>); 5] = [
        ("joined the room", f.joined),
        ("admitted", f.admitted),
        ("tried to order", tried),
        ("ordered", Some(f.ordered)),
        ("paid", Some(f.paid)),
    ];
    let state = match r.kept {
        true => "kept at its retirement",
        false => "live: as it stands now",
    };
    let id = &r.product_id;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Report: " (id) }
                link rel="stylesheet" href="/admin/assets/dashboard.css";
            }
            body.report {
                header {
                    h1 { "Report: " (id) }
                    p {
                        (r.title) " · " (state) " · "
                        a href="/admin/dashboard" { "back to the dashboard" }
                        " · "
                        a href={ "/api/admin/products/" (id) "/report/csv" } { "timeline as CSV" }
                        " · "
                        a href={ "/admin/dashboard/reports.csv?sale=" (id) } { "summary as CSV" }
                        " · "
                        a href="/admin/dashboard/reports" { "past sales" }
                    }
                }
                main {
                    section.figures {
                        h2 { "How it went" }
                        dl #figures {
                            @for (k, v) in figures(r) { dt { (k) } dd { (v) } }
                        }
                    }
                    (funnel(&steps))
                    section {
                        h2 { "Refusals" }
                        table #refusals {
                            tr { th { "why" } th { "answers" } }
                            @for (code, n) in &r.summary.refused { tr { td { (code) } td { (n) } } }
                        }
                    }
                    @if !r.refunds_due.is_empty() {
                        section {
                            h2 { "Refunds owed" }
                            p.note {
                                "Payments taken for orders that could not have them (cancelled, their units gone): "
                                "refund each on the payment side."
                                @if (r.refunds_due.len() as i64) < r.summary.payments.refund_due {
                                    " The first " (r.refunds_due.len()) " of " (r.summary.payments.refund_due) "."
                                }
                            }
                            table #refunds {
                                tr { th { "payment" } th { "order" } th { "buyer" } th { "amount" } th { "heard" } }
                                @for f in &r.refunds_due {
                                    tr {
                                        td { (f.payment_id) } td { (f.order_id) } td { (f.user_id) }
                                        td { (f.currency) " " (f.amount) } td { (when(f.received_ms)) }
                                    }
                                }
                            }
                        }
                    }
                    (charts(r))
                }
            }
        }
    }
    .into_string()
}

/// The figures, named.
pub(super) fn figures(r: &Report) -> Vec<(&'static str, String)> {
    let s = &r.summary;
    let (f, p) = (&s.funnel, &s.payments);
    let wait = s.wait.as_ref().map_or("no room".into(), |w| {
        format!(
            "{} / {} / {}",
            secs(Some(w.p50_ms)),
            secs(Some(w.p90_ms)),
            secs(Some(w.max_ms))
        )
    });
    let verdict = if s.books_ok { "balanced" } else { "MISMATCH" };
    let mut rows = vec![
        ("Sold out after", secs(s.sold_out_after_ms)),
        (
            "Units sold",
            format!("{} of {}", s.units_sold, r.initial_qty),
        ),
        (
            "Peak accepted",
            format!("{} orders/s", s.peak_accepted_per_sec),
        ),
        ("Orders accepted", s.accepted.to_string()),
        (
            "Order requests",
            format!("{} from {} buyers", f.requests, f.tried),
        ),
        ("Wait in line (p50 / p90 / max)", wait),
        (
            "Payments",
            format!(
                "{} paid, {} late, {} refund due, {} failed; {} timed out, {} cancelled by buyers",
                p.paid, p.paid_late, p.refund_due, p.failed, p.timed_out, p.cancelled_by_buyers
            ),
        ),
        ("Money", money(&s.money)),
        (
            "Order latency (p50 / p99)",
            format!(
                "{} / {}",
                millis(s.latency_p50_us),
                millis(s.latency_p99_us)
            ),
        ),
        (
            "Persisted",
            format!(
                "{} (mean wait {}, max {})",
                s.persisted,
                secs(s.persist_wait_mean_ms.map(|v| v as i64)),
                secs(s.persist_wait_max_ms)
            ),
        ),
        (
            "The books",
            format!(
                "{verdict}: {} orders, {} confirmed, {} paid, {} cancelled",
                s.orders, s.confirmed, s.paid, s.cancelled
            ),
        ),
        (
            "Events to the shop",
            format!(
                "{} delivered, {} given up",
                s.events_delivered, s.events_dead
            ),
        ),
    ];
    if let Some(unused) = f.admitted_unused {
        let ran_out = f
            .expired
            .map_or(String::new(), |e| format!(" ({e} ran out)"));
        rows.push(("Admitted, did not order", format!("{unused}{ran_out}")));
    }
    rows
}

/// The money, in the payments' currency.
fn money(m: &crate::bookkeeping::Money) -> String {
    let Some(currency) = m.currency.as_deref() else {
        return "none: no payment heard".into();
    };
    format!(
        "revenue {currency} {}; received {currency} {}; refunds owed {currency} {}",
        m.revenue, m.received, m.refund_due
    )
}

/// The moments marked across every chart: the start and the end, the
/// sell-out, each pause and resume, each restock (seconds from the start).
fn marks(r: &Report) -> Vec<Mark> {
    let start_s = r.start_ms.div_euclid(1000);
    let mut marks = vec![
        Mark {
            at: 0,
            label: "start".into(),
        },
        Mark {
            at: r.end_ms.div_euclid(1000) - start_s,
            label: "end".into(),
        },
    ];
    if let Some(ms) = r.summary.sold_out_after_ms {
        marks.push(Mark {
            at: ms.div_euclid(1000),
            label: "sold out".into(),
        });
    }
    for (paused, at) in &r.pauses {
        marks.push(Mark {
            at: at.div_euclid(1000) - start_s,
            label: if *paused { "paused" } else { "resumed" }.into(),
        });
    }
    for x in r.seconds.iter().filter(|x| x.restocked != 0) {
        marks.push(Mark {
            at: x.t - start_s,
            label: format!("restock {:+}", x.restocked),
        });
    }
    marks
}

/// The units on sale each second (those of the start, then each restock's)
/// and those orders hold (accepted, less those given back): the second
/// never above the first, whatever sold again.
fn units(r: &Report) -> [Values; 3] {
    let restocked: i64 = r.seconds.iter().map(|x| x.restocked).sum();
    let (mut on_sale, mut held, mut back) = (r.initial_qty - restocked, 0i64, 0i64);
    let mut series: [Values; 3] = Default::default();
    for x in &r.seconds {
        on_sale += x.restocked;
        held += x.units as i64 - x.returned as i64;
        back += x.returned as i64;
        for (values, v) in series.iter_mut().zip([on_sale, held, back]) {
            values.push(Some(v as f64));
        }
    }
    series
}

/// A series' values, a second each.
type Values = Vec<Option<f64>>;

/// The timeline's charts.
fn charts(r: &Report) -> Markup {
    let start_s = r.start_ms.div_euclid(1000);
    let t: Vec<i64> = r.seconds.iter().map(|x| x.t - start_s).collect();
    let marks = marks(r);
    let axis = Axis {
        t: &t,
        start_s,
        marks: &marks,
    };
    let s = Seconds(&r.seconds);
    let [on_sale, held, back] = units(r);
    let room = r.summary.funnel.joined.is_some();
    html! {
        section.charts {
            h2 { "Second by second" }
            p.note { "Seconds from the start, and the clock (UTC) under them; dotted: start, end, sell-out, pauses, restocks." }
            (chart("orders", "Orders per second", &axis, &[
                s.count("accepted", "#2e7d32", |x| x.accepted),
                s.count("refused", "#9e9e9e", |x| x.refused),
            ]))
            (chart("units", "Units: on sale, held by orders (accepted less given back), given back (held climbing after: sold again)", &axis, &[
                Series::new("on sale", "#c62828", Gaps::Hold, on_sale).dashed(),
                Series::new("held by orders", "#1565c0", Gaps::Hold, held),
                Series::new("given back", "#ef6c00", Gaps::Hold, back),
            ]))
            (chart("latency", "Order latency (ms; none in a second without orders)", &axis, &[
                s.millis("p50", "#1565c0", |x| x.latency_p50_us),
                s.millis("p99", "#ef6c00", |x| x.latency_p99_us),
            ]))
            @if room {
                (chart("room", "Waiting room: joined and admitted (in all)", &axis, &[
                    s.total("joined", "#6a1b9a", |x| x.joins),
                    s.level("admitted", "#2e7d32", |x| x.admitted),
                    s.total("ran out unused", "#c62828", |x| x.expired),
                ]))
                (chart("pace", "Waiting room: pace, under its ceiling (buyers/s)", &axis, &[
                    s.level("pace", "#2e7d32", |x| x.pace),
                    s.level("ceiling", "#c62828", |x| x.ceiling).dashed(),
                ]))
            }
            (chart("persisted", "Orders persisted per second", &axis, &[
                s.count("persisted", "#1565c0", |x| x.persisted),
            ]))
            (chart("persist-wait", "Longest wait to be persisted (s)", &axis, &[
                Series::new("longest wait (s)", "#ef6c00", Gaps::Skip,
                    s.each(|x| x.persist_wait_max_ms.map(|ms| ms as f64 / 1000.0))),
            ]))
            (chart("refusals", "Refusals per second, by reason", &axis, &refusals(r, &s)))
            (chart("payments", "Payments per second, by result, and orders timed out", &axis, &[
                s.keyed("paid", "#2e7d32", |x| &x.payments_by, "paid"),
                s.keyed("paid late", "#1565c0", |x| &x.payments_by, "paid_again"),
                s.keyed("refund due", "#ef6c00", |x| &x.payments_by, "refund_due"),
                s.keyed("failed", "#6a1b9a", |x| &x.payments_by, "failed"),
                s.count("timed out", "#c62828", |x| x.timed_out),
            ]))
        }
    }
}

/// Colours for series that have no colour of their own.
const PALETTE: [&str; 6] = [
    "#c62828", "#ef6c00", "#6a1b9a", "#1565c0", "#00838f", "#9e9e9e",
];

/// A series per reason a sale's orders were refused, the most frequent
/// first (five; the rest are one series, "other").
fn refusals<'r>(r: &'r Report, s: &Seconds<'r>) -> Vec<Series<'r>> {
    let mut codes: Vec<(&String, &u64)> = r.summary.refused.iter().collect();
    codes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let (shown, rest) = codes.split_at(codes.len().min(5));
    let mut series: Vec<Series> = shown
        .iter()
        .zip(PALETTE)
        .map(|((code, _), color)| s.keyed(code.as_str(), color, |x| &x.refused_by, code.as_str()))
        .collect();
    if !rest.is_empty() {
        let named: Vec<&str> = shown.iter().map(|(c, _)| c.as_str()).collect();
        series.push(Series::new(
            "other",
            PALETTE[5],
            Gaps::Zero,
            s.each(|x| {
                let other: u64 = (x.refused_by.iter())
                    .filter(|(k, _)| !named.contains(&k.as_str()))
                    .map(|(_, v)| v)
                    .sum();
                other as f64
            }),
        ));
    }
    series
}

/// The timeline's seconds, made into the charts' series.
struct Seconds<'r>(&'r [SecondView]);

impl Seconds<'_> {
    /// A value a second.
    fn each<T: Into<Option<f64>>>(&self, f: impl Fn(&SecondView) -> T) -> Vec<Option<f64>> {
        self.0.iter().map(|x| f(x).into()).collect()
    }

    /// A count per second (a second not in the timeline counted 0).
    fn count<'a>(&self, label: &'a str, color: &'a str, f: fn(&SecondView) -> u64) -> Series<'a> {
        Series::new(label, color, Gaps::Zero, self.each(|x| f(x) as f64))
    }

    /// A count per second kept by key (`key` of the map `f` picks).
    fn keyed<'a>(
        &self,
        label: &'a str,
        color: &'a str,
        f: fn(&SecondView) -> &std::collections::BTreeMap<String, u64>,
        key: &str,
    ) -> Series<'a> {
        let values = self.each(|x| f(x).get(key).copied().unwrap_or(0) as f64);
        Series::new(label, color, Gaps::Zero, values)
    }

    /// A count's running total.
    fn total<'a>(&self, label: &'a str, color: &'a str, f: fn(&SecondView) -> u64) -> Series<'a> {
        let mut sum = 0;
        let values = self
            .0
            .iter()
            .map(|x| {
                sum += f(x);
                Some(sum as f64)
            })
            .collect();
        Series::new(label, color, Gaps::Hold, values)
    }

    /// A reading (carried on between readings).
    fn level<'a>(
        &self,
        label: &'a str,
        color: &'a str,
        f: fn(&SecondView) -> Option<i64>,
    ) -> Series<'a> {
        Series::new(
            label,
            color,
            Gaps::Hold,
            self.each(|x| f(x).map(|v| v as f64)),
        )
    }

    /// A latency in µs, drawn in ms (none in a second without answers).
    fn millis<'a>(
        &self,
        label: &'a str,
        color: &'a str,
        f: fn(&SecondView) -> Option<u64>,
    ) -> Series<'a> {
        Series::new(
            label,
            color,
            Gaps::Skip,
            self.each(|x| f(x).map(|us| us as f64 / 1000.0)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_is_text_not_markup() {
        let r = Report {
            product_id: "sku-1".into(),
            title: "<script>alert(1)</script>".into(),
            made_ms: 0,
            kept: false,
            start_ms: 0,
            end_ms: 1,
            initial_qty: 1,
            summary: Default::default(),
            seconds: Vec::new(),
            pauses: Vec::new(),
            refunds_due: Vec::new(),
        };
        let page = render(&r);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }
}
