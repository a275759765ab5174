//! The books: an order's life after its 202, across MySQL and Redis, and the
//! checks that nothing was lost.
//!
//! A cancel has two halves, in this order: (1) one MySQL transaction moves the
//! order `confirmed` → `cancelled` (guarded, so it happens once) and gives the
//! units back to `available_qty`, with `released = 0`; (2) `release_stock.lua`
//! gives them back to the Redis stock and the buyer's allowance, at most once
//! per order (its released set), then `released = 1`. A crash between the two
//! leaves `cancelled` + `released = 0`, which the workers' sweeper finds and
//! finishes; since the Redis half is idempotent, finishing it twice counts once.
//!
//! [`OrderLife`] does that (and the lookups of an order in either store);
//! [`Catalog`] opens, paces and closes sales, and tells where one stands;
//! [`Sweeper`] is the workers' periodic pass (payment timeouts, unfinished
//! cancels); [`audit`] proves the books balance; [`reconcile`] restores in
//! Redis what a failover lost of a sale; [`recover`] rebuilds a sale in Redis
//! from MySQL after Redis lost it entirely; [`retire`] ends a sale's life
//! once it is over and settled (its final audit recorded, its keys gone);
//! [`report`] tells how a sale went (its timeline and its books), and
//! keeps that when it retires.

pub mod audit;
mod catalog;
mod error;
mod events;
pub mod live;
mod orders;
mod payments;
mod put_back;
pub mod reconcile;
pub mod recover;
pub mod report;
pub mod retire;
mod sweeper;

pub use audit::Audit;
pub use catalog::{Catalog, ProductStatus, SaleOpened, sale_spec};
pub use error::BookkeepingError;
pub use events::{EventMessage, Outbox};
pub use live::LiveCheck;
pub use orders::{Cancelled, Found, OrderLife, pending_of as pending_order_of};
pub use payments::{PaymentRecord, decide as decide_payment};
pub use recover::Recovery;
pub use report::{Money, Recorder, Report, Reports};
pub use retire::{Retirer, Settlement};
pub use sweeper::{Sweeper, Swept};
