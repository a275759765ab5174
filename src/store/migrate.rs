//! Creating and migrating the books' database, during a sale: `serve` and
//! `worker` apply the migrations they bring at start, beside the processes
//! of the release before (docs/operations.md "Upgrading").
//!
//! Three rules keep a migration from stopping a sale:
//! - **Getting in is bounded; running is not.** The wait for another
//!   migrator (a user lock, and a lease row that a Galera cluster agrees
//!   on) is bounded; a migration that got in runs to its end, however long
//!   a rebuild of large books takes (26.7 s for 5 million orders, BENCHMARKS
//!   "What does an upgrade cost?"). Cutting it short would leave it
//!   half-recorded (sqlx records a migration as begun before its DDL
//!   commits), and every later start would refuse the books as "partially
//!   applied". While it runs its lease is renewed and a line is logged every
//!   30 s.
//! - **A table's lock is waited for briefly.** An `ALTER` waits for the
//!   table's metadata lock behind any open transaction on it, and every
//!   write to the table then waits behind the `ALTER`: a long report query
//!   would stop the workers. The migration's session waits at most
//!   [`TABLE_LOCK_WAIT_SECS`] (`lock_wait_timeout`), so a write waits no
//!   longer, and the attempt is given up and tried again later.
//! - **A migration given up that way is tried again from the start**: a
//!   statement that never got its lock changed nothing (MariaDB's DDL is
//!   atomic), so sqlx's record of it as begun is removed when the migration
//!   is one statement. A migration of several statements stays recorded as
//!   partially applied, for an operator (tests/migrations.rs holds new
//!   migrations of hot tables to one statement).
//!
//! Its queries are runtime queries, unchecked at build time: they run
//! before the migrations and around them, on what the migrations do not
//! make (the database itself, sqlx's `_sqlx_migrations`, the lease table).

use std::time::Duration;

use sqlx::Connection;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::mysql::MySqlConnection;
use tokio_util::sync::CancellationToken;

use super::db::Db;
use super::error::StoreError;
use crate::domain::{Chain, backoff};

/// Waits between attempts to create and migrate the database: doubling from
/// the first to the last, so a long outage costs a log line every 10 s.
const MIGRATE_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(10));

/// How long a migration's statement waits for a table's metadata lock
/// before it gives up (MariaDB's `lock_wait_timeout`, whole seconds): the
/// longest a write to that table waits behind it.
pub const TABLE_LOCK_WAIT_SECS: u32 = 1;

/// While a migration runs: its lease is renewed this often, and a line
/// logged every [`STILL_RUNNING_EVERY`].
const LEASE_RENEW_EVERY: Duration = Duration::from_secs(5);
const STILL_RUNNING_EVERY: Duration = Duration::from_secs(30);

/// MariaDB's `ER_LOCK_WAIT_TIMEOUT`: the statement did not get its lock.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

impl Db {
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

    /// Creates the database named in `DATABASE_URL` if it is missing, then
    /// runs this release's migrations: `flashsale serve` works on a fresh
    /// server with no manual step.
    pub async fn create_and_migrate(&self) -> Result<(), StoreError> {
        self.migrate_with(sqlx::migrate!()).await
    }

    /// Creates the database and runs `migrator`'s migrations (this
    /// release's, or a test's own), under the rules of this module.
    pub async fn migrate_with(&self, mut migrator: Migrator) -> Result<(), StoreError> {
        let url = &*self.url;
        // Getting in: longer than one call's bound, as another migrator's
        // fresh schema is several DDL statements.
        let bound = (self.timeout * 10).max(Duration::from_secs(30));
        let (mut conn, lease) = tokio::time::timeout(bound, get_in(url, bound))
            .await
            .unwrap_or(Err(StoreError::Timeout(bound)))?;
        migrator.set_locking(false);
        // A migration this release does not know was applied by a later
        // one: this release runs beside it, or is rolled back to (the
        // upgrade contract: a migration never breaks the release before;
        // docs/operations.md "Upgrading"). Known ones are still checked.
        migrator.set_ignore_missing(true);
        // Running: to its end, the lease renewed meanwhile.
        let migrated = tokio::select! {
            // run_direct: `run` trips "Acquire is not general enough" in spawned tasks.
            migrated = migrator.run_direct(&mut conn) => migrated,
            never = self.keep_lease(&lease, bound) => match never {},
        };
        if let Err(MigrateError::ExecuteMigration(e, version)) = &migrated {
            let gave_way = e
                .as_database_error()
                .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
                .is_some_and(|d| d.number() == LOCK_WAIT_TIMEOUT);
            let single = migrator
                .iter()
                .find(|m| m.version == *version)
                .is_some_and(|m| count_statements(&m.sql) == 1);
            if gave_way && single {
                tracing::info!(
                    version,
                    "a migration gave way to an open transaction on its table; it is tried again later"
                );
                sqlx::query("DELETE FROM _sqlx_migrations WHERE version = ? AND success = FALSE")
                    .bind(version)
                    .execute(&mut conn)
                    .await?;
            }
        }
        let released = sqlx::query(LEASE_GIVE)
            .bind(&lease)
            .execute(&mut conn)
            .await;
        conn.close().await?;
        migrated?;
        released?;
        self.ready.send_replace(true);
        Ok(())
    }

