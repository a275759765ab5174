//! The buyers' and the payment side's API, over a state of its own
//! ([`Buyers`]):
//!
//! - `orders`: placing (`orders::place`: one script call in Redis, where
//!   stock is deducted), reading, paying (local trials), cancelling;
//! - `room`: the waiting room (joining, its challenge, a place's standing);
//! - `payments`: the payment side's signed notifications (Standard
//!   Webhooks), the only way an order becomes `paid`;
//! - `products`: the public product read; `health`: liveness and
//!   readiness; `buyer_page`: a sale's page for its buyers, over this API;
//! - `direct`: the two requests the server answers straight from the
//!   connection (the order path and the room's polls).

pub mod buyer_page;
mod direct;
pub mod health;
pub mod orders;
pub mod payments;
pub mod products;
pub mod room;
mod state;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

pub use state::{BuyerParts, Buyers};

use super::transport::limits;

/// `POST /api/orders/{order_id}/pay`, the buyer marking their own order
/// paid: only in the local trial (`AUTH=none`, no payment notifications
/// configured). Everywhere else an order becomes `paid` only through a
/// signed notification from the payment side (`payments`).
fn buyer_pays(buyers: &Buyers) -> Router<Buyers> {
    match buyers.auth.is_none() && buyers.payments.is_none() {
        true => Router::new().route("/api/orders/{order_id}/pay", post(orders::pay)),
        false => Router::new(),
    }
}

/// The buyers' routes, over their state (`POST /api/orders` and the room's
/// polls are here too, though the server answers them before the router).
pub fn routes(buyers: Buyers) -> Router {
    let guards = buyers.guards.clone();
    let identity = match buyers.auth {
        None => buyer_page::Identity::UserIdField,
        Some(_) => buyer_page::Identity::Verified,
    };
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
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
                .merge(buyer_pays(&buyers))
                .route_layer(from_fn_with_state(guards, limits::guard_lookup)),
        )
        // The buyer's page: static, public, under the per-request guards
        // as `GET /api/products/{id}` (it takes no order or user id).
        .merge(buyer_page::routes(identity))
        .with_state(buyers)
}
