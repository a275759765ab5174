//! `GET /api/admin/events`: every change of an order, in the order the
//! books recorded them (the outbox, `tb_event`), for the shop's systems
//! that pull.

use axum::Json;
use axum::extract::State;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::extract::{Admin, QueryParams};
use super::state::AppState;
use crate::domain::OrderStatus;
use crate::store::{EventKind, EventRow};

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
    events: Vec<EventView>,
    /// The cursor for the next page (the last event's `id`, or `after`
    /// again when there is nothing new).
    next: i64,
}

/// One change of an order.
#[derive(Serialize, ToSchema)]
pub struct EventView {
    /// Increasing; also the cursor.
    id: i64,
    #[serde(rename = "type")]
    kind: EventKind,
    /// When the books recorded it (epoch ms, MySQL's clock).
    created: i64,
    data: EventOrder,
}

/// The order, as the change left it.
#[derive(Serialize, ToSchema)]
pub struct EventOrder {
    order_id: String,
    /// What the change made it (`confirmed`, `paid`, `cancelled`; a
    /// `refund_due` leaves the order as it was, `paid` or `cancelled`, and
    /// says so only by its type).
    status: Option<OrderStatus>,
    user_id: i64,
    product_id: String,
    quantity: i64,
    price: Decimal,
}

impl From<EventRow> for EventView {
    fn from(e: EventRow) -> Self {
        let status = match e.kind {
            EventKind::Confirmed => Some(OrderStatus::Confirmed),
            EventKind::Paid => Some(OrderStatus::Paid),
            EventKind::Cancelled => Some(OrderStatus::Cancelled),
            EventKind::RefundDue => None,
        };
        Self {
            id: e.id,
            kind: e.kind,
            created: e.created,
            data: EventOrder {
                order_id: e.order_id,
                status,
                user_id: e.user_id,
                product_id: e.product_id,
                quantity: e.quantity,
                price: e.price.normalize(),
            },
        }
    }
}

/// `GET /api/admin/events`
#[utoipa::path(
    get,
    path = "/api/admin/events",
    operation_id = "list_events",
    tag = "admin",
    summary = "Every change of an order, in order (the outbox)",
    description = "Each change of an order (`order.confirmed`, `order.paid`, `order.cancelled`, `order.refund_due`) is recorded in the transaction that makes it. Pages go by the cursor `after` (the last page's `next`). An event is listed once it is `DB_TIMEOUT_MS` + 1 s old, so that a transaction still open when a later one committed cannot be skipped by a reader's cursor.",
    params(EventParams),
    security(("admin" = [])),
    responses(
        (status = 200, description = "OK", body = EventPage),
        (status = 400, description = "`invalid_request`: a limit outside 1..=1000, a negative cursor", body = ErrorBody),
    )
)]
pub async fn list(
    _: Admin,
    State(state): State<AppState>,
    QueryParams(params): QueryParams<EventParams>,
) -> Result<Json<EventPage>, ApiError> {
    let after = params.after.unwrap_or(0);
    let limit = params.limit.unwrap_or(100);
    if after < 0 || limit == 0 || limit > MAX_EVENTS {
        return Err(ApiError::InvalidRequest(format!(
            "after must be at least 0, limit between 1 and {MAX_EVENTS}"
        )));
    }
    let events: Vec<EventView> = state
        .db
        .events_after(after, limit)
        .await?
        .into_iter()
        .map(EventView::from)
        .collect();
    let next = events.last().map_or(after, |e| e.id);
    Ok(Json(EventPage { events, next }))
}
