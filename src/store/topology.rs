//! What the books run on, and so what a failover of it can lose: read from
//! the server at start (after the migrations) and every 10 s after, logged
//! when it changes, and shown in `/metrics` (`flashsale_books_topology`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use sqlx::Row;

use super::db::Db;
use super::error::StoreError;

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

impl Db {
    /// Reads what the server says of itself: Galera (`wsrep_on`), a
    /// semi-sync primary with a replica acknowledging, replicas connected
    /// (`SHOW SLAVE HOSTS`), or one server. Needs no privilege beyond
    /// reading status, but `SHOW SLAVE HOSTS`: without it, replicas are
    /// not seen (logged).
    pub async fn read_topology(&self) -> Result<Topology, StoreError> {
        let t = self
            .bounded(async {
                let pool = self.pool();
                let galera: Option<String> =
                    sqlx::query_scalar("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'WSREP_ON'")
                        .fetch_optional(pool)
                        .await?;
                if galera.as_deref() == Some("ON") {
                    return Ok(Topology::Galera);
                }
                let semi: Option<String> = sqlx::query_scalar(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS'",
                )
                .fetch_optional(pool)
                .await?;
                let clients: Option<String> = sqlx::query_scalar(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS'",
                )
                .fetch_optional(pool)
                .await?;
                let acked = clients.and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
                if semi.as_deref() == Some("ON") && acked > 0 {
                    return Ok(Topology::SemiSync);
                }
                let replicas = match sqlx::query("SHOW SLAVE HOSTS").fetch_all(pool).await {
                    Ok(rows) => rows.iter().filter(|r| r.try_get::<u32, _>(0).is_ok()).count(),
                    Err(e) => {
                        tracing::info!(error = %crate::domain::Chain(&e), "cannot list the books' replicas (SHOW SLAVE HOSTS); taken as none");
                        0
                    }
                };
                Ok(match replicas {
                    0 => Topology::Single,
                    _ => Topology::AsyncReplicas,
                })
            })
            .await?;
        self.topology.set(t);
        Ok(t)
    }

    /// The topology last read ([`Self::read_topology`]).
    pub fn topology(&self) -> SeenTopology {
        self.topology.clone()
    }
}
