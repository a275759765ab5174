//! Orders: placed by one script call in Redis ([`place`]), looked up in
//! Redis or MySQL, paid and cancelled through the books (here).

pub mod place;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{OptionalJsonBody, PathParam, QueryParams};
use super::state::AppState;
use crate::books::{BooksError, Cancelled, Found};
use crate::domain::{OrderId, OrderStatus, PendingOrder, ProductId, UserId};
use crate::sale::Progress;
use crate::store::OrderRow;

/// An order as clients see it.
#[derive(Serialize, ToSchema)]
pub struct OrderView {
    order_id: String,
    /// `pending` (accepted, in the stream) until a worker persists it, then
    /// `confirmed`; `paid` or `cancelled` later (`cancelling` while a cancel
    /// waits for the order to be persisted).
    status: OrderStatus,
    user_id: u64,
    product_id: String,
    quantity: u64,
    price: Decimal,
    created: i64,
    /// Present (`true`) only when MySQL was unavailable and the order was
    /// answered from Redis: `status` is then the last state Redis knows
    /// (`pending`, `confirmed`, `cancelling` or `cancelled`; a payment is
    /// known to MySQL only). Ask again later for the books' answer.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    provisional: bool,
}

impl OrderView {
    /// An order as Redis last knew it, while MySQL cannot say more.
    fn provisional(order: PendingOrder, progress: Progress) -> Self {
        let status = match progress {
            Progress::Queued | Progress::DeadLettered => OrderStatus::Pending,
            Progress::Persisted => OrderStatus::Confirmed,
            Progress::CancelRequested => OrderStatus::Cancelling,
            Progress::Released => OrderStatus::Cancelled,
        };
        Self {
            status,
            provisional: true,
            ..order.into()
        }
    }
}

impl OrderView {
    /// The view as JSON, byte for byte what serde writes, written straight
    /// into its buffer when its strings need no escaping (ids are
    /// validated, so they never do; anything else goes through serde): the
    /// body of every 202 (BENCHMARKS.md, "What does an accepted order cost?").
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let plain = |s: &str| s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
        if !(plain(&self.order_id) && plain(&self.product_id)) {
            // Serializing plain fields into memory does not fail.
            return serde_json::to_vec(self).unwrap_or_default();
        }
        let mut out = String::with_capacity(128 + self.order_id.len() + self.product_id.len());
        let mut number = itoa::Buffer::new();
        out.push_str("{\"order_id\":\"");
        out.push_str(&self.order_id);
        out.push_str("\",\"status\":\"");
        out.push_str(self.status.as_str());
        out.push_str("\",\"user_id\":");
        out.push_str(number.format(self.user_id));
        out.push_str(",\"product_id\":\"");
        out.push_str(&self.product_id);
        out.push_str("\",\"quantity\":");
        out.push_str(number.format(self.quantity));
        out.push_str(",\"price\":\"");
        // Writing into a String does not fail.
        let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{}", self.price));
        out.push_str("\",\"created\":");
        out.push_str(number.format(self.created));
        if self.provisional {
            out.push_str(",\"provisional\":true");
        }
        out.push('}');
        out.into_bytes()
    }
}

impl From<PendingOrder> for OrderView {
    fn from(o: PendingOrder) -> Self {
        Self {
            order_id: o.order_id.into_string(),
            status: OrderStatus::Pending,
            user_id: o.user_id.get(),
            product_id: o.product_id.into_string(),
            quantity: o.quantity.get(),
            price: o.price,
            created: o.created_ms,
            provisional: false,
        }
    }
}

impl From<OrderRow> for OrderView {
    fn from(o: OrderRow) -> Self {
        Self {
            order_id: o.order_id,
            status: o.status,
            user_id: o.user_id as u64,
            product_id: o.product_id,
            quantity: o.quantity as u64,
            price: o.price.normalize(),
            created: o.created,
            provisional: false,
        }
    }
}

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
/// Wherever the order is (`Books::find`): while MySQL is unavailable, an
/// order Redis holds is answered from Redis, marked `provisional`, rather
/// than with a 503. Another buyer's order is answered as if it did not exist.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(order_id): PathParam<String>,
) -> Result<Json<OrderView>, ApiError> {
    let (order_id, product) = OrderId::parse(&order_id).ok_or(ApiError::OrderNotFound)?;
    let view = match state.books.find(&order_id, &product).await? {
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
    State(state): State<AppState>,
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
        .books
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
    pub(super) user_id: Option<u64>,
}

/// What a pay or cancel acts on: the user it acts as, and the order.
fn target(
    caller: Caller,
    body: Option<Owner>,
    order_id: &str,
) -> Result<(UserId, OrderId, ProductId), ApiError> {
    let user = caller.acting_as(body.and_then(|b| b.user_id))?;
    let (id, product) = OrderId::parse(order_id).ok_or(ApiError::OrderNotFound)?;
    Ok((user, id, product))
}

/// The refusal for someone else's order: with a verified buyer, a 404 (no
/// hint that the order exists).
fn hide_strangers(caller: Caller, e: BooksError) -> ApiError {
    match (caller, e) {
        (Caller::Buyer(_), BooksError::Forbidden) => ApiError::OrderNotFound,
        (_, e) => e.into(),
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
pub async fn pay(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(order_id): PathParam<String>,
    OptionalJsonBody(body): OptionalJsonBody<Owner>,
) -> Result<Json<OrderView>, ApiError> {
    let (user, id, product) = target(caller, body, &order_id)?;
    let row = state
        .books
        .pay(&id, &product, user)
        .await
        .map_err(|e| hide_strangers(caller, e))?;
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
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(order_id): PathParam<String>,
    OptionalJsonBody(body): OptionalJsonBody<Owner>,
) -> Result<Response, ApiError> {
    let (user, id, product) = target(caller, body, &order_id)?;
    let cancelled = state
        .books
        .cancel(&id, &product, Some(user))
        .await
        .map_err(|e| hide_strangers(caller, e))?;
    Ok(match cancelled {
        Cancelled::Done(row) => {
            // The sale's timeline: a buyer's cancel, once (a retry is Again).
            state
                .metrics
                .timeline
                .count(product.as_str(), "cancelled", 1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orders_json_is_what_serde_writes() {
        let view = |order_id: &str, product_id: &str, status, provisional| OrderView {
            order_id: order_id.into(),
            status,
            user_id: 9_223_372_036_854_775_807,
            product_id: product_id.into(),
            quantity: 3,
            price: "4999.50".parse().unwrap(),
            created: 1_796_003_647_270,
            provisional,
        };
        for v in [
            view("sku-1:01a22a28cf25", "sku-1", OrderStatus::Pending, false),
            view("a:b", "a", OrderStatus::Cancelling, true),
            view("x", "é-ü", OrderStatus::Paid, false),
            // Strings that need escaping take serde's way.
            view("q\"uote", "back\\slash", OrderStatus::Confirmed, false),
            view("tab\tbed", "p", OrderStatus::Cancelled, true),
        ] {
            assert_eq!(
                String::from_utf8(v.to_json()).unwrap(),
                serde_json::to_string(&v).unwrap()
            );
        }
        let mut zero = view("o", "p", OrderStatus::Pending, false);
        zero.price = Decimal::ZERO;
        zero.created = -1;
        assert_eq!(zero.to_json(), serde_json::to_vec(&zero).unwrap());
    }
}
