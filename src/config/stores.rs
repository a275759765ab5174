//! Where Redis and MySQL are, and how to use them.

use std::time::Duration;

use clap::Args;

/// Where Redis is and how to use it.
#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// A Redis Cluster instead: some of its nodes, comma-separated
    /// (`127.0.0.1:7000,127.0.0.1:7001`); REDIS_URL is then ignored.
    #[arg(long, env = "REDIS_CLUSTER_NODES")]
    pub redis_cluster_nodes: Option<String>,
    /// Prefix of every key (`<prefix>:{<product_id>}:<name>`); lets deployments share a Redis.
    #[arg(long, env = "REDIS_KEY_PREFIX", value_name = "REDIS_KEY_PREFIX", default_value = "fs", value_parser = parse_prefix)]
    pub key_prefix: String,
    /// Upper bound on any single Redis call.
    #[arg(long, env = "REDIS_TIMEOUT_MS", default_value_t = 1000)]
    pub redis_timeout_ms: u64,
    /// Dedicated connections for blocking commands (and for orders, with WAIT).
    #[arg(long, env = "REDIS_POOL_SIZE", default_value_t = 16)]
    pub redis_pool_size: u32,
    /// Answer 202 only once this many replicas have the order (`WAIT`); 0: off.
    #[arg(long, env = "REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// How long `WAIT` may take before the order is answered 503.
    #[arg(long, env = "REDIS_WAIT_TIMEOUT_MS", default_value_t = 100)]
    pub redis_wait_timeout_ms: u64,
}

impl RedisArgs {
    pub fn target(&self) -> RedisTarget {
        RedisTarget::new(&self.redis_url, self.redis_cluster_nodes.as_deref())
    }

    pub fn wait(&self) -> Option<ReplicaWait> {
        (self.redis_wait_replicas > 0).then(|| ReplicaWait {
            replicas: self.redis_wait_replicas,
            timeout: Duration::from_millis(self.redis_wait_timeout_ms),
        })
    }
}

/// Where MySQL is and how to use it.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "mysql://root@127.0.0.1:3306/flashsale"
    )]
    pub database_url: String,
    /// Upper bound on any single MySQL call (and on waiting for a connection).
    #[arg(long, env = "DB_TIMEOUT_MS", default_value_t = 3000)]
    pub db_timeout_ms: u64,
    #[arg(long, env = "DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,
}

/// Where Redis is and how to use it, validated.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub target: RedisTarget,
    /// First part of every key (`<prefix>:{<product_id>}:<name>`).
    pub key_prefix: String,
    /// Upper bound on any single call.
    pub timeout: Duration,
    /// Dedicated connections (blocking reads; orders with WAIT).
    pub pool_size: u32,
    /// Replicas that must confirm a write before it counts (`None`: no WAIT).
    pub wait: Option<ReplicaWait>,
}

impl From<&RedisArgs> for RedisSettings {
    fn from(a: &RedisArgs) -> Self {
        Self {
            target: a.target(),
            key_prefix: a.key_prefix.clone(),
            timeout: Duration::from_millis(a.redis_timeout_ms),
            pool_size: a.redis_pool_size,
            wait: a.wait(),
        }
    }
}

/// Where MySQL is and how to use it.
#[derive(Debug, Clone)]
pub struct DbSettings {
    pub url: String,
    /// Upper bound on any single call (and on waiting for a connection).
    pub timeout: Duration,
    pub max_connections: u32,
}

impl From<&DbArgs> for DbSettings {
    fn from(a: &DbArgs) -> Self {
        Self {
            url: a.database_url.clone(),
            timeout: Duration::from_millis(a.db_timeout_ms),
            max_connections: a.db_max_connections,
        }
    }
}

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://host:port`).
    Single(String),
    /// A Redis Cluster, by some of its nodes (`redis://host:port` each).
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// `REDIS_CLUSTER_NODES` (comma-separated `host:port` or URLs) wins over
    /// `REDIS_URL` when set.
    pub fn new(url: &str, cluster_nodes: Option<&str>) -> Self {
        let nodes: Vec<String> = cluster_nodes
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| {
                if n.contains("://") {
                    n.to_owned()
                } else {
                    format!("redis://{n}")
                }
            })
            .collect();
        if nodes.is_empty() {
            Self::Single(url.to_owned())
        } else {
            Self::Cluster(nodes)
        }
    }
}

/// Durability of an accepted order: `WAIT replicas timeout` after the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

/// A key prefix must not contain braces: the first `{...}` of a key is its hash tag.
fn parse_prefix(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(['{', '}']) || s.chars().any(char::is_whitespace) {
        return Err("must be non-empty, without braces or spaces".into());
    }
    Ok(s.to_owned())
}
