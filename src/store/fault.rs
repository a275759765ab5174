//! What a MySQL error says about the books, sorted once: an **outage** (the
//! server cannot take the work now: down, read-only, not the primary, a
//! Galera node outside the primary component, going away mid-switch), a
//! **contention** (a lock lost to another writer: nothing changed, try
//! again), the **setup** (a grant or a table missing: nothing a retry of the
//! row fixes, but a fix of the server does) or **the row itself** (MySQL
//! will never take this row as it is).
//!
//! The rule for promise 2: only the last class may turn an accepted order
//! into a dead letter. Every other class keeps the stream's entries pending
//! (the workers back off and try again) and answers the callers 503.
//!
//! The codes a failover can produce, each sorted (MySQL's and MariaDB's
//! server error numbers; the client-side 2xxx ones reach sqlx as I/O).

use std::sync::atomic::{AtomicU64, Ordering};

/// How a failure of the books is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The server cannot take writes (or any work) for a while: 503, the
    /// workers keep every entry and try again.
    Outage(Outage),
    /// A lock lost to another writer (a deadlock's victim, a lock wait
    /// timeout, Galera's certification): tried again from the start.
    Contention,
    /// The server lacks a grant or a table the service needs: a
    /// deployment to fix, never a reason to give an order up. Met as an
    /// outage (503, entries kept), counted as `setup`.
    Setup,
    /// MySQL refuses this row or statement as it is (a value out of range,
    /// a constraint): a bug or a bad entry. Only this class dead-letters.
    Row,
}

/// Why the books are out, as `flashsale_db_unavailable_total{why}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outage {
    /// `read_only` (or `super_read_only`, a read-only transaction, a global
    /// read lock): a replica, a primary not promoted yet, a fenced one.
    ReadOnly = 0,
    /// A Galera node not ready or outside the primary component (1047), a
    /// group-replication hook refusing the commit.
    NotPrimary = 1,
    /// The server or a proxy in front of it going away, killing or
    /// refusing connections (a shutdown, a switch, too many connections).
    Connection = 2,
    /// No answer in time: `DB_TIMEOUT_MS`, the pool's wait, a statement
    /// time limit.
    Timeout = 3,
    /// The server is out of a resource (disk, memory, threads).
    Resources = 4,
    /// The database has not been created and migrated yet.
    NotMigrated = 5,
    /// A grant or a table missing ([`Fault::Setup`]).
    Setup = 6,
}

impl Outage {
    pub const ALL: [Outage; 7] = [
        Self::ReadOnly,
        Self::NotPrimary,
        Self::Connection,
        Self::Timeout,
        Self::Resources,
        Self::NotMigrated,
        Self::Setup,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::NotPrimary => "not_primary",
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::Resources => "resources",
            Self::NotMigrated => "not_migrated",
            Self::Setup => "setup",
        }
    }
}

/// Calls the books refused for an outage, by why: one process's count,
/// read by `/metrics` (`flashsale_db_unavailable_total{why}`).
#[derive(Debug, Default)]
pub struct OutageCounts([AtomicU64; Outage::ALL.len()]);

impl OutageCounts {
    pub fn count(&self, why: Outage) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, why: Outage) -> u64 {
        self.0[why as usize].load(Ordering::Relaxed)
    }
}

