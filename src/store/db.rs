//! The connection to MySQL ([`Db`]): the pool, the one bounded way to it
//! (a call, a transaction), and creating and migrating the database. The
//! table families (`products`, `orders`, ...) each hold one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{MySql, Transaction};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::StoreError;
use super::fault::OutageCounts;
use crate::config::DbSettings;
use crate::domain::{Chain, backoff};

/// The MySQL pool, with a timeout applied to every call.
#[derive(Clone)]
pub struct Db {
    pool: MySqlPool,
    /// `DATABASE_URL`: the database to create and migrate.
    url: Arc<str>,
    timeout: Duration,
    /// True once the database exists with its tables. Until then every call
    /// answers [`StoreError::NotReady`] (a 503) instead of reaching MySQL:
    /// the service starts, and takes orders, before MySQL answers.
    ready: Arc<watch::Sender<bool>>,
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

/// Waits between attempts to create and migrate the database: doubling from
/// the first to the last, so a long outage costs a log line every 10 s.
const MIGRATE_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(10));

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

    /// Creates and migrates the database, retrying with bounded back-off
    /// (a log line per failed attempt) until it succeeds or `stop` is
    /// cancelled. `serve` and `worker` run this beside everything else, so a
    /// MySQL that is down or frozen at start delays only what needs MySQL.
    pub async fn migrate_until_ready(&self, stop: CancellationToken) {
        let (first, last) = MIGRATE_BACKOFF;
        let mut waits = backoff::doubling(first, last);
        for attempt in 1u32.. {
            let wait = waits.next().unwrap_or(last);
            let tried = tokio::select! {
                _ = stop.cancelled() => return,
                tried = self.create_and_migrate() => tried,
            };
            match tried {
                Ok(()) => {
                    tracing::info!(attempt, "database ready (created and migrated)");
                    return;
                }
                Err(e) => tracing::warn!(
                    attempt,
                    error = %Chain(&e),
                    retry_in_ms = wait.as_millis() as u64,
                    "cannot create or migrate the database yet; orders are still taken, MySQL work waits"
                ),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Creates the database named in `DATABASE_URL` if it is missing, then runs the
    /// migrations: `flashsale serve` works on a fresh server with no manual step.
    pub async fn create_and_migrate(&self) -> Result<(), StoreError> {
        let url = &*self.url;
        // Longer than one call's bound: a fresh schema is several DDL statements.
        let bound = (self.timeout * 10).max(Duration::from_secs(30));
        let work = async {
            let database = create_database(url).await?;
            // Several processes may start at once on a fresh database (an API
            // and its workers). sqlx's own migration lock is `GET_LOCK(.., -1)`,
            // which MariaDB answers at once without the lock, so two migrators
            // race and one fails on a duplicate version: take a lock that waits.
            // On a connection of its own, not the pool's: the lock belongs to
            // the session, and a pooled connection given back while its
            // GET_LOCK still waits (the bound below fired) would take the lock
            // later and keep it, holding every other process back. This one
            // is closed (or dropped) on every path, which ends the session
            // and so frees the lock.
            let mut conn = sqlx::mysql::MySqlConnection::connect(url).await?;
            let wait = bound
                .saturating_sub(Duration::from_secs(5))
                .max(Duration::from_secs(1));
            let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
                .bind(migration_lock(&database))
                .bind(wait.as_secs() as i64)
                .fetch_one(&mut conn)
                .await?;
            if locked != Some(1) {
                return Err(StoreError::Timeout(wait));
            }
            // A user lock is one server's: on Galera the other nodes' migrators
            // do not see it, and one of them would find a migration under way
            // and call it "partially applied". The lease, a row, is the
            // cluster's (see [`LEASE_TABLE`]).
            let lease = take_lease(&mut conn, bound, wait).await?;
            let mut migrator = sqlx::migrate!();
            migrator.set_locking(false);
            // A migration this release does not know was applied by a later
            // one: this release runs beside it, or is rolled back to (the
            // upgrade contract: a migration never breaks the release before;
            // docs/operations.md "Upgrading"). Known ones are still checked.
            migrator.set_ignore_missing(true);
            // run_direct: `run` trips "Acquire is not general enough" in spawned tasks.
            let migrated = migrator.run_direct(&mut conn).await;
            let released = sqlx::query(LEASE_GIVE)
                .bind(&lease)
                .execute(&mut conn)
                .await;
            conn.close().await?;
            migrated?;
            released?;
            Ok(())
        };
        tokio::time::timeout(bound, work)
            .await
            .unwrap_or(Err(StoreError::Timeout(bound)))?;
        self.ready.send_replace(true);
        Ok(())
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

/// Creates the database named in `url` if missing; returns its name.
async fn create_database(url: &str) -> Result<String, StoreError> {
    let mut server = url::Url::parse(url).map_err(|e| StoreError::Config(e.to_string()))?;
    let name = server.path().trim_start_matches('/').to_owned();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(StoreError::Config(format!(
            "database name {name:?} must be non-empty letters, digits and '_'"
        )));
    }
    server.set_path("");
    let mut conn = sqlx::mysql::MySqlConnection::connect(server.as_str()).await?;
    sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS `{name}`"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(name)
}

/// The migrations' lease: a row that every node of a Galera cluster agrees
/// on (two nodes inserting it at once: one commit fails certification, and
/// then sees the row), held for at most the migration's bound (a migrator
/// that died holding it frees it then).
const LEASE_TABLE: &str = "CREATE TABLE IF NOT EXISTS flashsale_migration_lease ( \
    id TINYINT NOT NULL PRIMARY KEY, \
    holder VARCHAR(64) NOT NULL, \
    until_ms BIGINT NOT NULL \
) ENGINE = InnoDB";
const LEASE_EXPIRED: &str = "DELETE FROM flashsale_migration_lease \
    WHERE id = 1 AND until_ms < CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";
const LEASE_TAKE: &str = "INSERT INTO flashsale_migration_lease (id, holder, until_ms) \
    VALUES (1, ?, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED) + ?)";
const LEASE_GIVE: &str = "DELETE FROM flashsale_migration_lease WHERE id = 1 AND holder = ?";

/// Takes the migrations' lease ([`LEASE_TABLE`]) on `conn` for `bound`,
/// waiting up to `wait` for another migrator's; returns the holder's name.
async fn take_lease(
    conn: &mut sqlx::mysql::MySqlConnection,
    bound: Duration,
    wait: Duration,
) -> Result<String, StoreError> {
    let lease = uuid::Uuid::now_v7().to_string();
    // `query`, not `raw_sql`: the latter's future is not general enough for
    // the spawned task that migrates.
    sqlx::query(LEASE_TABLE).execute(&mut *conn).await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        sqlx::query(LEASE_EXPIRED).execute(&mut *conn).await?;
        let taken = sqlx::query(LEASE_TAKE)
            .bind(&lease)
            .bind(bound.as_millis() as i64)
            .execute(&mut *conn)
            .await;
        match taken.map_err(StoreError::from) {
            Ok(_) => return Ok(lease),
            // Another migrator holds it (here, or on another node).
            Err(e) if e.is_conflict() => {}
            Err(e) => return Err(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Timeout(wait));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The name of the lock that serializes the migrations of one database
/// (MariaDB's user locks are server-wide; names are at most 64 characters).
pub fn migration_lock(database: &str) -> String {
    let mut name = format!("flashsale.migrate.{database}");
    name.truncate(64);
    name
}
