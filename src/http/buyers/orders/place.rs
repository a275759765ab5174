//! `POST /api/orders`: one Redis round trip, answered at once with 202.
//! Served straight from the connection ([`endpoint`]) so that the order path
//! skips the router.

use std::net::SocketAddr;
use std::time::Instant;

use axum::BoxError;
use axum::body::{Bytes, HttpBody};
use axum::extract::{FromRequestParts, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::view::OrderView;
use crate::domain::answer::{Code, Outcome};
use crate::domain::{ProductId, Quantity, UserId};
use crate::http::auth::Caller;
use crate::http::buyers::state::Buyers;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{self, IdempotencyKey};
use crate::http::transport::limits;
use crate::metrics::AnsweredBy;
use crate::metrics::timeline::Answered;
use crate::sale::room::{Admission, AdmissionRefused};
use crate::sale::{self, Decision, Keyed, NewOrder, Placed, Rejection, Vouched};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaceOrder {
    /// The buyer: optional, the verified identity is used; when given it
    /// must be that identity (403 otherwise). Required only with `AUTH=none`.
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_i64)]
    user_id: Option<u64>,
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9._-]+$",
        example = "sku-1"
    )]
    product_id: String,
    #[schema(minimum = 1, maximum = 1_000_000)]
    quantity: u64,
}

/// Set (`true`) on an order answered again under its Idempotency-Key.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `POST /api/orders`: one Redis round trip, answered at once with 202.
#[utoipa::path(
    post,
    path = "/api/orders",
    operation_id = "place_order",
    tag = "orders",
    summary = "Place an order",
    description = "Decided by one atomic script in Redis and answered at once: 202 with the order `pending` until a worker persists it. The buyer is the authenticated one. A retry with the same `Idempotency-Key` (the buyer's own: keys of different buyers never meet) answers the same order (header `Idempotent-Replayed: true`).",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "1-128 visible ASCII characters; retries with it answer the first order"),
        ("Admission-Token" = Option<String>, Header, description = "For a sale with a waiting room: the `admission` its waiting room gave this buyer (`GET /api/sales/{product_id}/queue/{ticket}`)"),
    ),
    request_body = PlaceOrder,
    security(("buyer" = [])),
    responses(
        (status = 202, description = "Accepted; persisted shortly. A retry under the same Idempotency-Key answers the first order (`Idempotent-Replayed: true`), after the sale's retirement too: then from the books, with the order's status now", body = OrderView),
        (status = 403, description = "`forbidden`: `user_id` is not the authenticated buyer; `admission_required`: the sale has a waiting room and the order has no valid admission for this buyer and sale; `admission_expired`", body = ErrorBody),
        (status = 404, description = "`product_not_found`: no sale for this product (never opened, or retired after it ended)", body = ErrorBody),
        // The codes are named from the script's table (`openapi.rs`).
        (status = 409, description = "Refused by the sale", body = ErrorBody,
            headers(("Retry-After" = u64, description = "`sale_not_started`: seconds until the sale opens; `sale_paused`: when to look again"))),
        (status = 422, description = "`idempotency_key_reused`", body = ErrorBody),
    )
)]
/// `sale`: the sale the order names and its verified buyer, once read
/// from its body.
pub async fn place(
    state: &Buyers,
    mut parts: Parts,
    peer: Option<SocketAddr>,
    body: Bytes,
    sale: &mut Option<Named>,
) -> Answer {
    match decide(state, &mut parts, peer, &body, sale).await {
        Ok(answer) => answer,
        Err(refused) => Answer::refused(refused, AnsweredBy::Service),
    }
}

/// The order path, whole: every guard of [`limits`](crate::http::buyers::orders::limits), the
/// order decided, the answer counted and timed in the metrics. `serve`
/// calls it straight from the connection for `POST /api/orders`, the
/// busiest route by far (no router, no middleware stack: BENCHMARKS.md,
/// "What does a refusal cost?"); the router's route calls it too.
pub async fn endpoint<B>(state: &Buyers, peer: Option<SocketAddr>, req: Request<B>) -> Response
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    limits::guarded(&state.guards, req, |parts, body| {
        answer_order(state, peer, parts, body)
    })
    .await
}

