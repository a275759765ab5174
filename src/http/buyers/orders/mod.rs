//! Orders: placed by one script call in Redis ([`place`]), looked up in
//! Redis or MySQL, paid and cancelled through the books (here).

pub mod place;
mod view;

pub use view::OrderView;

use axum::Json;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::state::Buyers;
use crate::bookkeeping::{BookkeepingError, Cancelled, Found};
use crate::domain::{OrderId, OrderStatus, ProductId, UserId};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{JsonBody, PathParam, QueryParams, Verifier};
use crate::metrics::timeline::Count;

/// `GET /api/orders/{order_id}`.
#[utoipa::path(
    get,
    path = "/api/orders/{order_id}",
    operation_id = "get_order",
    tag = "orders",
    summary = "Look one of your orders up",
    params(("order_id" = String, Path)),
    security(("buyer" = [])),
    responses(
        (status = 200, description = "OK (`provisional` while MySQL is unavailable)", body = OrderView),
        (status = 404, description = "`order_not_found`: no such order, or another buyer's", body = ErrorBody),
        (status = 503, description = "`unavailable`: MySQL is unavailable and Redis does not hold the order", body = ErrorBody),
    )
)]
///
/// Wherever the order is (`OrderLife::find`): while MySQL is unavailable, an
/// order Redis holds is answered from Redis, marked `provisional`, rather
/// than with a 503. Another buyer's order is answered as if it did not exist.
pub async fn get(
    State(state): State<Buyers>,
    caller: Caller,
    PathParam(order_id): PathParam<String>,
) -> Result<Json<OrderView>, ApiError> {
    let (order_id, product) = OrderId::parse(&order_id).ok_or(ApiError::OrderNotFound)?;
    let view = match state.order_life.find(&order_id, &product).await? {
        Found::Booked(row) => row.into(),
        Found::Pending(order) => order.into(),
        Found::Provisional(order, progress) => OrderView::provisional(order, progress),
    };
    if UserId::new(view.user_id).is_ok_and(|owner| !caller.may_see(owner)) {
        return Err(ApiError::OrderNotFound);
    }
    Ok(Json(view))
}

/// Most orders one listing returns.
const MAX_LIST: u32 = 200;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// At most this many orders (default 50, at most 200).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// Only orders created before this time (epoch ms): the next page starts
    /// at the last order's `created`.
    before: Option<i64>,
}

/// A page of a user's orders.
#[derive(Serialize, ToSchema)]
pub struct UserOrders {
    user_id: u64,
    orders: Vec<OrderView>,
}

/// `GET /api/users/{user_id}/orders`: a user's persisted orders, newest first.
/// Orders still `pending` in a stream are not listed yet.
#[utoipa::path(
    get,
    path = "/api/users/{user_id}/orders",
    operation_id = "list_user_orders",
    tag = "orders",
    summary = "Your persisted orders, newest first",
    params(("user_id" = u64, Path, minimum = 1), ListParams),
    security(("buyer" = [])),
    responses(
        (status = 200, description = "OK", body = UserOrders),
        (status = 403, description = "`forbidden`: another buyer's orders", body = ErrorBody),
    )
)]
pub async fn list_for_user(
    State(state): State<Buyers>,
    caller: Caller,
    PathParam(user_id): PathParam<u64>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<UserOrders>, ApiError> {
    let user_id = UserId::new(user_id)?;
    if !caller.may_see(user_id) {
        return Err(ApiError::Forbidden(
            "a buyer may list only their own orders",
        ));
    }
    let limit = params.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_LIST {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be between 1 and {MAX_LIST}"
        )));
    }
    let rows = state
        .order_life
        .orders_of_user(user_id, params.before, limit)
        .await?;
    let orders: Vec<OrderView> = rows.into_iter().map(OrderView::from).collect();
    Ok(Json(UserOrders {
        user_id: user_id.get(),
        orders,
    }))
}

/// The body of pay and cancel: who asks. Optional: the verified identity is
/// used (a `user_id` given must be it); required only with `AUTH=none`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_i64)]
    pub(crate) user_id: Option<u64>,
}

/// What a pay or cancel acts on: the order its path names, and the user it
/// acts as (the verified buyer; with `AUTH=none`, the body's [`Owner`]).
pub struct OwnOrder {
    caller: Caller,
    user: UserId,
    id: OrderId,
    product: ProductId,
}

