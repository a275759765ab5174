//! The HTTP API: the server ([`serve`]: `POST /api/orders` straight from the
//! connection, everything else through the router), one module per
//! resource, the single error-to-response mapping ([`error`]), and the
//! operator's page ([`dashboard`]).

pub mod auth;
mod body;
pub mod conn;
pub mod dashboard;
pub mod error;
mod extract;
mod health;
pub mod limits;
mod logs;
pub mod metrics;
pub mod openapi;
mod orders;
mod products;
mod room;
mod server;

pub use server::{serve, serve_router};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use crate::books::Books;
use crate::sale::Sales;
use crate::store::Db;
use error::ApiError;

/// Largest request body accepted (a product with a 1,024-character title fits).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What every handler can reach. Cloned for every request (axum's `State`),
/// so it is one `Arc`: cloning the parts (connection handles, pools, the key
/// prefix) each time had a measurable cost on the sold-out path (BENCHMARKS.md).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub sales: Sales,
    pub db: Db,
    pub books: Books,
    /// `None`: the admin routes answer 401.
    pub admin_token: Option<Arc<str>>,
    /// Serve the admin routes at all.
    pub admin_routes: bool,
    /// The operator's page (`None`: no admin routes or no ADMIN_TOKEN).
    pub dashboard: Option<dashboard::Dashboard>,
    /// `None`: `AUTH=none`, the body's `user_id` is believed.
    pub auth: Option<auth::Auth>,
    pub guards: Arc<limits::Guards>,
    /// The open connections and their bounds.
    pub connections: Arc<conn::Connections>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
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
        .route("/api/orders", post(orders::place_route))
        .route(
            "/api/sales/{product_id}/queue/{ticket}",
            get(room::standing),
        )
        .merge(
            // Everything that takes an order or user id: throttled per
            // address, so ids cannot be tried by the thousand.
            Router::new()
                .route("/api/orders/{order_id}", get(orders::get))
                .route("/api/orders/{order_id}/pay", post(orders::pay))
                .route("/api/orders/{order_id}/cancel", post(orders::cancel))
                .route("/api/users/{user_id}/orders", get(orders::list_for_user))
                .route("/api/sales/{product_id}/queue", post(room::join))
                .route_layer(from_fn_with_state(guards.clone(), limits::guard_lookup)),
        );
    if state.admin_routes {
        api = api
            .route("/api/admin/products", post(products::create))
            .route(
                "/api/admin/products/{product_id}/open",
                post(products::open),
            )
            .route(
                "/api/admin/products/{product_id}/audit",
                get(products::audit),
            )
            .route(
                "/api/admin/products/{product_id}/close",
                post(products::close),
            )
            .route(
                "/api/admin/products/{product_id}/room",
                post(room::set_pace),
            )
            .merge(dashboard::routes(&state));
    }
    api.fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(from_fn_with_state(guards, limits::guard_request))
        .with_state(state)
}