/// A guarded order request's answer: admitted, decided, counted and timed.
async fn answer_order(
    state: &Buyers,
    peer: Option<SocketAddr>,
    parts: Parts,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let mut sale = None;
    let answer = match limits::admit_order(&state.guards, &parts.headers, peer) {
        Err(refused) => Answer::refused(refused, AnsweredBy::Service),
        // The permit is held while the order is decided.
        Ok(_permit) => place(state, parts, peer, body, &mut sale).await,
    };
    let answered = Instant::now();
    let took = answered.saturating_duration_since(started);
    state
        .metrics
        .count_order(answer.outcome, answer.answered_by, took.as_secs_f64());
    // The sale's timeline: an answer for a sale it named (not for an id no
    // sale has: those would fill the table).
    if let Some(Named { product, buyer }) = sale
        && answer.outcome != Outcome::Refused(Code::ProductNotFound)
    {
        let answered = Answered {
            outcome: answer.outcome,
            units: answer.units,
            at: answered,
            micros: took.as_micros() as u64,
        };
        (state.metrics.timeline).order(product.as_str(), buyer.get(), answered);
    }
    answer.response
}

/// The sale an order names, and its verified buyer (what the sale's
/// timeline counts the answer under).
pub struct Named {
    product: ProductId,
    buyer: UserId,
}

/// The router's `POST /api/orders`: `serve` answers it before the router,
/// so this keeps the route (and its 405 for other methods) in the table.
/// The router's own guard has read the body already.
pub async fn route(State(state): State<Buyers>, parts: Parts, body: Bytes) -> Response {
    let peer = crate::http::extract::peer(&parts.extensions);
    answer_order(&state, peer, parts, body).await
}

async fn decide(
    state: &Buyers,
    parts: &mut Parts,
    peer: Option<SocketAddr>,
    body: &[u8],
    sale: &mut Option<Named>,
) -> Result<Answer, ApiError> {
    let caller = Caller::of(state.auth.as_deref(), parts, peer)?;
    let IdempotencyKey(idempotency_key) = IdempotencyKey::from_request_parts(parts, state).await?;
    let body: PlaceOrder = extract::json(&parts.headers, body)?;
    let user_id = caller.acting_as(body.user_id)?;
    let product = &sale
        .insert(Named {
            product: ProductId::parse_owned(body.product_id)?,
            buyer: user_id,
        })
        .product;
    let quantity = Quantity::new(body.quantity)?;
    state.guards.check_user(user_id)?;
    let vouched = match parts.headers.get(&ADMISSION_TOKEN) {
        None => Vouched::No,
        // Boxed: its future (which may read the room from Redis) would
        // otherwise be laid out in every order's, and copied with it, for
        // the orders without a room too.
        Some(token) => {
            let keyed = Keyed::of(idempotency_key.as_ref());
            Box::pin(admission(state, token, product, user_id, keyed)).await?
        }
    };
    let decided = state
        .orders
        .place(NewOrder {
            product,
            user_id,
            quantity,
            idempotency_key: idempotency_key.as_deref(),
            vouched,
        })
        .await;
    Ok(match decided {
        Ok(Decision::Placed(placed)) => placed_answer(placed, quantity),
        Ok(Decision::Refused {
            why: Rejection::NoSale,
            ..
        }) if let Some(key) = idempotency_key.as_deref() => {
            Box::pin(retry_of_retired(state, user_id, product, key, quantity)).await?
        }
        Ok(Decision::Refused { why, by }) => Answer::refused(why.into(), by.into()),
        Err(e) => Answer::refused(e.into(), AnsweredBy::Redis),
    })
}

/// A keyed order for a product with no sale in Redis: the retry of an
/// order of a retired sale (its keys are gone) is answered from the books
/// with its order as it is now, `Idempotent-Replayed: true`; anything else
/// is `product_not_found` as usual. Only keyed orders for sales Redis does
/// not have come here (boxed: not laid out in every order's future).
async fn retry_of_retired(
    state: &Buyers,
    user_id: UserId,
    product: &ProductId,
    key: &str,
    quantity: Quantity,
) -> Result<Answer, ApiError> {
    let Some(row) = state.order_life.keyed_order(user_id, product, key).await? else {
        return Ok(Answer::refused(
            Rejection::NoSale.into(),
            AnsweredBy::Service,
        ));
    };
    if row.quantity != quantity.get() as i64 {
        return Ok(Answer::refused(
            ApiError::IdempotencyKeyReused,
            AnsweredBy::Service,
        ));
    }
    Ok(order_answer(
        row.into(),
        Placement::Replayed,
        AnsweredBy::Service,
    ))
}

