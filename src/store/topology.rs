//! What the books run on, and so what a failover of it can lose (read from
//! the server by `server.rs`, shown in `/metrics`:
//! `flashsale_books_topology`). Types only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// The database behind `DATABASE_URL`, as it describes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Topology {
    /// Not read yet (MySQL has not answered since start).
    Unknown = 0,
    /// One server, no replica connected: its loss loses the books until it
    /// is back; a replica made from a backup lacks what came after.
    Single = 1,
    /// Replicas connected, asynchronous: a failover to one loses the
    /// commits it had not received yet.
    AsyncReplicas = 2,
    /// Semi-synchronous replication with a replica acknowledging: a commit
    /// is answered only once a replica has it (`AFTER_SYNC`: nothing
    /// answered is lost with the primary).
    SemiSync = 3,
    /// A Galera cluster node: a commit is certified by the cluster before
    /// it is answered.
    Galera = 4,
}

impl Topology {
    pub const ALL: [Topology; 5] = [
        Self::Unknown,
        Self::Single,
        Self::AsyncReplicas,
        Self::SemiSync,
        Self::Galera,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Single => "single",
            Self::AsyncReplicas => "async_replicas",
            Self::SemiSync => "semi_sync",
            Self::Galera => "galera",
        }
    }

    /// What a failover (or the loss of the server) can lose, and what to
    /// do about it.
    pub fn risk(self) -> Option<&'static str> {
        match self {
            Self::Single => Some(
                "the books run on one MySQL server with no replica connected: losing it loses what it holds until it is back; after a failover, set replication up again on the new primary (semi-sync, AFTER_SYNC) and fence or rebuild the old primary before it returns",
            ),
            Self::AsyncReplicas => Some(
                "the books' replicas are asynchronous: a failover to one loses the commits it had not received; the repair puts back what Redis still holds (acked orders from the streams within STREAM_RETENTION_SECS, cancels and payments from the sales' keys), but events the old primary alone held are not sent again; use semi-synchronous replication (rpl_semi_sync_master_wait_point=AFTER_SYNC) to lose nothing",
            ),
            Self::Unknown | Self::SemiSync | Self::Galera => None,
        }
    }

    fn from_u8(n: u8) -> Self {
        Self::ALL
            .into_iter()
            .find(|t| *t as u8 == n)
            .unwrap_or(Self::Unknown)
    }
}

/// The topology last read, shared by the handles of one `Db`.
#[derive(Debug, Clone, Default)]
pub struct SeenTopology(Arc<AtomicU8>);

impl SeenTopology {
    pub fn get(&self) -> Topology {
        Topology::from_u8(self.0.load(Ordering::Relaxed))
    }

    pub(super) fn set(&self, t: Topology) {
        self.0.store(t as u8, Ordering::Relaxed);
    }
}
