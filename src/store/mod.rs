//! MySQL: the books. Products are created here; accepted orders are written
//! here by the stream workers. The order path does not need MySQL (only a
//! keyed retry of a retired sale's order is looked up here).
//!
//! One handle per table family, each with its own queries, over one
//! bounded core ([`Db`]: the pool, the timeout, the database's readiness):
//!
//! | handle | tables | what |
//! |---|---|---|
//! | [`Products`] | `tb_product` | a sale's row: created, opened, its room's bounds, closed, its MySQL-side stock, retired, purged |
//! | [`Orders`] | `tb_order` | persisted orders: a batch from the stream (`orders/persist.rs`: where an order is persisted), payments', cancels' and timeouts' status changes (`orders/transitions.rs`), lookups |
//! | [`Payments`] | `tb_payment` | each notification recorded once, with the order change it makes |
//! | [`Events`] | `tb_event` | the outbox: an event per change, written in the change's transaction, read in order |
//! | [`Deliveries`] | `tb_event_delivery`, `tb_event_dead` | pushing the outbox: leases, progress, dead letters, replays |
//! | [`Audits`] | `tb_sale_audit`, `tb_put_back` | a retired sale's final audit; what a repair after a failover of the books put back |
//! | [`AdminLog`] | `tb_admin_log`, `tb_dashboard_session_ended` | every admin action and failed admin authentication; the dashboard sessions a logout ended |
//! | [`Seconds`] | `tb_sale_second`, `tb_sale_report` | each sale's timeline, a row per second and process; the report kept when it retired |
//!
//! Beside them: `fault.rs` sorts MySQL's errors (an outage, contention, the
//! setup, the row itself); `server.rs` asks the server what it is (which
//! books it holds, whether it takes writes, its topology); `topology.rs`
//! names what it can run on.
//!
//! The store reads and writes; what a change means is decided by the books
//! (`bookkeeping`), before or after the store's reads, never called back from
//! inside a transaction.

mod admin_log;
mod audits;
mod db;
mod error;
mod events;
mod fault;
mod migrate;
mod orders;
mod payments;
mod products;
mod seconds;
mod server;
mod topology;

pub use admin_log::{AdminEntry, AdminLog};
pub use audits::{Audits, FinalAudit, PutBack};
pub use db::Db;
pub use error::StoreError;
pub use events::{
    DeadEvent, Deliveries, Delivery, EVENTS_PER_ROW, EventKind, EventRow, Events, SKIP_AHEAD_ROWS,
};
pub use fault::{Fault, Outage, OutageCounts};
pub use migrate::{TABLE_LOCK_WAIT_SECS, count_statements, migration_lock};
pub use orders::{OrderRow, Orders, Persisted, Transition};
pub use payments::{Locked, NewPayment, Payments, Recorded, RefundDueRow};
pub use products::{NewProduct, Product, Products};
pub use seconds::{SecondRow, Seconds};
pub use topology::{SeenTopology, Topology};

impl Db {
    pub fn products(&self) -> Products {
        Products::new(self.clone())
    }

    pub fn seconds(&self) -> Seconds {
        Seconds::new(self.clone())
    }

    pub fn orders(&self) -> Orders {
        Orders::new(self.clone())
    }

    pub fn payments(&self) -> Payments {
        Payments::new(self.clone())
    }

    pub fn events(&self) -> Events {
        Events::new(self.clone())
    }

    pub fn deliveries(&self) -> Deliveries {
        Deliveries::new(self.clone())
    }

    pub fn audits(&self) -> Audits {
        Audits::new(self.clone())
    }

    pub fn admin_log(&self) -> AdminLog {
        AdminLog::new(self.clone())
    }
}
