//! The operators' side, over a state of its own ([`Operators`]):
//!
//! - the admin API: `sales` (a product created, its sale opened, closed,
//!   paused, resumed, restocked, audited; `new_product` the body that
//!   creates one, the API's and the dashboard form's), `room_pace` (a
//!   waiting room's bounds, live), `report` (a sale's report, JSON and
//!   CSV), `events` (the outbox read in order, its dead letters replayed);
//! - `admin_log`: who did what, written by every admin route and the
//!   dashboard, and read back;
//! - `dashboard`: the operator's live page, its controls and the report
//!   page;
//! - `metrics`: `/metrics` (the counters, and each open sale's gauges
//!   through `watched`).

pub mod admin_log;
mod before;
pub mod dashboard;
mod desk;
pub mod events;
pub mod metrics;
pub mod new_product;
pub mod report;
mod restock;
pub mod room_pace;
pub mod sales;
mod state;
pub mod watched;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

pub use desk::SaleDesk;
pub use state::{OperatorParts, Operators};

/// What every deployment serves of the operators' side: `/metrics` (the
/// sales' gauges only with the admin token).
pub fn public_routes(operators: Operators) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .with_state(operators)
}

/// The admin API, admin-logged, and the dashboard (with a token).
pub fn routes(operators: Operators) -> Router {
    let admin = Router::new()
        .route("/api/admin/products", post(sales::create))
        .route("/api/admin/log", get(admin_log::list))
        .route("/api/admin/events", get(events::list))
        .route("/api/admin/events/dead", get(events::dead))
        .route("/api/admin/events/dead/replay", post(events::replay))
        .route("/api/admin/products/{product_id}/open", post(sales::open))
        .route("/api/admin/products/{product_id}/audit", get(sales::audit))
        .route("/api/admin/products/{product_id}/report", get(report::json))
        .route(
            "/api/admin/products/{product_id}/report/csv",
            get(report::csv),
        )
        .route("/api/admin/products/{product_id}/close", post(sales::close))
        .route("/api/admin/products/{product_id}/pause", post(sales::pause))
        .route(
            "/api/admin/products/{product_id}/resume",
            post(sales::resume),
        )
        .route(
            "/api/admin/products/{product_id}/restock",
            post(sales::restock),
        )
        .route(
            "/api/admin/products/{product_id}/room",
            post(room_pace::set_pace),
        )
        .route_layer(from_fn_with_state(
            operators.door.clone(),
            admin_log::record,
        ));
    let dashboard = match &operators.dashboard {
        Some(d) => dashboard::routes(d.clone()),
        None => Router::new(),
    };
    admin.with_state(operators).merge(dashboard)
}
