//! Liveness and readiness.

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};

use super::state::Buyers;
use crate::http::error::ApiError;

/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "health", responses((status = 200, description = "Up", body = Object)))]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Redis and MySQL both answer, and MySQL takes writes (a read-only
/// server, a replica not promoted yet, is not ready); 503 `unavailable`
/// otherwise. With `?for=orders`, ready to take orders: Redis answers, and
/// the books were reached and migrated once since the start (a process
/// that never reached them, a wrong `DATABASE_URL`, is not ready), however
/// MySQL answers now: the order path needs only Redis, so a load balancer
/// keeps routing orders through an outage of the books (the answer says
/// how MySQL is).
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "health",
    params(("for" = Option<String>, Query, description = "`orders`: ready to take orders (Redis answers, the books were migrated once), whatever MySQL answers now")),
    responses(
        (status = 200, description = "Redis and MySQL answer, and MySQL takes writes (with `for=orders`: Redis answers and the books were migrated once)", body = Object),
        (status = 400, description = "`invalid_request`: an unknown `for`", body = crate::http::error::ErrorBody),
        (status = 503, description = "`unavailable`: not ready", body = crate::http::error::ErrorBody),
    ))]
pub async fn readyz(
    State(state): State<Buyers>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let for_orders = match query.as_deref() {
        None | Some("") => false,
        Some("for=orders") => true,
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "the only query /readyz takes is `for=orders`".into(),
            ));
        }
    };
    let (redis, mysql) = state.order_life.ping().await;
    redis?;
    if !for_orders {
        mysql?;
        return Ok(Json(
            json!({"status": "ready", "redis": "ok", "mysql": "ok"}),
        ));
    }
    if !state.order_life.books_migrated() {
        return Err(ApiError::Unavailable(
            "the books have not been reached since the start".into(),
        ));
    }
    let mysql = match mysql {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("unavailable: {}", crate::domain::Chain(&e)),
    };
    Ok(Json(
        json!({"status": "ready", "for": "orders", "redis": "ok", "mysql": mysql}),
    ))
}
