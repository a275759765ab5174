//! The HTTP API, a wing per audience, each over a state of its own:
//!
//! - [`transport`]: what every request goes through, whoever sends it: the
//!   server (`server`: accepts connections, answers the crowd's requests
//!   straight from the connection, the rest through the router), the
//!   connections' bounds (`conn`), the guards in front of Redis
//!   (`limits`), bodies (`body`) and request logs (`logs`);
//! - [`buyers`]: the buyers' and the payment side's API: orders, the
//!   waiting room, payment notifications, the public product read, health,
//!   a sale's page for its buyers;
//! - [`operators`]: the admin API, the admin log, the dashboard and its
//!   controls, the report's routes and page, the events feed, `/metrics`;
//! - shared by the wings, below them: [`error`] (the one mapping from
//!   failures to answers), `extract` (input into validated values, written
//!   against `FromRef`, naming no state), [`auth`] (who is buying), `pages`
//!   (what both pages share);
//! - above them: `router` (the wings' routes merged, the guards as layers,
//!   `serve`), [`openapi`] (the contract), `state` (the wings as startup
//!   builds them).

pub mod auth;
pub mod buyers;
pub mod error;
mod extract;
pub mod openapi;
pub mod operators;
mod pages;
mod router;
mod state;
pub mod transport;

pub use router::{router, serve};
pub use state::Wings;
pub use transport::body::MAX_BODY_BYTES;
pub use transport::server::serve_router;
