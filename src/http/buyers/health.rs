//! Liveness and readiness.

use axum::Json;
use axum::extract::State;
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
/// otherwise.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "health", responses((status = 200, description = "Redis and MySQL answer, and MySQL takes writes", body = Object)))]
pub async fn readyz(State(state): State<Buyers>) -> Result<Json<Value>, ApiError> {
    let (redis, mysql) = state.order_life.ping().await;
    redis?;
    mysql?;
    Ok(Json(
        json!({"status": "ready", "redis": "ok", "mysql": "ok"}),
    ))
}
