//! `GET /api/admin/events`: every change of an order, in the order the
//! books recorded them (the outbox, `tb_event`), for the shop's systems
//! that pull.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::state::Operators;
use crate::bookkeeping::EventMessage;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{Admin, QueryParams};
use crate::store::DeadEvent;

const MAX_EVENTS: u32 = 1000;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// The cursor: events after this one (the last page's `next`; 0 or
    /// absent: from the first).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of events.
#[derive(Serialize, ToSchema)]
pub struct EventPage {
    events: Vec<EventMessage>,
    /// The cursor for the next page (the last event's `id`, or `after`
    /// again when there is nothing new).
    next: i64,
}

/// `GET /api/admin/events`
#[utoipa::path(
    get,
    path = "/api/admin/events",
    operation_id = "list_events",
    tag = "admin",
    summary = "Every change of an order, in order (the outbox)",
    description = "Each change of an order (`order.confirmed`, `order.paid`, `order.cancelled`, `order.refund_due`) and of a sale (`sale.sold_out`, `sale.ended`, `sale.retired`) is recorded in the transaction that makes it. Ids increase (with gaps: the events of one transaction that changed many orders share a stored row, and an id is that row's × 10,000 + the place in it). Pages go by the cursor `after` (the last page's `next`). An event is listed once it is `DB_TIMEOUT_MS` + 1 s old, so that a transaction still open when a later one committed cannot be skipped by a reader's cursor.",
    params(EventParams),
    security(("admin" = [])),
    responses(
        (status = 200, description = "OK", body = EventPage),
        (status = 400, description = "`invalid_request`: a limit outside 1..=1000, a negative cursor", body = ErrorBody),
    )
)]
pub async fn list(
    _: Admin,
    State(state): State<Operators>,
    QueryParams(params): QueryParams<EventParams>,
) -> Result<Json<EventPage>, ApiError> {
    let after = params.after.unwrap_or(0);
    let limit = params.limit.unwrap_or(100);
    if after < 0 || limit == 0 || limit > MAX_EVENTS {
        return Err(ApiError::InvalidRequest(format!(
            "after must be at least 0, limit between 1 and {MAX_EVENTS}"
        )));
    }
    let events: Vec<EventMessage> = state.desk.outbox.after(after, limit).await?;
    let next = events.last().map_or(after, |e| e.id);
    Ok(Json(EventPage { events, next }))
}

/// The dead letters: events that exhausted their delivery attempts.
#[derive(Serialize, ToSchema)]
pub struct DeadLetters {
    dead: Vec<DeadEvent>,
}

/// `GET /api/admin/events/dead`
#[utoipa::path(
    get,
    path = "/api/admin/events/dead",
    operation_id = "list_dead_events",
    tag = "admin",
    summary = "Events whose delivery to the shop's endpoint gave up",
    security(("admin" = [])),
    responses((status = 200, description = "OK (at most 1,000, oldest first)", body = DeadLetters))
)]
pub async fn dead(_: Admin, State(state): State<Operators>) -> Result<Json<DeadLetters>, ApiError> {
    Ok(Json(DeadLetters {
        dead: state.desk.outbox.dead().await?,
    }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplayParams {
    /// Only this event (absent: every dead letter).
    event_id: Option<i64>,
}

/// How many dead letters will be delivered again.
#[derive(Serialize, ToSchema)]
pub struct Replaying {
    replaying: u64,
}

/// `POST /api/admin/events/dead/replay`
#[utoipa::path(
    post,
    path = "/api/admin/events/dead/replay",
    operation_id = "replay_dead_events",
    tag = "admin",
    summary = "Deliver dead letters again",
    description = "The workers' delivery tries each once per pass (beside the events in order) until it goes through; then it leaves the dead letters.",
    params(ReplayParams),
    security(("admin" = [])),
    responses((status = 200, description = "OK", body = Replaying))
)]
pub async fn replay(
    _: Admin,
    State(state): State<Operators>,
    QueryParams(params): QueryParams<ReplayParams>,
) -> Result<Json<Replaying>, ApiError> {
    Ok(Json(Replaying {
        replaying: state.desk.outbox.replay(params.event_id).await?,
    }))
}
