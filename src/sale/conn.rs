//! How this process talks to Redis, a single server or a Redis Cluster.
//!
//! - Request-path commands (the order script, lookups) share ONE multiplexed
//!   connection: a `ConnectionManager` (which reconnects by itself) on a
//!   single server, a `ClusterConnection` (one multiplexed connection per
//!   master, following MOVED/ASK and failovers) on a cluster. Every request's
//!   EVALSHA is pipelined on it; Redis runs commands one at a time anyway, so
//!   more connections would add syscalls, not throughput. `flashsale-bench
//!   redis` measures this against a pool of connections checked out per
//!   request (BENCHMARKS.md, "One connection, not a pool").
//! - Anything that blocks server-side (`XREADGROUP ... BLOCK` in the stream
//!   workers) takes a dedicated connection from the bb8 pool: on the shared
//!   connection it would stall every order pipelined behind it for the whole
//!   block time (the `blocked` mode of `flashsale-bench redis` shows the stall).
//!
//! Every call is bounded by a timeout, so a stalled or unreachable Redis gives
//! the caller an error in bounded time, never a hang. Connections are made
//! lazily: the service starts while Redis is down and answers 503 until it is up.
//!
//! **A cluster connection that stops answering is rebuilt.** redis-rs's
//! `ClusterConnection` (1.8) can wedge for good in a failover: its slot
//! refresh waits for the write half of its connection map's lock while a
//! request or a reconnect it no longer polls during the refresh holds (or
//! has been granted) the read half. Every call on it then times out,
//! forever, whichever master it is for (issue 68: a `serve` with 100+ streams
//! open after its first seed node died; the more streams, the more requests
//! in flight when the refresh starts). So when no call on the shared
//! connection has succeeded for [`HEAL_AFTER_TIMEOUTS`] times the Redis
//! timeout and some timed out, the next caller drops it and connects
//! afresh (the wedged one's task is left behind: a few sockets per
//! failover that wedged one). Meanwhile `/readyz` fails (its `PING` on
//! every master times out), so a load balancer sends no buyer there; the
//! pools' connections are checked with a `PING` at checkout and replaced
//! when they fail it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use super::error::SaleError;
use crate::config::{RedisSettings, RedisTarget};