    /// Renews the migrations' lease `lease` (held for `bound` at a time)
    /// every [`LEASE_RENEW_EVERY`] while a migration runs, on the pool (the
    /// migration's own connection is busy), and logs the run's length every
    /// [`STILL_RUNNING_EVERY`]. Never returns: dropped when the run ends.
    async fn keep_lease(&self, lease: &str, bound: Duration) -> std::convert::Infallible {
        let started = tokio::time::Instant::now();
        let mut renew = tokio::time::interval(LEASE_RENEW_EVERY);
        renew.tick().await;
        let mut told = Duration::ZERO;
        loop {
            renew.tick().await;
            let renewed = tokio::time::timeout(
                self.timeout,
                sqlx::query(LEASE_RENEW)
                    .bind(bound.as_millis() as i64)
                    .bind(lease)
                    .execute(&self.pool),
            )
            .await;
            if !matches!(renewed, Ok(Ok(_))) {
                tracing::debug!("the migrations' lease was not renewed this time");
            }
            let running = started.elapsed();
            if running >= told + STILL_RUNNING_EVERY {
                told = running;
                tracing::info!(
                    running_s = running.as_secs(),
                    "a migration is still running (a rebuild of large books); orders are still taken, MySQL work waits"
                );
            }
        }
    }
}

/// Creates the database, connects, and takes the user lock and the lease,
/// waiting for another migrator up to `bound`; the connection's session then
/// waits [`TABLE_LOCK_WAIT_SECS`] at most for a table's lock.
async fn get_in(url: &str, bound: Duration) -> Result<(MySqlConnection, String), StoreError> {
    let database = create_database(url).await?;
    // Several processes may start at once on a fresh database (an API
    // and its workers). sqlx's own migration lock is `GET_LOCK(.., -1)`,
    // which MariaDB answers at once without the lock, so two migrators
    // race and one fails on a duplicate version: take a lock that waits.
    // On a connection of its own, not the pool's: the lock belongs to
    // the session, and a pooled connection given back while its
    // GET_LOCK still waits (the bound fired) would take the lock
    // later and keep it, holding every other process back. This one
    // is closed (or dropped) on every path, which ends the session
    // and so frees the lock.
    let mut conn = MySqlConnection::connect(url).await?;
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
    sqlx::query(&format!(
        "SET SESSION lock_wait_timeout = {TABLE_LOCK_WAIT_SECS}"
    ))
    .execute(&mut conn)
    .await?;
    Ok((conn, lease))
}

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
    let mut conn = MySqlConnection::connect(server.as_str()).await?;
    sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS `{name}`"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(name)
}

/// The migrations' lease: a row that every node of a Galera cluster agrees
/// on (two nodes inserting it at once: one commit fails certification, and
/// then sees the row), held for the bound of getting in at a time, renewed
/// while its migration runs (a migrator that died holding it frees it then).
const LEASE_TABLE: &str = "CREATE TABLE IF NOT EXISTS flashsale_migration_lease ( \
    id TINYINT NOT NULL PRIMARY KEY, \
    holder VARCHAR(64) NOT NULL, \
    until_ms BIGINT NOT NULL \
) ENGINE = InnoDB";
const LEASE_EXPIRED: &str = "DELETE FROM flashsale_migration_lease \
    WHERE id = 1 AND until_ms < CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";
const LEASE_TAKE: &str = "INSERT INTO flashsale_migration_lease (id, holder, until_ms) \
    VALUES (1, ?, CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED) + ?)";
const LEASE_RENEW: &str = "UPDATE flashsale_migration_lease \
    SET until_ms = CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED) + ? \
    WHERE id = 1 AND holder = ?";
const LEASE_GIVE: &str = "DELETE FROM flashsale_migration_lease WHERE id = 1 AND holder = ?";

/// Takes the migrations' lease ([`LEASE_TABLE`]) on `conn` for `bound`,
/// waiting up to `wait` for another migrator's; returns the holder's name.
async fn take_lease(
    conn: &mut MySqlConnection,
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

/// How many statements `sql` holds: `;`-separated, outside comments and
/// quotes, blanks not counted.
pub fn count_statements(sql: &str) -> usize {
    let mut count = 0;
    let mut current = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut star = false;
                for c in chars.by_ref() {
                    if star && c == '/' {
                        break;
                    }
                    star = c == '*';
                }
            }
            '\'' | '"' | '`' => {
                current = true;
                let mut escaped = false;
                for q in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if q == '\\' {
                        escaped = true;
                    } else if q == c {
                        break;
                    }
                }
            }
            ';' => {
                if current {
                    count += 1;
                }
                current = false;
            }
            c if c.is_whitespace() => {}
            _ => current = true,
        }
    }
    count + usize::from(current)
}

#[cfg(test)]
mod tests {
    use super::count_statements as statements;

    #[test]
    fn statements_are_counted_outside_comments_and_quotes() {
        assert_eq!(statements(""), 0);
        assert_eq!(statements("-- only a comment; with a semicolon\n"), 0);
        assert_eq!(statements("ALTER TABLE t ADD COLUMN c INT;"), 1);
        assert_eq!(statements("ALTER TABLE t ADD COLUMN c INT"), 1);
        assert_eq!(
            statements("-- why; because\nALTER TABLE t\n  ADD COLUMN c TEXT DEFAULT 'a;b';\n\n"),
            1
        );
        assert_eq!(statements("/* a; b */ SELECT 1; # c; d\nSELECT `x;y`;"), 2);
        assert_eq!(statements("SELECT 'it\\'s; here'; ;  ;"), 1);
    }

    #[test]
    fn this_release_s_migrations_are_counted() {
        let migrator = sqlx::migrate!();
        let count = |name: &str| {
            let m = migrator
                .iter()
                .find(|m| m.description == name)
                .expect("migration");
            statements(&m.sql)
        };
        assert_eq!(count("sale buyers"), 1);
        assert_eq!(count("report index"), 2);
        assert_eq!(count("create tables"), 2);
    }
}
