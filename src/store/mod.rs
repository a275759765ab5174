//! MySQL: the books. Products are created here; accepted orders are written
//! here by the stream workers. Nothing on the order path reads or writes MySQL.

mod lifecycle;
mod orders;
mod products;

use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

pub use lifecycle::{CANCELLED, PAID, Transition};
pub use orders::{CONFIRMED, OrderRow, Persisted};
pub use products::{NewProduct, Product};

/// A failure of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("a product with this id exists")]
    ProductExists,
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("mysql did not answer within {0:?}")]
    Timeout(Duration),
    #[error("bad DATABASE_URL: {0}")]
    Config(String),
}

impl StoreError {
    /// True when MySQL is down, slow or out of connections (a 503, not a bug).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
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

/// The MySQL pool, with a timeout applied to every call.
#[derive(Clone)]
pub struct Db {
    pool: MySqlPool,
    timeout: Duration,
}

impl Db {
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
        Ok(Self { pool, timeout })
    }

    /// Creates the database named in `url` if it is missing, then runs the
    /// migrations: `flashsale serve` works on a fresh server with no manual step.
    pub async fn create_and_migrate(&self, url: &str) -> Result<(), StoreError> {
        // Longer than one call's bound: a fresh schema is several DDL statements.
        let bound = (self.timeout * 10).max(Duration::from_secs(30));
        let work = async {
            create_database(url).await?;
            // Several processes may start at once on a fresh database (an API
            // and its workers). sqlx's own migration lock is `GET_LOCK(.., -1)`,
            // which MariaDB answers at once without the lock, so two migrators
            // race and one fails on a duplicate version: take a lock that waits.
            let mut conn = self.pool.acquire().await?;
            let locked: Option<i64> =
                sqlx::query_scalar("SELECT GET_LOCK('flashsale.migrate', 60)")
                    .fetch_one(&mut *conn)
                    .await?;
            if locked != Some(1) {
                return Err(StoreError::Timeout(Duration::from_secs(60)));
            }
            let mut migrator = sqlx::migrate!();
            migrator.set_locking(false);
            // run_direct: `run` trips "Acquire is not general enough" in spawned tasks.
            let migrated = migrator.run_direct(&mut *conn).await;
            sqlx::query("DO RELEASE_LOCK('flashsale.migrate')")
                .execute(&mut *conn)
                .await?;
            migrated?;
            Ok(())
        };
        tokio::time::timeout(bound, work)
            .await
            .unwrap_or(Err(StoreError::Timeout(bound)))
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Runs one storage call with the configured timeout.
    pub async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }

    /// `SELECT 1`: is MySQL answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        })
        .await
    }
}

/// `CREATE DATABASE IF NOT EXISTS` for the database named in `url`.
async fn create_database(url: &str) -> Result<(), StoreError> {
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
    Ok(())
}

/// Milliseconds since the epoch, as the tables store time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
