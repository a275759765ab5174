//! What the operator's views (`/metrics`, the dashboard's board) read of
//! the sales: the calls this process sent, the open sales, each one's
//! stream and room. Read-only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sale::{Counts, Fleet, Lifecycle, Room, Sales, Watch};
use crate::store::{Db, OutageCounts, SeenTopology, Topology};

/// The handles the operator's views read.
#[derive(Clone)]
pub struct Watched {
    counts: Arc<Counts>,
    lifecycle: Lifecycle,
    watch: Watch,
    room: Room,
    fleet: Fleet,
    /// The books' database's retries after contention.
    db_retries: Arc<AtomicU64>,
    /// The books' database's calls refused for an outage.
    db_outages: Arc<OutageCounts>,
    /// What the books run on.
    topology: SeenTopology,
}

impl Watched {
    pub fn of(sales: &Sales, db: &Db) -> Self {
        Self {
            db_retries: db.retries(),
            db_outages: db.outages(),
            topology: db.topology(),
            counts: sales.counts(),
            lifecycle: sales.lifecycle().clone(),
            watch: sales.watch().clone(),
            room: sales.room().clone(),
            fleet: sales.fleet().clone(),
        }
    }
}

impl Watched {
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The registry of open sales.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    pub fn room(&self) -> &Room {
        &self.room
    }

    /// The roll of the deployment's processes.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// MySQL calls and transactions this process tried again after contention.
    pub fn db_retries(&self) -> u64 {
        self.db_retries.load(Ordering::Relaxed)
    }

    /// MySQL calls this process saw refused for an outage, by why.
    pub fn db_outages(&self) -> &OutageCounts {
        &self.db_outages
    }

    /// What the books run on, as the server last said.
    pub fn topology(&self) -> Topology {
        self.topology.get()
    }
}
