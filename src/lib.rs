//! # flashsale
//!
//! A flash-sale order service. The data flows top-down through the layout:
//!
//! - [`http`]: the JSON API. `server` answers `POST /api/orders` straight
//!   from the connection (`orders::place`), `router` the rest: who is asking
//!   ([`http::auth`]), one module per resource (`orders`, `products`,
//!   `room`, `payments`: the payment side's signed notifications, `events`:
//!   the outbox read in order), bounded connections (`conn`) and requests (`limits`), one
//!   error mapping (`error`), the operator's live page
//!   ([`http::dashboard`]) and a sale's page for its buyers (`buyer_page`,
//!   over the public API).
//! - [`worker`]: the stream workers (`drain`: consumer-group reads, one
//!   MySQL transaction per batch, then XACK; reclaim, dead letters, trim)
//!   and the periodic passes (`periodic`: sweeper, reconciliation,
//!   retirement, `deliver`: the outbox pushed to the shop), each run by
//!   `every`.
//! - [`books`]: an order's life after its 202 (payments, cancel, payment
//!   timeout) across MySQL and Redis; the audit; recovery of a sale Redis
//!   lost; a sale's end of life (close, retire, purge).
//! - [`sale`]: the Redis side, as handles by role over one connection:
//!   `orders` (one Lua script checks the sale, deducts stock and appends
//!   the order to the sale's stream, atomically: where stock is deducted;
//!   the orders of a sale that arrive together share a call, `line`),
//!   `room` (the waiting room), `lifecycle` (open, close, retire),
//!   `queue` (what the stream holds), `ledger` (what the books need from
//!   Redis), and `stream` (the workers' reads).
//! - [`store`]: MySQL access (`tb_product`, `tb_order`, `tb_payment`,
//!   `tb_event`: the outbox, `tb_sale_audit`).
//! - [`metrics`]: the Prometheus registry the HTTP layer and the workers update.
//! - [`domain`]: validated ids and values shared by all layers, the clock,
//!   and signed messages (`webhook`: Standard Webhooks).
//! - [`config`]: every setting, once (command line and environment);
//!   [`app`]: startup; [`cli`]: the operator commands (`audit`, `recover`,
//!   `streams`, `sales`); `main.rs` only calls them.
//! - [`bench_support`] (feature `bench`): what the benchmarks call below the
//!   public API.
//!
//! Imports go one way, down this graph (nothing imports a module above it;
//! `tests/layout.rs` checks it):
//!
//! ```text
//! bench_support
//!   -> app, cli
//!     -> config
//!       -> http, worker      (both -> metrics)
//!         -> books
//!           -> sale, store
//!             -> domain
//! ```
//!
//! The benchmarks are the workspace's other crate, `bench/` (binary
//! `flashsale-bench`): they use this library, and nothing here knows them.

pub mod app;
#[cfg(feature = "bench")]
pub mod bench_support;
pub mod books;
pub mod cli;
pub mod config;
pub mod domain;
pub mod http;
pub mod metrics;
pub mod sale;
pub mod store;
pub mod worker;
