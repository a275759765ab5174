//! The connection to MySQL ([`Db`]): the pool, the one bounded way to it
//! (a call, a transaction). The table families (`products`, `orders`, ...)
//! each hold one. Creating and migrating the database is `migrate.rs`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{MySql, Transaction};
use tokio::sync::watch;

use super::error::StoreError;
use super::fault::OutageCounts;
use crate::config::DbSettings;
use crate::domain::{Chain, backoff};

/// The MySQL pool, with a timeout applied to every call.
#[derive(Clone)]
pub struct Db {
    pub(super) pool: MySqlPool,
    /// `DATABASE_URL`: the database to create and migrate.
    pub(super) url: Arc<str>,
    pub(super) timeout: Duration,
    /// True once the database exists with its tables. Until then every call
    /// answers [`StoreError::NotReady`] (a 503) instead of reaching MySQL:
    /// the service starts, and takes orders, before MySQL answers.
    pub(super) ready: Arc<watch::Sender<bool>>,
    /// Calls and transactions tried again after contention.
    retries: Arc<AtomicU64>,
    /// Calls the books refused for an outage, by why.
    outages: Arc<OutageCounts>,
    /// What the server said of itself at start.
    pub(super) topology: super::topology::SeenTopology,
}

/// Tries of a call or a transaction that MySQL rolled back as a deadlock's
/// victim or that waited too long for a lock (InnoDB, and Galera's
/// certification conflicts, answer so): nothing changed, so it is tried
/// again, after a short jittered wait, at most this many times in all.
const CONTENTION_ATTEMPTS: usize = 4;
const CONTENTION_WAIT: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(80));

impl Db {
    /// The books' database `settings` name: a pool made without connecting
    /// (MySQL need not answer yet).
    pub fn from_settings(settings: &DbSettings) -> Result<Self, StoreError> {
        Self::connect_lazy(&settings.url, settings.timeout, settings.max_connections)
    }

    /// Connects lazily: the service starts while MySQL is down.
    pub fn connect_lazy(
        url: &str,
        timeout: Duration,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        let options: MySqlConnectOptions = url.parse()?;
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            url: url.into(),
            timeout,
            ready: Arc::new(watch::Sender::new(false)),
            retries: Arc::default(),
            outages: Arc::default(),
            topology: Default::default(),
        })
    }

    /// True once the database is created and migrated.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Completes once the database is created and migrated.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        // Err only if the sender is gone, which `self` holds.
        let _ = ready.wait_for(|r| *r).await;
    }

    pub(crate) fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// One statement on the pool, refused while MySQL is not ready and
    /// bounded by the configured timeout: the store's one way to MySQL.
    /// Tried again when contention rolled it back (see
    /// [`CONTENTION_ATTEMPTS`]), each try bounded.
    pub(super) async fn call<'a, T, Fut>(
        &'a self,
        mut op: impl FnMut(&'a MySqlPool) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut waits = backoff::jittered(CONTENTION_WAIT.0, CONTENTION_WAIT.1);
        let mut attempt = 1;
        loop {
            match self.bounded(async { Ok(op(&self.pool).await?) }).await {
                Err(e) if e.is_contention() && attempt < CONTENTION_ATTEMPTS => {
                    self.contended(&e, attempt, waits.next()).await;
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// Counts a try that contention rolled back, retried by the caller
    /// (a transaction held across the books' decision).
    pub(super) fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts and logs a try that contention rolled back, then waits.
    async fn contended(&self, e: &StoreError, attempt: usize, wait: Option<Duration>) {
        self.count_retry();
        let wait = wait.unwrap_or(CONTENTION_WAIT.1);
        tracing::debug!(attempt, error = %Chain(e), retry_in = ?wait, "mysql contention; trying again");
        tokio::time::sleep(wait).await;
    }

    /// How many calls and transactions were tried again after contention
    /// (`flashsale_db_retries_total`).
    pub fn retries(&self) -> Arc<AtomicU64> {
        self.retries.clone()
    }

    /// One transaction, bounded like [`Db::call`]: committed when `op`
    /// returns `Ok` (a read-only one too, which releases its locks), rolled
    /// back when it fails, and run again from the start when contention
    /// rolled it back (at the commit too, as Galera's certification does).
    /// `op`'s future is boxed, as in sqlx's own `Connection::transaction`:
    /// it borrows the transaction.
    pub(super) async fn transaction<'a, T>(
        &'a self,
        mut op: impl for<'t> FnMut(&'t mut Transaction<'a, MySql>) -> InTransaction<'t, T>,
    ) -> Result<T, StoreError> {
        let mut waits = backoff::jittered(CONTENTION_WAIT.0, CONTENTION_WAIT.1);
        let mut attempt = 1;
        loop {
            let tried = self
                .bounded(async {
                    let mut tx: Transaction<'a, MySql> = self.pool.begin().await?;
                    let done = op(&mut tx).await?;
                    tx.commit().await?;
                    Ok(done)
                })
                .await;
            match tried {
                Err(e) if e.is_contention() && attempt < CONTENTION_ATTEMPTS => {
                    self.contended(&e, attempt, waits.next()).await;
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// A transaction the caller holds across its own steps (each bounded by
    /// the caller with [`Db::bounded`]); rolled back when dropped
    /// uncommitted.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        self.bounded(async { Ok(self.pool.begin().await?) }).await
    }

    /// Runs one storage call with the configured timeout.
    pub(crate) async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.is_ready() {
            return Err(self.counted(StoreError::NotReady));
        }
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
            .map_err(|e| self.counted(e))
    }

    /// Counts `e` when it says the books are out.
    pub(super) fn counted(&self, e: StoreError) -> StoreError {
        if let Some(why) = e.outage() {
            self.outages.count(why);
        }
        e
    }

    /// Calls the books refused for an outage, by why
    /// (`flashsale_db_unavailable_total`).
    pub fn outages(&self) -> Arc<OutageCounts> {
        self.outages.clone()
    }

    /// The bound on every call and transaction (`DB_TIMEOUT_MS`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// The future of a step inside a transaction (see [`Db::transaction`]).
type InTransaction<'t, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 't>>;
