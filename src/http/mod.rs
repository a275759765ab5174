//! The HTTP API: the router, one module per resource, and the single
//! error-to-response mapping ([`error`]).

pub mod error;
mod extract;
mod health;
mod orders;
mod products;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tokio::net::TcpListener;

use crate::books::Books;
use crate::sale::Sales;
use crate::store::Db;
use error::ApiError;

/// Largest request body accepted (a product with a 1,024-character title fits).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub sales: Sales,
    pub db: Db,
    pub books: Books,
    /// `None` disables the admin routes (they answer 401).
    pub admin_token: Option<Arc<str>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/api/admin/products", post(products::create))
        .route(
            "/api/admin/products/{product_id}/open",
            post(products::open),
        )
        .route("/api/products/{product_id}", get(products::get))
        .route("/api/orders", post(orders::place))
        .route("/api/orders/{order_id}", get(orders::get))
        .route("/api/orders/{order_id}/pay", post(orders::pay))
        .route("/api/orders/{order_id}/cancel", post(orders::cancel))
        .route(
            "/api/admin/products/{product_id}/audit",
            get(products::audit),
        )
        .route("/api/users/{user_id}/orders", get(orders::list_for_user))
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` completes, then lets requests
/// in flight finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
