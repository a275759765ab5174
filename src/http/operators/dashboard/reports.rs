//! The past sales: `GET /admin/dashboard/reports`, the index of the kept
//! reports (newest first, a page at a time), each a link to its report;
//! `GET /admin/dashboard/reports/compare?sale=A&sale=B`, sales' figures
//! side by side; `GET /admin/dashboard/reports.csv` (`?sale=` to pick), the
//! summaries as CSV, a row per sale. The index reads each report's figures
//! without its timeline (`tb_sale_report.summary`).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::board::Dashboard;
use super::chart::when;
use super::door::PageSignedIn;
use super::report::figures;
use crate::bookkeeping::Report;
use crate::bookkeeping::report::summaries_csv;
use crate::domain::ProductId;
use crate::http::error::ApiError;
use crate::http::pages::html;

/// Reports a page of the index lists.
const PAGE: u32 = 50;

/// Sales a comparison or a CSV takes at most.
const PICKED: usize = 6;

/// The query's values of `name`, in order (`sale=a&sale=b`).
fn values(query: Option<&str>, name: &str) -> Vec<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// The reports of the sales picked (`sale=`): each kept one, or one made
/// now; an id that is no sale is a 404.
async fn picked(dashboard: &Dashboard, ids: &[String]) -> Result<Vec<Report>, Response> {
    let mut out = Vec::new();
    for id in ids.iter().take(PICKED) {
        let Ok(id) = ProductId::parse(id) else {
            return Err(ApiError::ProductNotFound("no product with this id").into_response());
        };
        match dashboard.desk.reports.report(&id).await {
            Ok(r) => out.push(r.without_timeline()),
            Err(e) => return Err(ApiError::from(e).into_response()),
        }
    }
    Ok(out)
}

pub(super) async fn index(
    State(dashboard): State<Arc<Dashboard>>,
    _: PageSignedIn,
    RawQuery(query): RawQuery,
) -> Response {
    let before = values(query.as_deref(), "before")
        .first()
        .and_then(|b| b.parse::<i64>().ok());
    match dashboard.desk.reports.kept(before, PAGE).await {
        Ok(kept) => html(
            StatusCode::OK,
            render_index(&kept, kept.len() == PAGE as usize),
        ),
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub(super) async fn compare(
    State(dashboard): State<Arc<Dashboard>>,
    _: PageSignedIn,
    RawQuery(query): RawQuery,
) -> Response {
    match picked(&dashboard, &values(query.as_deref(), "sale")).await {
        Ok(reports) => html(StatusCode::OK, render_compare(&reports)),
        Err(refused) => refused,
    }
}

pub(super) async fn csv(
    State(dashboard): State<Arc<Dashboard>>,
    _: PageSignedIn,
    RawQuery(query): RawQuery,
) -> Response {
    let ids = values(query.as_deref(), "sale");
    let reports = match ids.is_empty() {
        true => match dashboard.desk.reports.kept(None, PAGE).await {
            Ok(kept) => kept,
            Err(e) => return ApiError::from(e).into_response(),
        },
        false => match picked(&dashboard, &ids).await {
            Ok(reports) => reports,
            Err(refused) => return refused,
        },
    };
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"sales-summary.csv\"",
            ),
        ],
        summaries_csv(&reports),
    )
        .into_response()
}

/// A page's head and header.
fn page(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                link rel="stylesheet" href="/admin/assets/dashboard.css";
            }
            body.report {
                header {
                    h1 { (title) }
                    p {
                        a href="/admin/dashboard" { "back to the dashboard" }
                        " · "
                        a href="/admin/dashboard/reports" { "past sales" }
                    }
                }
                main { (body) }
            }
        }
    }
    .into_string()
}

fn render_index(kept: &[Report], more: bool) -> String {
    let body = html! {
        p.note {
            "Each sale's report, kept when it retired, newest first. Tick two or more to see them side by side. "
            a href="/admin/dashboard/reports.csv" { "These as CSV" }
        }
        @if kept.is_empty() {
            p #no-reports { "No sale has retired yet." }
        } @else {
            form method="get" action="/admin/dashboard/reports/compare" {
                table #reports {
                    tr {
                        th { "compare" } th { "sale" } th { "retired" } th { "units sold" }
                        th { "sold out after" } th { "buyers who paid" } th { "revenue" } th { "books" }
                    }
                    @for r in kept {
                        @let s = &r.summary;
                        tr data-product=(r.product_id) {
                            td { input type="checkbox" name="sale" value=(r.product_id) aria-label={ "compare " (r.product_id) }; }
                            td {
                                a href={ "/admin/dashboard/report/" (r.product_id) } { (r.product_id) }
                                " " span.muted { (r.title) }
                            }
                            td { (when(r.made_ms)) }
                            td { (s.units_sold) " of " (r.initial_qty) }
                            td { (s.sold_out_after_ms.map_or("–".into(), crate::bookkeeping::report::span)) }
                            td { (s.funnel.paid) }
                            td { (s.money.currency.as_deref().unwrap_or("")) " " (s.money.revenue) }
                            td { @if s.books_ok { "balanced" } @else { strong { "MISMATCH" } } }
                        }
                    }
                }
                button #compare type="submit" { "Side by side" }
            }
            @if more {
                @if let Some(last) = kept.last() {
                    p { a #older href={ "/admin/dashboard/reports?before=" (last.made_ms) } { "Older sales" } }
                }
            }
        }
    };
    page("Past sales", body)
}

fn render_compare(reports: &[Report]) -> String {
    let columns: Vec<Vec<(&'static str, String)>> = reports.iter().map(figures).collect();
    // Every figure any of them has, in the order the report shows them (a
    // sale without a room lacks a few).
    let mut names: Vec<&'static str> = Vec::new();
    for (name, _) in columns.iter().flatten() {
        if !names.contains(name) {
            names.push(name);
        }
    }
    let query: Vec<String> = reports
        .iter()
        .map(|r| format!("sale={}", r.product_id))
        .collect();
    let body = html! {
        @if reports.is_empty() {
            p { "Pick sales to compare on " a href="/admin/dashboard/reports" { "the past sales" } "." }
        } @else {
            table #side-by-side {
                tr {
                    th {}
                    @for r in reports {
                        th data-product=(r.product_id) {
                            a href={ "/admin/dashboard/report/" (r.product_id) } { (r.product_id) }
                            br; span.muted { (r.title) }
                        }
                    }
                }
                tr { th { "On sale" } @for r in reports { td { (r.initial_qty) } } }
                tr { th { "Window" } @for r in reports { td { (when(r.start_ms)) " – " (when(r.end_ms)) } } }
                @for name in &names {
                    tr {
                        th { (name) }
                        @for c in &columns {
                            td { (c.iter().find(|(k, _)| k == name).map_or("–", |(_, v)| v.as_str())) }
                        }
                    }
                }
            }
            p { a href={ "/admin/dashboard/reports.csv?" (query.join("&")) } { "These as CSV" } }
        }
    };
    page("Sales side by side", body)
}
