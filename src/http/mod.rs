//! The HTTP API, a map:
//!
//! - [`server`]: accepts connections ([`conn`]: their bounds), answers
//!   `POST /api/orders` and the waiting room's polls straight from the
//!   connection, hands everything else to the [`router`];
//! - one module per resource: `orders` (placing, reading, paying,
//!   cancelling), `products` (admin: create, open, close, audit), `room`
//!   (the waiting room), `health`, [`metrics`], [`openapi`] (the contract),
//!   [`dashboard`] (the operator's live page), `buyer_page` (a sale's page
//!   for its buyers, over the public API); `pages` what both pages share;
//! - what every request goes through: [`auth`] (who is buying), [`limits`]
//!   (the guards in front of Redis), `extract` (input into validated
//!   values), `body`, `logs`, `new_product` (the body that creates a
//!   product: the admin API's and the dashboard form's);
//! - [`error`]: the one mapping from failures to answers; [`state`]: what
//!   every handler can reach; [`watched`]: what the operator's views read
//!   of the sales.

pub mod admin_log;
pub mod auth;
mod body;
mod buyer_page;
pub mod conn;
pub mod dashboard;
pub mod error;
mod events;
mod extract;
mod health;
pub mod limits;
mod logs;
pub mod metrics;
mod new_product;
pub mod openapi;
mod orders;
mod pages;
pub mod payments;
pub(crate) mod products;
mod report;
mod room;
mod router;
mod server;
mod state;
pub mod watched;

pub use body::MAX_BODY_BYTES;
pub use router::router;
pub use server::{serve, serve_router};
pub use state::{AppState, Shared};
