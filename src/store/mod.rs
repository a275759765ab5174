//! MySQL: the books. Products are created here; accepted orders are written
//! here by the stream workers. The order path does not need MySQL (only a
//! keyed retry of a retired sale's order is looked up here).

mod db;
mod events;
mod lifecycle;
mod orders;
mod payments;
mod products;
mod retire;

pub use db::{Db, StoreError, migration_lock};
pub use events::{DeadEvent, Delivery, EventKind, EventRow};
pub use lifecycle::Transition;
pub use orders::{OrderRow, Persisted};
pub use payments::{Decide, NewPayment, Recorded};
pub use products::{NewProduct, Product};
pub use retire::FinalAudit;
