//! How this process talks to Redis.
//!
//! - Request-path commands (the order script, lookups) share ONE multiplexed
//!   connection (`ConnectionManager`, which reconnects by itself). Every
//!   request's EVALSHA is pipelined on it; Redis runs commands one at a time
//!   anyway, so more connections would add syscalls, not throughput.
//!   `flashsale bench-redis` measures this against a bb8 pool of connections
//!   checked out per request (see BENCHMARKS.md).
//! - Anything that blocks server-side (`XREADGROUP ... BLOCK` in the stream
//!   workers) takes a dedicated connection from the bb8 pool: on the shared
//!   connection it would stall every order pipelined behind it for the whole
//!   block time (the `blocked` mode of `bench-redis` shows the stall).
//!
//! Every call is bounded by a timeout, so a stalled or unreachable Redis gives
//! the caller an error in bounded time, never a hang. Connections are made
//! lazily: the service starts while Redis is down and answers 503 until it is up.

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};

use super::SaleError;

/// A bb8 pool of dedicated Redis connections, for blocking commands.
pub type Pool = bb8::Pool<BlockingConnections>;

/// Makes the pool's connections. Not `bb8_redis::RedisConnectionManager`:
/// its connections carry redis-rs's default 500 ms response timeout, which
/// fails every `BLOCK` longer than that on an idle stream (and the entries
/// the server then delivers arrive to nobody). These have no response
/// timeout of their own; each call is bounded by the caller, block time included.
#[derive(Debug, Clone)]
pub struct BlockingConnections {
    client: redis::Client,
    connect_timeout: Duration,
}

impl bb8::ManageConnection for BlockingConnections {
    type Connection = MultiplexedConnection;
    type Error = redis::RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    async fn is_valid(&self, conn: &mut Self::Connection) -> Result<(), Self::Error> {
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.connect_timeout, ping.query_async::<()>(conn)).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    fn has_broken(&self, _: &mut Self::Connection) -> bool {
        false
    }
}

/// The process's Redis handle: cheap to clone, shared by all tasks.
#[derive(Clone)]
pub struct Redis {
    shared: ConnectionManager,
    pool: Pool,
    timeout: Duration,
}

impl Redis {
    /// Builds the handle without connecting (connections are made on first use).
    pub fn new(url: &str, timeout: Duration, pool_size: u32) -> Result<Self, SaleError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Reconnect attempts are cheap and bounded; callers see a timeout meanwhile.
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let shared = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let pool = bb8::Pool::builder()
            .max_size(pool_size)
            .connection_timeout(timeout)
            .build_unchecked(BlockingConnections {
                client,
                connect_timeout: timeout,
            });
        Ok(Self {
            shared,
            pool,
            timeout,
        })
    }

    /// The shared multiplexed connection, for non-blocking commands.
    pub fn shared(&self) -> ConnectionManager {
        self.shared.clone()
    }

    /// The pool of dedicated connections, for blocking commands.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one Redis call with the configured timeout.
    pub async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, SaleError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(SaleError::Timeout(self.timeout)),
        }
    }

    /// `PING` on the shared connection: is Redis answering?
    pub async fn ping(&self) -> Result<(), SaleError> {
        let mut conn = self.shared();
        self.bounded(redis::cmd("PING").query_async::<()>(&mut conn))
            .await
    }
}
