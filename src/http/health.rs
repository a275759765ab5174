//! Liveness and readiness.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::{AppState, error::ApiError};

/// The process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Redis and MySQL both answer; 503 `unavailable` otherwise.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let (redis, mysql) = tokio::join!(state.sales.redis().ping(), state.db.ping());
    redis?;
    mysql?;
    Ok(Json(
        json!({"status": "ready", "redis": "ok", "mysql": "ok"}),
    ))
}
