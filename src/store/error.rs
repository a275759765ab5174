//! The one error of `store`: a failure of MySQL, or of what it holds.

use std::time::Duration;

use super::fault::{self, Fault, Outage};

/// A failure of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("a product with this id exists")]
    ProductExists,
    #[error("mysql")]
    Db(#[from] sqlx::Error),
    #[error("migrations")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("mysql did not answer within {0:?}")]
    Timeout(Duration),
    #[error("bad DATABASE_URL: {0}")]
    Config(String),
    /// The database has not been created and migrated yet (MySQL has not
    /// answered since start); see [`Db::migrate_until_ready`].
    #[error("the database is not ready yet (waiting for MySQL to create and migrate it)")]
    NotReady,
    /// The server behind `DATABASE_URL` is read-only (`@@read_only`): a
    /// replica, a primary not promoted yet, or one fenced after a failover.
    #[error("the books' server is read-only (a replica, or a primary not promoted yet)")]
    ReadOnly,
    /// The books' Galera node is not ready (`wsrep_ready` is OFF: outside
    /// the primary component, or joining).
    #[error("the books' Galera node is not ready (outside the primary component)")]
    NotPrimary,
    /// MySQL holds what the service never writes (a bug, or a hand edit).
    #[error("unexpected data in mysql: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// How this failure is met ([`Fault`]): `None` for what is no failure
    /// of the books' server (a product id taken, bad data already stored, a
    /// bad `DATABASE_URL`).
    pub fn fault(&self) -> Option<Fault> {
        use sqlx::Error as E;
        Some(match self {
            Self::ProductExists | Self::Corrupt(_) | Self::Config(_) => return None,
            Self::Timeout(_) => Fault::Outage(Outage::Timeout),
            Self::NotReady => Fault::Outage(Outage::NotMigrated),
            Self::ReadOnly => Fault::Outage(Outage::ReadOnly),
            Self::NotPrimary => Fault::Outage(Outage::NotPrimary),
            Self::Db(E::Database(e)) => {
                match e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    Some(e) => fault::classify(e.number()),
                    None => Fault::Row,
                }
            }
            Self::Db(E::PoolTimedOut) => Fault::Outage(Outage::Timeout),
            Self::Db(E::Io(_) | E::PoolClosed | E::Tls(_) | E::Protocol(_) | E::WorkerCrashed) => {
                Fault::Outage(Outage::Connection)
            }
            Self::Db(_) | Self::Migrate(_) => Fault::Row,
        })
    }

    /// Why the books are out, when they are ([`Fault::Outage`], and the
    /// setup's faults, met as one).
    pub fn outage(&self) -> Option<Outage> {
        match self.fault()? {
            Fault::Outage(why) => Some(why),
            Fault::Setup => Some(Outage::Setup),
            Fault::Contention | Fault::Row => None,
        }
    }

    /// True when MySQL is down, slow, out of connections, refusing writes
    /// (read-only, not the primary), missing a grant or a table, or
    /// contended: a 503, and the workers keep their entries.
    pub fn is_unavailable(&self) -> bool {
        self.outage().is_some() || self.is_contention()
    }

    /// True when MySQL rolled the statement back as a deadlock's victim, or
    /// it waited too long for a lock: nothing changed, trying again is safe.
    /// (A guarded update of an order a worker is inserting can meet the
    /// worker's batch this way.)
    pub fn is_contention(&self) -> bool {
        self.fault() == Some(Fault::Contention)
    }

    /// True when trying again is safe and may succeed: contention (see
    /// [`Self::is_contention`]), or a unique key another writer took
    /// between our read and our insert (two deliveries of one message).
    pub fn is_conflict(&self) -> bool {
        self.is_contention()
            || matches!(self, Self::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}
