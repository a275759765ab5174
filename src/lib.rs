//! # flashsale
//!
//! A flash-sale order service. The data flows top-down through the layout:
//!
//! - [`http`]: the JSON API, a wing per audience over a state of its own:
//!   [`http::transport`] (the server, which answers `POST /api/orders` and
//!   the waiting room's polls straight from the connection; bounded
//!   connections and requests), [`http::buyers`] (orders, the room, the
//!   payment side's signed notifications, the public product read, a
//!   sale's page for its buyers), [`http::operators`] (the admin API, the
//!   admin log, the dashboard, the report's routes, the events feed,
//!   `/metrics`); who is asking ([`http::auth`]) and one error mapping
//!   (`error`) below them, the router above.
//! - [`worker`]: the stream workers (`drain`: consumer-group reads, one
//!   MySQL transaction per batch, then XACK; reclaim, dead letters, trim)
//!   and the periodic passes (`periodic`: sweeper, reconciliation,
//!   retirement, `deliver`: the outbox pushed to the shop), each run by
//!   `every`.
//! - [`bookkeeping`]: what needs both stores: an order's life after its 202
//!   (payments, cancel, payment timeout), a sale's admin (`Catalog`), the
//!   audit, recovery of a sale Redis lost, a sale's end of life, a sale's
//!   report (`report`: its timeline and its books). The bookkeeping
//!   decides; the stores read and write.
//! - [`sale`]: the Redis side, as handles by role over one private core:
//!   `OrderPath` (one Lua script checks the sale, deducts stock and appends
//!   the order to the sale's stream, atomically: where stock is deducted),
//!   `Accepted`, `Room`, `Lifecycle`, `Watch`, `Ledger`, `Streams`, `Bells`.
//! - [`store`]: MySQL, one handle per table family (`Products`, `Orders`:
//!   where an order is persisted, `Payments`, `Events`, `Deliveries`,
//!   `Audits`, `AdminLog`, `Seconds`: the sales' timelines) over one bounded
//!   core (`Db`); which of MySQL's errors are an outage (`fault`), what the
//!   server says of itself (`server`).
//! - [`metrics`]: the Prometheus registry the HTTP layer and the workers
//!   update, and each sale's timeline as the process counts it
//!   (`metrics::timeline`, written to the books each second, with the
//!   buyers who tried counted in a sketch: `metrics::distinct`).
//! - [`domain`]: validated ids and values shared by all layers, the clock,
//!   a waiting room's bounds, what the API answers (`answer`: every error
//!   code and an order's outcome, one type from where an answer is decided
//!   to where it is counted), and signed messages (`webhook`: Standard
//!   Webhooks).
//! - [`config`]: every setting, once: the command line and the environment
//!   parsed into the plain settings types each layer takes (`Limits`,
//!   `AuthSettings`, `RedisSettings`, ...), which know nothing above them;
//!   [`app`]: startup, the one place that holds the stores whole and gives
//!   each part its handles; [`cli`]: the operator commands (`audit`,
//!   `recover`, `streams`, `sales`, `report`); `main.rs` only calls them.
//! - [`bench_support`] (feature `bench`): what the benchmarks call below the
//!   public API.
//!
//! Imports go one way, down this graph (nothing imports a module above it;
//! inside each folder, no module uses a sibling that uses it back, however
//! far round; `tests/layout.rs` checks both):
//!
//! ```text
//! bench_support
//!   -> app, cli
//!     -> http, worker      (both -> metrics)
//!       -> bookkeeping
//!         -> sale, store
//!           -> config, metrics
//!             -> domain
//! ```
//!
//! ## Words
//!
//! One word per idea, in the code, the metrics and the docs:
//!
//! - **sale**: a product's flash sale; its Redis keys share the product id
//!   as hash tag. **Open**: in Redis and in the **registry** of open sales.
//! - **accepted** order: answered 202 by the order script, in the sale's
//!   **stream**; **pending** until a worker **persists** it into the
//!   **books** (MySQL), `confirmed` there, then `paid` or `cancelled`.
//!   **Bookkeeping** (`bookkeeping`): the rules over both stores that decide
//!   what the books hold (an order's life after its 202, `OrderLife`; a
//!   sale's admin, audit, recovery, retirement, report).
//! - **shared call**: one `place_order.lua` call carrying the orders of a
//!   sale that arrived while its previous call was in flight.
//! - **batch**: the entries a worker reads from a stream at once, and
//!   persists in one transaction.
//! - **dead letter**: an entry (or an event) given up after its attempts,
//!   kept for an operator.
//! - **memory**: what an instance remembers of Redis's answers, to refuse
//!   without a round trip (`sale::memory`).
//! - **watch**: the read model of a sale's stream and its consumer group
//!   (`sale::Watch`: what the dashboard, `/metrics` and `flashsale
//!   streams` show); its **backlog**: the entries not persisted yet.
//! - **shard** (stock shard): one of the parts a sale's stock is split
//!   into (`stock_shards`), each with its own keys in its own **hash
//!   slot**: the Redis Cluster slot a key's hash tag maps to. "Slot" alone
//!   means only the hash slot.
//! - **permit**: one of `MAX_IN_FLIGHT`, held by an order while it is
//!   decided; an order that finds none is **shed** (503 `overloaded` at
//!   once: nothing waits). The connections the kernel holds before they
//!   are accepted are the **listen backlog**, always in two words.
//! - **waiting room**: buyers join its **line**, each with a **place** in
//!   it and a **ticket**; the room has **admitted** the places up to a
//!   number that grows at the **pace** (places admitted per second now,
//!   `admit_per_sec` in answers and metrics, and nothing else), between
//!   the operator's **floor** and **ceiling**; an **admission** lets its
//!   buyer order; the **cap** bounds admissions held unused. Redis keeps
//!   what was admitted as the room hash's `served`.
//! - **rate**: a count per second measured (the dashboard's orders/s), and
//!   a **rate limit** (429 `rate_limited`); never the pace or the ceiling.
//! - **queue**: only the room's routes (`/api/sales/{id}/queue`) and the
//!   code `queue_not_open`, kept for clients; nothing else is called so.
//! - **series**: a chart's run of values, drawn in **segments**.
//! - **bell**: the `PUBLISH` that wakes a quiet sale's sleeping drain.
//! - **event**: a change of an order or a sale in the outbox (`tb_event`),
//!   **delivered** to the shop's endpoints; a row holds up to
//!   `EVENTS_PER_ROW` of them.
//! - **timeline**: a sale's seconds as each process counted them
//!   (`tb_sale_second`); **report**: how the sale went, from its timeline
//!   and its books, **kept** when it retires.
//! - **reconcile**: restore in Redis what a failover lost of a sale the
//!   books hold; **recover**: rebuild a sale Redis lost whole;
//!   **retire**: end a settled sale's life (final audit, keys **purged**).
//!
//! Retired words (`tests/words.rs` refuses them): "queue" for the stream,
//! for shedding or for the listen backlog; "line" for the places admitted
//! or a chart's series; "rate" for the pace or the ceiling; "slot" for a
//! shard or a permit.
//!
//! The benchmarks are the workspace's other crate, `bench/` (binary
//! `flashsale-bench`): they use this library, and nothing here knows them.

pub mod app;
#[cfg(feature = "bench")]
pub mod bench_support;
pub mod bookkeeping;
pub mod cli;
pub mod config;
pub mod domain;
pub mod http;
pub mod metrics;
pub mod sale;
pub mod store;
pub mod worker;
