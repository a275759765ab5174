//! The router: every route but the two `serve` answers straight from the
//! connection (`POST /api/orders` and the waiting room's polls, which the
//! router keeps too), the admin routes when on, the guards as layers.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use super::body::MAX_BODY_BYTES;
use super::buyer_page::{self, Identity};
use super::error::ApiError;
use super::state::AppState;
use super::{
    admin_log, dashboard, events, health, limits, metrics, openapi, orders, payments, products,
    report, room,
};

/// `POST /api/orders/{order_id}/pay`, the buyer marking their own order
/// paid: only in the local trial (`AUTH=none`, no payment notifications
/// configured). Everywhere else an order becomes `paid` only through a
/// signed notification from the payment side (`http::payments`).
fn buyer_pays(state: &AppState) -> Router<AppState> {
    match state.auth.is_none() && state.payments.is_none() {
        true => Router::new().route("/api/orders/{order_id}/pay", post(orders::pay)),
        false => Router::new(),
    }
}

pub fn router(state: AppState) -> Router {
    let guards = state.guards.clone();
    let mut api = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/metrics", get(metrics::metrics))
        .route("/api/products/{product_id}", get(products::get))
        .route("/api/sales/{product_id}/challenge", get(room::challenge))
        .route("/api/orders", post(orders::place::route))
        .route("/api/payments/notifications", post(payments::notify))
        .route(
            "/api/sales/{product_id}/queue/{ticket}",
            get(room::standing),
        )
        .merge(
            // Everything that takes an order or user id: throttled per
            // address, so ids cannot be tried by the thousand.
            Router::new()
                .route("/api/orders/{order_id}", get(orders::get))
                .route("/api/orders/{order_id}/cancel", post(orders::cancel))
                .route("/api/users/{user_id}/orders", get(orders::list_for_user))
                .route("/api/sales/{product_id}/queue", post(room::join))
                .merge(buyer_pays(&state))
                .route_layer(from_fn_with_state(guards.clone(), limits::guard_lookup)),
        )
        // The buyer's page: static, public, under the per-request guards
        // as `GET /api/products/{id}` (it takes no order or user id).
        .merge(buyer_page::routes(match state.auth {
            None => Identity::UserIdField,
            Some(_) => Identity::Verified,
        }));
    if state.admin_routes {
        let admin = Router::new()
            .route("/api/admin/products", post(products::create))
            .route("/api/admin/log", get(admin_log::list))
            .route("/api/admin/events", get(events::list))
            .route("/api/admin/events/dead", get(events::dead))
            .route("/api/admin/events/dead/replay", post(events::replay))
            .route(
                "/api/admin/products/{product_id}/open",
                post(products::open),
            )
            .route(
                "/api/admin/products/{product_id}/audit",
                get(products::audit),
            )
            .route("/api/admin/products/{product_id}/report", get(report::json))
            .route(
                "/api/admin/products/{product_id}/report/csv",
                get(report::csv),
            )
            .route(
                "/api/admin/products/{product_id}/close",
                post(products::close),
            )
            .route(
                "/api/admin/products/{product_id}/pause",
                post(products::pause),
            )
            .route(
                "/api/admin/products/{product_id}/resume",
                post(products::resume),
            )
            .route(
                "/api/admin/products/{product_id}/restock",
                post(products::restock),
            )
            .route(
                "/api/admin/products/{product_id}/room",
                post(room::set_pace),
            )
            .route_layer(from_fn_with_state(state.admin.clone(), admin_log::record));
        api = api.merge(admin).merge(match &state.dashboard {
            Some(d) => dashboard::routes(d.clone(), guards.clone()),
            None => Router::new(),
        });
    }
    api.fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(from_fn_with_state(guards, limits::guard_request))
        .with_state(state)
}
