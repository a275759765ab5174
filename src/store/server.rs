//! What the books' server says of itself, asked while the service runs:
//! which books it holds (a failover changes the answer), whether it would
//! take a write (readiness), what it runs on (the topology, read at start
//! and every 10 s, logged when it changes), and whether the service's
//! account could write past `read_only`.
//!
//! Its queries are runtime queries, unchecked at build time: they read the
//! server's own state (system variables, `information_schema`, `SHOW`),
//! nothing of the schema the migrations make, and some of it exists only
//! on some servers (`wsrep_*` on Galera builds).

use std::time::Duration;

use sqlx::Row;
use tokio_util::sync::CancellationToken;

use super::db::Db;
use super::error::StoreError;
use super::topology::{SeenTopology, Topology};
use crate::domain::Chain;

/// How often the books' topology is read again: a failover changes it
/// (a promoted replica has no replica of its own yet).
const TOPOLOGY_EVERY: Duration = Duration::from_secs(10);

/// Logs the books' topology `now`, read first or changed from `before`.
fn say_topology(before: Option<Topology>, now: Topology) {
    let from = before.map(Topology::label);
    match (before, now.risk()) {
        (_, Some(risk)) => tracing::warn!(topology = now.label(), from, "{risk}"),
        (None, None) => tracing::info!(topology = now.label(), "the books' database"),
        (Some(_), None) => {
            tracing::info!(topology = now.label(), from, "the books' topology changed")
        }
    }
}

/// A Galera status variable as an SQL subquery: its value on a Galera node
/// (`wsrep_on`), NULL elsewhere (a server that is no node reports some of
/// them too, `wsrep_ready` = OFF among them).
macro_rules! wsrep_status {
    ($name:literal) => {
        concat!(
            "(SELECT s.VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS s \
             JOIN information_schema.GLOBAL_VARIABLES v ON v.VARIABLE_NAME = 'WSREP_ON' \
             WHERE s.VARIABLE_NAME = '",
            $name,
            "' AND v.VARIABLE_VALUE = 'ON')"
        )
    };
}

impl Db {
    /// Once the database is ready, until `stop`: warns when the service's
    /// account could write past `read_only`, then follows the topology.
    pub async fn follow_server(&self, stop: CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = self.wait_ready() => {}
        }
        match self.writes_past_read_only().await {
            Ok(true) => tracing::warn!(
                "the service's MySQL account holds SUPER or READ_ONLY ADMIN: it writes to a read-only server (a replica not promoted yet, an old primary) as if it were the primary; give it only what deploy/mysql-grants.sql grants"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::info!(error = %Chain(&e), "cannot read the service's MySQL privileges")
            }
        }
        self.follow_topology(stop).await;
    }

    /// True when the service's account may write to a server whose
    /// `read_only` is on (`SUPER`, MariaDB's `READ_ONLY ADMIN`): such a
    /// server then takes the books' writes as if it were the primary.
    pub async fn writes_past_read_only(&self) -> Result<bool, StoreError> {
        let held: i64 = self
            .call(|pool| {
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
                     WHERE GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), \
                     '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''') \
                     AND PRIVILEGE_TYPE IN ('SUPER', 'READ_ONLY ADMIN')",
                )
                .fetch_one(pool)
            })
            .await?;
        Ok(held > 0)
    }

    /// Reads what the books run on now and every [`TOPOLOGY_EVERY`] until
    /// `stop`, and logs it when it is new: a WARN where a failover can lose
    /// commits (as the Redis side says of its append-only file), and what
    /// the change means (a semi-sync primary promoted without its replica:
    /// semi-sync to set up again). `/metrics` shows the last reading.
    async fn follow_topology(&self, stop: CancellationToken) {
        let mut said: Option<Topology> = None;
        loop {
            match self.read_topology().await {
                Ok(now) if said != Some(now) => {
                    say_topology(said, now);
                    said = Some(now);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "cannot tell what the books run on now")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TOPOLOGY_EVERY) => {}
            }
        }
    }

    /// The books behind `DATABASE_URL` now: on Galera the cluster
    /// (`galera:<wsrep_cluster_state_uuid>`: every node of it holds the same
    /// books, so a writer on each node agrees, and a node's death is no
    /// failover); elsewhere the server, `@@server_id` (unique among a primary
    /// and its replicas, as replication requires), its host name and port.
    /// Another answer than before is a failover (or a move).
    pub async fn server_identity(&self) -> Result<String, StoreError> {
        let (id, host, port, cluster): (u32, String, u32, Option<String>) = self
            .call(|pool| {
                sqlx::query_as(concat!(
                    "SELECT @@server_id, @@hostname, @@port, ",
                    wsrep_status!("WSREP_CLUSTER_STATE_UUID")
                ))
                .fetch_one(pool)
            })
            .await?;
        Ok(identity(id, &host, port, cluster.as_deref()))
    }

    /// Is MySQL answering, and would it take a write? A read-only server
    /// (a replica, a primary not promoted yet) answers
    /// [`StoreError::ReadOnly`]; a Galera node not ready (outside the
    /// primary component) [`StoreError::NotPrimary`].
    pub async fn ping(&self) -> Result<(), StoreError> {
        let (writable, wsrep_ready): (i64, Option<String>) = self
            .call(|pool| {
                sqlx::query_as(concat!(
                    "SELECT CAST(CAST(@@global.read_only AS CHAR) IN ('0', 'OFF') AS SIGNED), ",
                    wsrep_status!("WSREP_READY")
                ))
                .fetch_one(pool)
            })
            .await?;
        if writable == 0 {
            return Err(self.counted(StoreError::ReadOnly));
        }
        if wsrep_ready.as_deref() == Some("OFF") {
            return Err(self.counted(StoreError::NotPrimary));
        }
        Ok(())
    }

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

/// The books' identity from what the server says of itself: its cluster's
/// state UUID when it is a Galera node (a node that has none yet, all
/// zeros, is named as a server), else the server.
fn identity(id: u32, host: &str, port: u32, cluster: Option<&str>) -> String {
    match cluster {
        Some(uuid) if uuid.bytes().any(|b| b.is_ascii_hexdigit() && b != b'0') => {
            format!("galera:{uuid}")
        }
        _ => format!("{id}@{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::identity;

    #[test]
    fn a_galera_node_is_named_by_its_cluster_and_a_server_by_itself() {
        let uuid = Some("6f4b8a3e-1c2d-11ef-9a1b-5e2f0c3d4b5a");
        assert_eq!(
            identity(1, "a", 3306, uuid),
            identity(2, "b", 3307, uuid),
            "two nodes, one books"
        );
        assert!(identity(1, "a", 3306, uuid).starts_with("galera:"));
        assert_eq!(identity(7, "db1", 3306, None), "7@db1:3306");
        let none_yet = Some("00000000-0000-0000-0000-000000000000");
        assert_eq!(identity(7, "db1", 3306, none_yet), "7@db1:3306");
    }
}
