//! The one error of `store`: a failure of MySQL, or of what it holds.

use std::time::Duration;

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
    /// MySQL holds what the service never writes (a bug, or a hand edit).
    #[error("unexpected data in mysql: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// True when MySQL is down, slow, out of connections or contended (a
    /// 503, not a bug).
    pub fn is_unavailable(&self) -> bool {
        if self.is_contention() {
            return true;
        }
        match self {
            Self::Timeout(_) | Self::NotReady => true,
            Self::Db(e) => matches!(
                e,
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::WorkerCrashed
            ),
            _ => false,
        }
    }
}

impl StoreError {
    /// True when MySQL rolled the statement back as a deadlock's victim, or
    /// it waited too long for a lock: nothing changed, trying again is safe.
    /// (A guarded update of an order a worker is inserting can meet the
    /// worker's batch this way.)
    pub fn is_contention(&self) -> bool {
        const LOCK_WAIT_TIMEOUT: u16 = 1205;
        const DEADLOCK: u16 = 1213;
        match self {
            Self::Db(sqlx::Error::Database(e)) => e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| matches!(e.number(), LOCK_WAIT_TIMEOUT | DEADLOCK)),
            _ => false,
        }
    }

    /// True when trying again is safe and may succeed: contention (see
    /// [`Self::is_contention`]), or a unique key another writer took
    /// between our read and our insert (two deliveries of one message).
    pub fn is_conflict(&self) -> bool {
        self.is_contention()
            || matches!(self, Self::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}
