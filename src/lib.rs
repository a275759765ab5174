//! # flashsale
//!
//! A flash-sale order service. The data flows top-down through the layout:
//!
//! - [`http`]: the JSON API (the server, which answers orders without the
//!   router; the router, who is asking ([`http::auth`]), one module per
//!   resource, one error mapping) and the operator's live page
//!   ([`http::dashboard`]).
//! - [`sale`]: the Redis side. One Lua script checks the sale, deducts stock and
//!   appends the order to the sale's stream, atomically. Where stock is deducted.
//! - [`worker`]: the stream workers: consumer-group reads, one MySQL
//!   transaction per batch, then XACK; reclaimer, dead letters, trimming;
//!   they also run the books' sweeper and reconciliation.
//! - [`books`]: an order's life after its 202 (pay, cancel, payment timeout)
//!   across MySQL and Redis; the audit; recovery of a sale Redis lost; a
//!   sale's end of life (close, retire, purge).
//! - [`store`]: MySQL access (`tb_product`, `tb_order`).
//! - [`metrics`]: the Prometheus registry the HTTP layer and the workers update.
//! - [`domain`]: validated ids and values shared by all layers, and the clock.
//! - [`config`] and [`app`]: settings and startup; [`cli`]: the operator
//!   commands (`audit`, `recover`, `streams`, `sales`); `main.rs` only calls them.
//!
//! Imports go one way, down this graph (nothing imports a module above it):
//!
//! ```text
//! app, cli, config
//!   -> http, worker      (both -> metrics)
//!     -> books
//!       -> sale, store
//!         -> domain
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