/// The server's error numbers, by class.
pub mod codes {
    /// Writes refused by a read-only server.
    pub const READ_ONLY: &[u16] = &[
        1290, // ER_OPTION_PREVENTS_STATEMENT: --read-only (MariaDB, MySQL)
        1836, // ER_READ_ONLY_MODE: super_read_only (MySQL)
        1792, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
        1223, // ER_CANT_UPDATE_WITH_READLOCK: FLUSH TABLES WITH READ LOCK (a switch, a backup)
    ];
    /// A cluster node that may not serve: Galera, group replication.
    pub const NOT_PRIMARY: &[u16] = &[
        1047, // ER_UNKNOWN_COM_ERROR: "WSREP has not yet prepared node for application use"
        1180, // ER_ERROR_DURING_COMMIT: a commit the node could not replicate
        3100, // ER_RUN_HOOK_ERROR: group replication refused the commit (no quorum)
        3098, // ER_BEFORE_DML_VALIDATION_ERROR: group replication, not the primary
    ];
    /// The server or its proxy going away or refusing connections.
    pub const CONNECTION: &[u16] = &[
        1040, // ER_CON_COUNT_ERROR: too many connections
        1203, // ER_TOO_MANY_USER_CONNECTIONS
        1226, // ER_USER_LIMIT_REACHED
        1043, // ER_HANDSHAKE_ERROR
        1053, // ER_SERVER_SHUTDOWN
        1077, // ER_NORMAL_SHUTDOWN
        1152, // ER_ABORTING_CONNECTION
        1158, 1159, 1160, 1161, // ER_NET_READ/WRITE errors and interrupts
        1184, // ER_NEW_ABORTING_CONNECTION
        1927, // ER_CONNECTION_KILLED (MariaDB: KILL, a proxy's switch)
        1317, // ER_QUERY_INTERRUPTED
        4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
        9001, // ProxySQL: no server in the hostgroup within its connect timeout
    ];
    /// No answer in time.
    pub const TIMEOUT: &[u16] = &[
        1969, // ER_STATEMENT_TIMEOUT: max_statement_time (MariaDB)
        3024, // ER_QUERY_TIMEOUT: max_execution_time (MySQL)
    ];
    /// The server out of a resource.
    pub const RESOURCES: &[u16] = &[
        1021, // ER_DISK_FULL
        1114, // ER_RECORD_FILE_FULL: the tablespace full
        1037, 1038, 1041, // out of memory
        1135, // ER_CANT_CREATE_THREAD
        1637, // ER_TOO_MANY_CONCURRENT_TRXS
    ];
    /// A lock lost to another writer.
    pub const CONTENTION: &[u16] = &[
        1205, // ER_LOCK_WAIT_TIMEOUT
        1213, // ER_LOCK_DEADLOCK (and Galera's certification failure)
        1614, // ER_XA_RBDEADLOCK
        3101, // ER_TRANSACTION_ROLLBACK_DURING_COMMIT: group replication's certification
    ];
    /// The deployment: a grant, a table or a column missing.
    pub const SETUP: &[u16] = &[
        1044, 1045, // access denied to the database, to the account
        1142, 1143, // a command or a column denied
        1227, // ER_SPECIFIC_ACCESS_DENIED_ERROR
        1370, // ER_PROCACCESS_DENIED_ERROR
        1146, // ER_NO_SUCH_TABLE
        1054, // ER_BAD_FIELD_ERROR
        1049, // ER_BAD_DB_ERROR
    ];
}

/// Sorts a server error number.
pub fn classify(code: u16) -> Fault {
    use codes::*;
    let outage = [
        (READ_ONLY, Outage::ReadOnly),
        (NOT_PRIMARY, Outage::NotPrimary),
        (CONNECTION, Outage::Connection),
        (TIMEOUT, Outage::Timeout),
        (RESOURCES, Outage::Resources),
    ];
    if let Some((_, why)) = outage.iter().find(|(codes, _)| codes.contains(&code)) {
        return Fault::Outage(*why);
    }
    if CONTENTION.contains(&code) {
        return Fault::Contention;
    }
    if SETUP.contains(&code) {
        return Fault::Setup;
    }
    Fault::Row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failover_s_errors_are_outages_and_a_row_s_are_not() {
        for code in [1290, 1836, 1792, 1223] {
            assert_eq!(classify(code), Fault::Outage(Outage::ReadOnly), "{code}");
        }
        assert_eq!(classify(1047), Fault::Outage(Outage::NotPrimary));
        for code in [1053, 1927, 1040, 1317, 1158] {
            assert_eq!(classify(code), Fault::Outage(Outage::Connection), "{code}");
        }
        assert_eq!(classify(1969), Fault::Outage(Outage::Timeout));
        assert_eq!(classify(1021), Fault::Outage(Outage::Resources));
        for code in [1205, 1213] {
            assert_eq!(classify(code), Fault::Contention, "{code}");
        }
        for code in [1142, 1146, 1045] {
            assert_eq!(classify(code), Fault::Setup, "{code}");
        }
        // What the row itself carries: a duplicate, a value too long or out
        // of range, a NULL, a foreign key, a check.
        for code in [1062, 1406, 1264, 1048, 1366, 1452, 4025] {
            assert_eq!(classify(code), Fault::Row, "{code}");
        }
    }

    #[test]
    fn no_code_is_in_two_classes() {
        use codes::*;
        let all = [
            READ_ONLY,
            NOT_PRIMARY,
            CONNECTION,
            TIMEOUT,
            RESOURCES,
            CONTENTION,
            SETUP,
        ];
        let mut seen = std::collections::HashSet::new();
        for code in all.iter().flat_map(|c| c.iter()) {
            assert!(seen.insert(*code), "{code} sorted twice");
        }
    }
}