/// The header that carries an admission from the sale's waiting room.
pub const ADMISSION_TOKEN: HeaderName = HeaderName::from_static("admission-token");

/// Whether the order carries a valid admission for the buyer and sale (see
/// `sale::room`): checked here, from its signature and expiry. Refused at
/// once when it is not, unless the order has an Idempotency-Key: a retry
/// must still get its order back, so the order script decides (it refuses
/// any new order without an admission).
async fn admission(
    state: &Buyers,
    token: &HeaderValue,
    product: &ProductId,
    user_id: UserId,
    keyed: Keyed,
) -> Result<Vouched, ApiError> {
    let token = token.to_str().unwrap_or("");
    match state.room.admission(product, user_id, token).await? {
        Admission::Admitted { counted_in } => Ok(Vouched::Admitted { counted_in }),
        Admission::NoRoom => Ok(Vouched::No),
        Admission::Refused(_) | Admission::Outside(_) if keyed == Keyed::Yes => Ok(Vouched::No),
        Admission::Outside(r) => Err(r.into()),
        Admission::Refused(AdmissionRefused::Expired) => Err(ApiError::AdmissionExpired),
        Admission::Refused(AdmissionRefused::OtherUser) => Err(ApiError::AdmissionRequired(
            "this admission is another buyer's",
        )),
        Admission::Refused(AdmissionRefused::Invalid) => Err(ApiError::AdmissionRequired(
            "this admission is not one this sale's waiting room gave",
        )),
    }
}

/// 202 with the order, or a replay's answer.
fn placed_answer(placed: Placed, quantity: Quantity) -> Answer {
    if placed.replayed && placed.order.quantity != quantity {
        return Answer::refused(ApiError::IdempotencyKeyReused, AnsweredBy::Redis);
    }
    let placement = match placed.replayed {
        true => Placement::Replayed,
        false => Placement::New,
    };
    order_answer(
        OrderView::of_sale(placed.order),
        placement,
        AnsweredBy::Redis,
    )
}

/// 202 with the order; a replay says so (`Idempotent-Replayed: true`).
/// Whether a 202 answers a new order, or one placed before under the same
/// Idempotency-Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    New,
    Replayed,
}

fn order_answer(order: OrderView, placement: Placement, answered_by: AnsweredBy) -> Answer {
    let units = match placement {
        Placement::New => order.quantity,
        Placement::Replayed => 0,
    };
    let json = HeaderValue::from_static("application/json");
    let mut response = (
        StatusCode::ACCEPTED,
        [(CONTENT_TYPE, json)],
        order.to_json(),
    )
        .into_response();
    let outcome = if placement == Placement::Replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Outcome::Replayed
    } else {
        Outcome::Accepted
    };
    Answer {
        response,
        outcome,
        answered_by,
        units,
    }
}

/// An answer to `POST /api/orders`, with what the metrics count it as.
pub struct Answer {
    pub response: Response,
    pub outcome: Outcome,
    pub answered_by: AnsweredBy,
    /// Units a new order took (0 for any other answer).
    pub units: u64,
}

impl Answer {
    pub fn refused(error: ApiError, answered_by: AnsweredBy) -> Self {
        Self {
            outcome: Outcome::Refused(error.kind()),
            response: error.into_response(),
            answered_by,
            units: 0,
        }
    }
}

impl From<sale::DecidedBy> for AnsweredBy {
    fn from(by: sale::DecidedBy) -> Self {
        match by {
            sale::DecidedBy::Memory => Self::Memory,
            sale::DecidedBy::Redis => Self::Redis,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, Fut, F: Fn(A, B, C) -> Fut>(_: &F) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every answer's future is boxed and moved, so its size is CPU on
    /// every request: once it was tens of KB (the Redis call's future laid
    /// out at each level, futures passed to async fns laid out twice),
    /// copied per order answered from memory (BENCHMARKS.md, "What does a
    /// refusal cost?").
    #[test]
    fn the_order_paths_future_stays_small() {
        let size = future_size(&endpoint::<hyper::body::Incoming>);
        assert!(size <= 4096, "the order path's future is {size} bytes");
    }
}
