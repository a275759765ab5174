//! The whole API: each audience's routes merged, the guards as layers,
//! and the server that answers the crowd's requests before them.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::get;
use tokio::net::TcpListener;

use super::error::ApiError;
use super::state::Wings;
use super::transport::body::MAX_BODY_BYTES;
use super::transport::{limits, server};
use super::{buyers, openapi, operators};

/// Every route but the two the server answers straight from the
/// connection (`POST /api/orders` and the waiting room's polls, which the
/// router keeps too); the admin routes when on.
pub fn router(wings: &Wings) -> Router {
    let guards = wings.buyers.guards.clone();
    let mut api = Router::new()
        .route("/openapi.json", get(openapi::openapi_json))
        .merge(buyers::routes(wings.buyers.clone()))
        .merge(operators::public_routes(wings.operators.clone()));
    if wings.admin_routes {
        api = api.merge(operators::routes(wings.operators.clone()));
    }
    api.fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(from_fn_with_state(guards, limits::guard_request))
}

/// Serves the API on `listener` until `shutdown` completes (see
/// [`server::serve`]).
pub async fn serve(
    listener: TcpListener,
    wings: Wings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router(&wings);
    let Wings {
        buyers,
        connections,
        ..
    } = wings;
    server::serve(listener, (router, buyers), connections, shutdown).await
}