impl<S> FromRequest<S> for OwnOrder
where
    S: Send + Sync,
    Verifier: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (mut parts, body) = req.into_parts();
        let caller = Caller::from_request_parts(&mut parts, state).await?;
        let PathParam(order_id) =
            PathParam::<String>::from_request_parts(&mut parts, state).await?;
        let req = Request::from_parts(parts, body);
        let JsonBody(owner) = JsonBody::<Option<Owner>>::from_request(req, state).await?;
        let user = caller.acting_as(owner.and_then(|b| b.user_id))?;
        let (id, product) = OrderId::parse(&order_id).ok_or(ApiError::OrderNotFound)?;
        Ok(Self {
            caller,
            user,
            id,
            product,
        })
    }
}

impl OwnOrder {
    /// The refusal for someone else's order: with a verified buyer, a 404
    /// (no hint that the order exists).
    fn refusal(&self, e: BookkeepingError) -> ApiError {
        match (self.caller, e) {
            (Caller::Buyer(_), BookkeepingError::Forbidden) => ApiError::OrderNotFound,
            (_, e) => e.into(),
        }
    }
}

/// `POST /api/orders/{order_id}/pay`: records that the owner paid.
/// `confirmed` → `paid`; repeating it answers the paid order again.
#[utoipa::path(
    post,
    path = "/api/orders/{order_id}/pay",
    operation_id = "pay_order",
    tag = "orders",
    summary = "Mark a confirmed order paid (local trials only)",
    description = "Served only with `AUTH=none` and no `PAYMENT_WEBHOOK_SECRETS`: a buyer marking an order paid without paying, for trying the service by hand. Anywhere else this route answers 404 `not_found`, and an order becomes `paid` only through a signed notification from the payment side (`POST /api/payments/notifications`).",
    params(("order_id" = String, Path)),
    request_body = Option<Owner>,
    security(("buyer" = [])),
    responses(
        (status = 200, description = "Paid (again: idempotent)", body = OrderView),
        (status = 403, description = "`forbidden`: `user_id` is not the authenticated buyer (or, with `AUTH=none`, not the order's)", body = ErrorBody),
        (status = 404, description = "`order_not_found`: no such order, or another buyer's", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: pending, cancelled or otherwise not payable", body = ErrorBody),
    )
)]
pub async fn pay(State(state): State<Buyers>, own: OwnOrder) -> Result<Json<OrderView>, ApiError> {
    let row = state
        .order_life
        .pay(&own.id, &own.product, own.user)
        .await
        .map_err(|e| own.refusal(e))?;
    Ok(Json(row.into()))
}

/// `POST /api/orders/{order_id}/cancel`: the owner gives the order up; its
/// units go back on sale. 200 with the cancelled order; 202 with status
/// `cancelling` when the order is still pending (applied once persisted).
#[utoipa::path(
    post,
    path = "/api/orders/{order_id}/cancel",
    operation_id = "cancel_order",
    tag = "orders",
    summary = "Cancel an order; its units go back on sale",
    params(("order_id" = String, Path)),
    request_body = Option<Owner>,
    security(("buyer" = [])),
    responses(
        (status = 200, description = "Cancelled (again: idempotent)", body = OrderView),
        (status = 202, description = "Still pending: status `cancelling`, applied once persisted", body = OrderView),
        (status = 403, description = "`forbidden`: `user_id` is not the authenticated buyer (or, with `AUTH=none`, not the order's)", body = ErrorBody),
        (status = 404, description = "`order_not_found`: no such order, or another buyer's", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: already paid", body = ErrorBody),
    )
)]
pub async fn cancel(State(state): State<Buyers>, own: OwnOrder) -> Result<Response, ApiError> {
    let cancelled = state
        .order_life
        .cancel(&own.id, &own.product, Some(own.user))
        .await
        .map_err(|e| own.refusal(e))?;
    Ok(match cancelled {
        Cancelled::Done(row) => {
            // The sale's timeline: a buyer's cancel, once (a retry is Again).
            state
                .metrics
                .timeline
                .count(own.product.as_str(), Count::Cancelled, 1);
            Json(OrderView::from(row)).into_response()
        }
        Cancelled::Again(row) => Json(OrderView::from(row)).into_response(),
        Cancelled::Requested(order) => {
            let mut view = OrderView::from(order);
            view.status = OrderStatus::Cancelling;
            (StatusCode::ACCEPTED, Json(view)).into_response()
        }
    })
}
