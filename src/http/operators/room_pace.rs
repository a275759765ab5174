//! A waiting room's bounds, changed live by an operator.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::admin_log::Before;
use super::state::Operators;
use crate::domain::BoundsChange;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{Admin, JsonBody, SalePath};

/// New bounds for a room's pace (each one left out: kept).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoomPace {
    /// The ceiling: places admitted per second at most; the pace at once.
    /// Also accepted as `admit_per_sec`, its earlier name: deprecated (that
    /// is the pace's word), refused from 0.3.0.
    #[serde(alias = "admit_per_sec")]
    #[schema(minimum = 1, maximum = 100_000)]
    ceiling_per_sec: Option<u32>,
    /// The floor the pace drops to while the backend is strained (at most
    /// the ceiling). Also accepted as `admit_floor_per_sec` (deprecated,
    /// refused from 0.3.0).
    #[serde(alias = "admit_floor_per_sec")]
    #[schema(minimum = 1, maximum = 100_000)]
    floor_per_sec: Option<u32>,
    /// The most buyers holding an unused admission; 0: no cap.
    #[schema(minimum = 0, maximum = 10_000_000)]
    active_cap: Option<u32>,
    /// Bits of proof of work a join costs; 0: none.
    #[schema(minimum = 0, maximum = 24)]
    join_difficulty: Option<u8>,
}

/// The room after a change.
#[derive(Serialize, ToSchema)]
pub struct RoomView {
    product_id: String,
    /// The pace now (buyers per second).
    admit_per_sec: f64,
    /// The bounds the pace keeps to.
    ceiling_per_sec: u32,
    floor_per_sec: u32,
    /// The most buyers holding an unused admission (null: no cap), and how
    /// many do.
    active_cap: Option<u64>,
    active: u64,
    /// Bits of proof of work a join costs (0: none).
    join_difficulty: u8,
    /// Buyers who joined.
    joined: u64,
    /// Places admitted so far.
    admitted: u64,
}

/// `POST /api/admin/products/{product_id}/room`: the room's bounds, live.
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/room",
    operation_id = "set_room_pace",
    tag = "admin",
    summary = "Change a waiting room's pace bounds, live",
    description = "Any of the ceiling (`ceiling_per_sec`, the pace at once), the floor the pace drops to under strain (`floor_per_sec`), the active cap (`active_cap`, 0: none) and the join difficulty (`join_difficulty`, bits, 0: none); the others are kept. A floor above the ceiling is lowered to it.",
    params(SalePath),
    request_body = RoomPace,
    security(("admin" = [])),
    responses(
        (status = 200, description = "The new bounds hold from now on", body = RoomView),
        (status = 400, description = "`invalid_request`: a bound out of range, or none given", body = ErrorBody),
        (status = 404, description = "`product_not_found` or `no_waiting_room`", body = ErrorBody),
    )
)]
pub async fn set_pace(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
    JsonBody(body): JsonBody<RoomPace>,
) -> Result<Response, ApiError> {
    let product = id;
    let change = BoundsChange::new(
        body.ceiling_per_sec,
        body.floor_per_sec,
        body.active_cap,
        body.join_difficulty,
    )?;
    // For the admin log: the bounds as the books held them.
    let before = super::before::room_bounds(&state.desk.catalog, &product).await;
    let Some(room) = state.desk.catalog.set_room_bounds(&product, change).await? else {
        return Err(ApiError::NoWaitingRoom);
    };
    let mut answer = Json(RoomView {
        product_id: product.to_string(),
        admit_per_sec: room.pace,
        ceiling_per_sec: room.ceiling,
        floor_per_sec: room.floor,
        active_cap: room.cap,
        active: room.active,
        join_difficulty: room.join_difficulty,
        joined: room.joined(),
        admitted: room.admitted_places(),
    })
    .into_response();
    if let Some(before) = before {
        answer.extensions_mut().insert(Before(before));
    }
    Ok(answer)
}
