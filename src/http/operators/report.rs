//! A sale's report (see `bookkeeping::report`): JSON, its timeline as CSV; the
//! dashboard draws it (`dashboard::report`).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::state::Operators;
use crate::bookkeeping::Report;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{Admin, SalePath};

/// `GET /api/admin/products/{product_id}/report`
#[utoipa::path(
    get,
    path = "/api/admin/products/{product_id}/report",
    operation_id = "sale_report",
    tag = "admin",
    summary = "How a sale went: its figures and its timeline",
    description = "Live while the sale runs (made now from its timeline and its books); once it retired, the report kept then, with its final audit. What each figure means and how exact it is: docs/report.md.",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The report: `summary` (time to sell out, peak, funnel, wait in line, refusals, payments, latency, the books' verdict) and `seconds` (the timeline)", body = Object),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn json(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<Report>, ApiError> {
    Ok(Json(state.desk.reports.report(&id).await?))
}

/// `GET /api/admin/products/{product_id}/report/csv`
#[utoipa::path(
    get,
    path = "/api/admin/products/{product_id}/report/csv",
    operation_id = "sale_report_csv",
    tag = "admin",
    summary = "A sale's timeline as CSV, a row per second",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "`second,accepted,refused,units,latency_p50_us,latency_p99_us,joins,line,pace,ceiling,persisted,persist_wait_max_ms,paid,timed_out,events_delivered,expired,returned,restocked,admitted`", content_type = "text/csv", body = String),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn csv(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Response, ApiError> {
    let report = state.desk.reports.report(&id).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}-report.csv\"", id.as_str()),
            ),
        ],
        report.csv(),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use crate::bookkeeping::report::CSV_COLUMNS;

    #[test]
    fn the_api_document_names_the_csv_columns_as_written() {
        let doc = serde_json::to_value(crate::http::openapi::document()).unwrap();
        let csv = &doc["paths"]["/api/admin/products/{product_id}/report/csv"]["get"];
        let said = csv["responses"]["200"]["description"].as_str().unwrap();
        assert_eq!(said, format!("`{CSV_COLUMNS}`"));
    }
}