/// A connection of either kind; all of this crate's Redis code runs on it.
#[derive(Clone)]
pub enum Conn {
    Managed(ConnectionManager),
    Direct(MultiplexedConnection),
    Cluster(ClusterConnection),
    /// The shared cluster connection, each request's answer noted (see
    /// [`Healing`]).
    Watched(ClusterConnection, Arc<Healing>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Managed(c) => c.req_packed_command(cmd),
            Self::Direct(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Watched(c, healing) => healing.watch(c.req_packed_command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Managed(c) => c.req_packed_commands(cmd, offset, count),
            Self::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Self::Watched(c, healing) => healing.watch(c.req_packed_commands(cmd, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Managed(c) => c.get_db(),
            Self::Direct(c) => c.get_db(),
            Self::Cluster(c) | Self::Watched(c, _) => c.get_db(),
        }
    }
}

/// The clients behind the connections.
#[derive(Clone)]
enum Client {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// A bb8 pool of dedicated connections, for blocking commands.
pub type Pool = bb8::Pool<BlockingConnections>;

/// Makes the pool's connections. Not `bb8_redis::RedisConnectionManager`:
/// its connections carry redis-rs's default 500 ms response timeout, which
/// fails every `BLOCK` longer than that on an idle stream (and the entries
/// the server then delivers arrive to nobody). These have no response
/// timeout of their own; each call is bounded by the caller, block time included.
#[derive(Clone)]
pub struct BlockingConnections {
    client: Client,
    connect_timeout: Duration,
}

impl bb8::ManageConnection for BlockingConnections {
    type Connection = Conn;
    type Error = redis::RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        match &self.client {
            Client::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(None);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Direct(conn))
            }
            Client::Cluster(client) => Ok(Conn::Cluster(client.get_async_connection().await?)),
        }
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
    /// Single server: the ConnectionManager, made at once (it connects lazily).
    managed: Option<ConnectionManager>,
    /// Cluster: the ClusterConnection, made on first use and made again
    /// when it stops answering.
    cluster: Option<Arc<Healing>>,
    pool: Pool,
    /// Connections an order holds alone while it WAITs for replicas.
    exclusive: Pool,
    /// Where a subscriber connects (`subscriber`): the server, or each
    /// seed node of a cluster in turn (a cluster delivers a `PUBLISH` on
    /// every node).
    subscribe_at: Arc<Vec<redis::Client>>,
    timeout: Duration,
}

impl Redis {
    /// The handle to the Redis `settings` name, made without connecting
    /// (Redis need not answer yet).
    pub fn from_settings(settings: &RedisSettings) -> Result<Self, SaleError> {
        Self::new(&settings.target, settings.timeout, settings.pool_size)
    }

    /// Builds the handle without connecting (connections are made on first use).
    pub fn new(target: &RedisTarget, timeout: Duration, pool_size: u32) -> Result<Self, SaleError> {
        let subscribe_at = match target {
            RedisTarget::Single(url) => vec![redis::Client::open(url.as_str())?],
            RedisTarget::Cluster(nodes) => nodes
                .iter()
                .map(|n| redis::Client::open(n.as_str()))
                .collect::<Result<_, _>>()?,
        };
        let (managed, cluster, client) = match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    // Reconnect attempts are cheap and bounded; callers see a timeout meanwhile.
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let managed = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                (Some(managed), None, Client::Single(client))
            }
            RedisTarget::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // MOVED/ASK and failovers are retried inside the client, a
                    // few times with short waits; our own bound caps the total.
                    .retries(4)
                    .min_retry_wait(20)
                    .max_retry_wait(300)
                    .build()?;
                (
                    None,
                    Some(Arc::new(Healing::new(client.clone(), timeout))),
                    Client::Cluster(Box::new(client)),
                )
            }
        };
        let connections = BlockingConnections {
            client,
            connect_timeout: timeout,
        };
        // Two pools, so that orders waiting for replicas and workers waiting
        // for entries never starve each other.
        let pool = || {
            bb8::Pool::builder()
                .max_size(pool_size)
                .connection_timeout(timeout)
                .build_unchecked(connections.clone())
        };
        Ok(Self {
            managed,
            cluster,
            pool: pool(),
            exclusive: pool(),
            subscribe_at: Arc::new(subscribe_at),
            timeout,
        })
    }

    /// A pub/sub connection subscribed to `channel`: on the server, or on
    /// the first seed node of a cluster that answers (each try bounded by
    /// the Redis timeout).
    pub async fn subscriber(&self, channel: &str) -> Result<redis::aio::PubSub, SaleError> {
        let mut last = SaleError::Timeout(self.timeout);
        for client in self.subscribe_at.iter() {
            let subscribe = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match self.bounded(subscribe).await {
                Ok(pubsub) => return Ok(pubsub),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The shared multiplexed connection, for non-blocking commands.
    pub async fn shared(&self) -> Result<Conn, SaleError> {
        if let Some(managed) = &self.managed {
            return Ok(Conn::Managed(managed.clone()));
        }
        let Some(healing) = &self.cluster else {
            unreachable!("a Redis handle is either single or cluster");
        };
        let conn = healing.connection().await?;
        Ok(Conn::Watched(conn, healing.clone()))
    }

    /// True on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// The pool of dedicated connections, for blocking reads.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The pool of connections an order holds alone (to WAIT on it).
    pub fn exclusive(&self) -> &Pool {
        &self.exclusive
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `call` on the shared connection, within the configured timeout.
    pub async fn call<T, F>(&self, call: impl FnOnce(Conn) -> F) -> Result<T, SaleError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.shared().await?;
        self.bounded(call(conn)).await
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

    /// For each hash tag: an id of the Redis master that serves it, which
    /// changes when that master's data may have changed under us: on a
    /// cluster the slot's master node id (a failover promotes another
    /// node), on a single server its replication id (new at every restart).
    /// One command per call, however many tags.
    pub async fn master_epochs(&self, tags: &[&str]) -> Result<Vec<String>, SaleError> {
        let mut conn = self.shared().await?;
        if !self.is_cluster() {
            let info: String = self
                .bounded(redis::cmd("INFO").arg("replication").query_async(&mut conn))
                .await?;
            let replid = info
                .lines()
                .find_map(|l| l.strip_prefix("master_replid:"))
                .map(|id| id.trim().to_owned())
                .ok_or_else(|| {
                    SaleError::Corrupt("INFO replication without master_replid".into())
                })?;
            return Ok(vec![replid; tags.len()]);
        }
        let ranges: Vec<Value> = self
            .bounded(redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn))
            .await?;
        let mut owners: Vec<(i64, i64, String)> = Vec::with_capacity(ranges.len());
        for range in ranges {
            if let Value::Array(parts) = range
                && let [Value::Int(start), Value::Int(end), Value::Array(node), ..] =
                    parts.as_slice()
            {
                // [host, port, node id]: the id when given, else the address.
                let id: Vec<String> = node
                    .iter()
                    .filter_map(|v| redis::FromRedisValue::from_redis_value(v.clone()).ok())
                    .collect();
                let owner = id.get(2).cloned().unwrap_or_else(|| id.join(":"));
                owners.push((*start, *end, owner));
            }
        }
        Ok(tags
            .iter()
            .map(|tag| {
                let slot = i64::from(key_slot(tag));
                owners
                    .iter()
                    .find(|(start, end, _)| *start <= slot && slot <= *end)
                    .map_or_else(|| "unserved".to_owned(), |(_, _, owner)| owner.clone())
            })
            .collect())
    }

    /// `PING`: is Redis answering? (On a cluster: every master.)
    pub async fn ping(&self) -> Result<(), SaleError> {
        let mut conn = self.shared().await?;
        self.bounded(redis::cmd("PING").query_async::<Value>(&mut conn))
            .await
            .map(|_| ())
    }
}

/// After how many Redis timeouts without an answer the shared cluster
/// connection is made again (see the module's documentation).
pub const HEAL_AFTER_TIMEOUTS: u32 = 2;

/// The shared cluster connection, and what tells that it stopped answering.
pub struct Healing {
    client: ClusterClient,
    timeout: Duration,
    /// The connection, once made; `None` until then, or after it was dropped.
    conn: RwLock<Option<ClusterConnection>>,
    /// One caller connects at a time; the others wait for its connection.
    connecting: tokio::sync::Mutex<()>,
    /// When this handle was made (the clock of the two below).
    epoch: Instant,
    /// Microseconds since `epoch` of the last request answered (an error
    /// is an answer, the connection is alive; the client's own response
    /// timeout is not).
    last_answer_us: AtomicU64,
    /// Microseconds since `epoch` of when the first request since then that
    /// went unanswered for the Redis timeout was sent (0: none).
    stalled_since_us: AtomicU64,
}

impl Healing {
    fn new(client: ClusterClient, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            conn: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
            epoch: Instant::now(),
            last_answer_us: AtomicU64::new(0),
            stalled_since_us: AtomicU64::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        // At least 1: 0 means "none".
        (self.epoch.elapsed().as_micros() as u64).max(1)
    }

    /// A request on the shared connection, watched: an answer (an error
    /// is one, the client's own response timeout is not) clears the
    /// stall; no answer within (most of) the Redis timeout (timed out, or
    /// dropped by a caller who waited that long) is a sign of one, dated
    /// from when the request was sent. A caller who stops waiting sooner (its
    /// client went away) says nothing either way.
    fn watch<'a, T: 'a>(self: &Arc<Self>, request: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
        let mut watched = Watched {
            healing: self.clone(),
            sent_us: self.now_us(),
            answered: false,
        };
        Box::pin(async move {
            let answer = request.await;
            if !matches!(&answer, Err(e) if e.is_timeout()) {
                watched.answered = true;
                let healing = &watched.healing;
                healing
                    .last_answer_us
                    .store(healing.now_us(), Ordering::Relaxed);
                healing.stalled_since_us.store(0, Ordering::Relaxed);
            }
            answer
        })
    }

    /// True when a request went unanswered for the Redis timeout, and none
    /// sent since it was answered, for [`HEAL_AFTER_TIMEOUTS`] Redis
    /// timeouts.
    fn stalled(&self) -> bool {
        let since = self.stalled_since_us.load(Ordering::Relaxed);
        let bound = (self.timeout * HEAL_AFTER_TIMEOUTS).as_micros() as u64;
        since != 0
            && self.last_answer_us.load(Ordering::Relaxed) < since
            && self.now_us().saturating_sub(since) >= bound
    }

    fn current(&self) -> Option<ClusterConnection> {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The shared connection: the one made before, unless it stopped
    /// answering; else a new one (bounded by the Redis timeout).
    async fn connection(&self) -> Result<ClusterConnection, SaleError> {
        if !self.stalled()
            && let Some(conn) = self.current()
        {
            return Ok(conn);
        }
        let connect = async {
            let _turn = self.connecting.lock().await;
            // Another caller may have connected meanwhile.
            if self.stalled() {
                let dropped = self.conn.write().unwrap_or_else(|e| e.into_inner()).take();
                // The clock starts again with the new connection.
                self.stalled_since_us.store(0, Ordering::Relaxed);
                if dropped.is_some() {
                    tracing::warn!(
                        after = ?self.timeout * HEAL_AFTER_TIMEOUTS,
                        "the Redis Cluster connection stopped answering: connecting afresh"
                    );
                }
            }
            if let Some(conn) = self.current() {
                return Ok(conn);
            }
            let conn = self.client.get_async_connection().await?;
            *self.conn.write().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
            Ok::<_, SaleError>(conn)
        };
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(conn) => conn,
            Err(_) => Err(SaleError::Timeout(self.timeout)),
        }
    }
}

/// A request in flight on the shared cluster connection (see
/// [`Healing::watch`]).
struct Watched {
    healing: Arc<Healing>,
    sent_us: u64,
    answered: bool,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let healing = &self.healing;
        let waited = healing.now_us().saturating_sub(self.sent_us);
        // Most of the timeout: a caller's own bound starts a little before
        // its request is sent.
        let most = (healing.timeout * 3 / 4).as_micros() as u64;
        // A sign only if nothing was answered since it was sent; it dates
        // the stall unless a sign sent earlier, after the last answer, does.
        let last_answer = healing.last_answer_us.load(Ordering::Relaxed);
        if !self.answered && waited >= most && self.sent_us > last_answer {
            let _ = healing.stalled_since_us.fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                |since| (since <= last_answer || since > self.sent_us).then_some(self.sent_us),
            );
        }
    }
}

/// The Redis Cluster slot of keys whose hash tag is `tag` (CRC16/XMODEM
/// of the tag, modulo 16384).
pub fn key_slot(tag: &str) -> u16 {
    crate::domain::key_slot(tag)
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_slot_matches_redis() {
        // `CLUSTER KEYSLOT` answers, from a Redis 7 server.
        assert_eq!(super::key_slot("foo"), 12182);
        assert_eq!(super::key_slot("sku-1"), 4521);
        assert_eq!(super::key_slot(""), 0);
    }
}
