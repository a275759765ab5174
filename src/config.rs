//! Typed settings, read once from the command line and the environment
//! (every flag has an env var and a default that works on a developer machine).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::http::auth::{AuthSettings, TrustedProxies};
use crate::http::conn::ConnectionSettings;
use crate::http::limits::{Limits, Rate, defaults as limit_defaults};
use crate::sale::memory::defaults as memory_defaults;
use crate::sale::{MemorySettings, Redis, RedisTarget, SaleError, Sales, Wait};
use crate::store::{Db, StoreError};
use crate::worker::WorkerConfig;

#[derive(Debug, Parser)]
#[command(
    name = "flashsale",
    version,
    about = "A flash-sale order service: Redis decides, MySQL keeps the books."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API (and, unless `--workers false`, the stream workers).
    Serve(Box<ServeArgs>),
    /// Run only the stream workers (Redis Stream -> MySQL).
    Worker(WorkerArgs),
    /// Check that every opened sale's books balance (Redis and MySQL).
    Audit(AuditArgs),
    /// Rebuild a sale in Redis from MySQL after Redis lost it.
    Recover(RecoverArgs),
    /// Show each sale's stream: length, group lag, pending entries per
    /// consumer, dead letters (what XINFO and XPENDING show).
    Streams(StreamsArgs),
    /// List the opened sales by state: upcoming, live, ended and not yet
    /// retired (and why), retired.
    Sales(SalesArgs),
}

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

    pub fn wait(&self) -> Option<Wait> {
        (self.redis_wait_replicas > 0).then(|| Wait {
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

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen_addr: SocketAddr,
    /// Bearer token for `/api/admin/*`: required (at least 16 characters, not
    /// a placeholder) unless `--admin-routes false`.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Serve the admin routes (`/api/admin/*`); without them they answer 404.
    #[arg(long, env = "ADMIN_ROUTES", default_value_t = true, action = clap::ArgAction::Set)]
    pub admin_routes: bool,
    /// How long a dashboard login lasts (`/admin/dashboard`), in seconds.
    #[arg(long, env = "DASHBOARD_SESSION_SECS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS / 1000))]
    pub dashboard_session_secs: u64,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    /// Run the stream workers inside this process.
    #[arg(long, env = "WORKERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub workers: bool,
    #[command(flatten)]
    pub worker: DrainArgs,
    /// Check the settings and print them as `serve` would run with them
    /// (secrets as fingerprints), then exit without serving.
    #[arg(long)]
    pub dry_run: bool,
}

impl ServeArgs {
    /// The secrets among these arguments, for a printout to hide.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = [&self.admin_token, &self.auth.jwt_secret]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        secrets.extend(url_password(&self.db.database_url));
        secrets.extend(url_password(&self.redis.redis_url));
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

/// The password in a URL (`scheme://user:password@host`), as written and
/// decoded.
fn url_password(url: &str) -> Vec<String> {
    let Some(password) = url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    else {
        return Vec::new();
    };
    let decoded = url::form_urlencoded::parse(format!("p={password}").as_bytes())
        .next()
        .map(|(_, p)| p.into_owned());
    std::iter::once(password).chain(decoded).collect()
}

/// The orders answered from memory, without Redis (see `sale::memory`).
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// How long a sale's sold-out answer is trusted in memory before Redis is
    /// asked again (0 disables the marker): the bound on claiming "sold out"
    /// after stock came back through another instance.
    #[arg(long, env = "SOLD_OUT_CACHE_MS", default_value_t = memory_defaults::SOLD_OUT_CACHE_MS)]
    pub sold_out_cache_ms: u64,
    /// How long a buyer's remaining allowance is trusted (0: never): the
    /// bound on refusing `limit_exceeded` after a cancel through another instance.
    #[arg(long, env = "LIMIT_CACHE_MS", default_value_t = memory_defaults::LIMIT_CACHE_MS)]
    pub limit_cache_ms: u64,
    /// Buyers whose allowance is remembered, per sale.
    #[arg(long, env = "LIMIT_CACHE_ENTRIES", default_value_t = memory_defaults::LIMIT_CACHE_ENTRIES)]
    pub limit_cache_entries: usize,
    /// How long a read of the registry of open sales is trusted to answer
    /// `product_not_found` (0: ask Redis): the bound on finding a sale
    /// opened through another instance.
    #[arg(long, env = "UNKNOWN_PRODUCT_CACHE_MS", default_value_t = memory_defaults::UNKNOWN_PRODUCT_CACHE_MS)]
    pub unknown_product_cache_ms: u64,
    /// Answer `sale_not_started` / `sale_ended` from memory while Redis's
    /// clock is certainly outside the window.
    #[arg(long, env = "WINDOW_FROM_MEMORY", default_value_t = true, action = clap::ArgAction::Set)]
    pub window_from_memory: bool,
    /// ... by at least this much: requests nearer a boundary go to Redis.
    #[arg(long, env = "WINDOW_MARGIN_MS", default_value_t = memory_defaults::WINDOW_MARGIN_MS)]
    pub window_margin_ms: u64,
}

impl From<MemoryArgs> for MemorySettings {
    fn from(a: MemoryArgs) -> Self {
        Self {
            sold_out_ttl: Duration::from_millis(a.sold_out_cache_ms),
            limit_ttl: Duration::from_millis(a.limit_cache_ms),
            limit_entries: a.limit_cache_entries,
            unknown_ttl: Duration::from_millis(a.unknown_product_cache_ms),
            window_margin: a
                .window_from_memory
                .then(|| Duration::from_millis(a.window_margin_ms)),
            clock_skew_ms: 0,
        }
    }
}

/// Who the buyer is (see `http::auth`): bearer JWTs, a trusted gateway's
/// header, or explicitly nobody (`AUTH=none`).
#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// `none`: no buyer identity; the body's `user_id` is believed, so anyone
    /// may order, read and cancel as anyone. For local trials only.
    #[arg(long = "auth", env = "AUTH", value_parser = ["none"])]
    pub auth: Option<String>,
    /// Verify bearer JWTs signed with this HMAC secret (HS256; >= 32 bytes).
    #[arg(long, env = "JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Verify bearer JWTs with this PEM public key (RSA: RS256, EC: ES256, Ed25519: EdDSA).
    #[arg(long, env = "JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,
    /// Verify bearer JWTs with the keys of this JWKS file, chosen by `kid`.
    #[arg(long, env = "JWT_JWKS_FILE")]
    pub jwt_jwks_file: Option<PathBuf>,
    /// The one algorithm accepted (default: the key's own), e.g. ES384, PS256.
    #[arg(long, env = "JWT_ALGORITHM", value_parser = parse_algorithm)]
    pub jwt_algorithm: Option<jsonwebtoken::Algorithm>,
    /// Tokens must carry this `iss`.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Tokens must carry this `aud`.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`.
    #[arg(long, env = "JWT_LEEWAY_SECS", default_value_t = crate::http::auth::JWT_LEEWAY_SECS)]
    pub jwt_leeway_secs: u64,
    /// The claim that holds the user id (a number, or digits in a string).
    #[arg(long, env = "JWT_USER_CLAIM", default_value = crate::http::auth::JWT_USER_CLAIM)]
    pub jwt_user_claim: String,
    /// Behind a gateway that authenticates buyers: the header it sets to the
    /// user id (e.g. `X-User-Id`), believed only from AUTH_TRUSTED_PROXIES.
    #[arg(long, env = "AUTH_USER_HEADER")]
    pub auth_user_header: Option<axum::http::HeaderName>,
    /// The gateway's addresses: comma-separated addresses or ranges (`10.0.0.0/8`).
    #[arg(long, env = "AUTH_TRUSTED_PROXIES")]
    pub auth_trusted_proxies: Option<TrustedProxies>,
    /// Verified tokens remembered (by SHA-256, until they expire); 0: verify every request.
    #[arg(long, env = "AUTH_TOKEN_CACHE_SIZE", default_value_t = crate::http::auth::AUTH_TOKEN_CACHE_SIZE)]
    pub auth_token_cache_size: usize,
}

impl From<AuthArgs> for AuthSettings {
    fn from(a: AuthArgs) -> Self {
        Self {
            off: a.auth.is_some(),
            jwt_secret: a.jwt_secret.filter(|s| !s.is_empty()),
            jwt_public_key_file: a.jwt_public_key_file,
            jwt_jwks_file: a.jwt_jwks_file,
            jwt_algorithm: a.jwt_algorithm,
            jwt_issuer: a.jwt_issuer.filter(|s| !s.is_empty()),
            jwt_audience: a.jwt_audience.filter(|s| !s.is_empty()),
            jwt_leeway: Duration::from_secs(a.jwt_leeway_secs),
            jwt_user_claim: a.jwt_user_claim,
            user_header: a.auth_user_header,
            trusted_proxies: a.auth_trusted_proxies.unwrap_or_default().0,
            token_cache_entries: a.auth_token_cache_size,
        }
    }
}

/// A JWT algorithm by name (`JWT_ALGORITHM`, the bench's `--jwt-algorithm`).
pub fn parse_algorithm(s: &str) -> Result<jsonwebtoken::Algorithm, String> {
    s.parse().map_err(|_| {
        format!("{s:?}: one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA")
    })
}

/// The longest a timeout may be set to (a day).
const DAY_MS: u64 = 86_400_000;

/// The bounds on client connections (see `http::conn`).
#[derive(Debug, Clone, Args)]
pub struct ConnectionArgs {
    /// A request head must arrive whole within this long of the
    /// connection's accept, or of its first byte after an answer.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = crate::http::conn::HEADER_READ_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection waits this long for its next request (and
    /// an answer this long for a client that stopped reading). Behind a
    /// load balancer, keep it above the balancer's own idle timeout.
    #[arg(long, env = "IDLE_TIMEOUT_MS", default_value_t = crate::http::conn::IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub idle_timeout_ms: u64,
    /// Open connections at most; at the cap a new one takes the place of
    /// the one that has waited longest on its client [default: the
    /// open-file limit less 256].
    #[arg(long, env = "MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_connections: Option<u64>,
    /// Open connections from one client address at most (0: no cap)
    /// [default: a quarter of MAX_CONNECTIONS]. Behind a load balancer,
    /// every client shares its address: 0.
    #[arg(long, env = "MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<u64>,
}

impl ConnectionArgs {
    /// The bounds `serve` starts with when none are given on its command
    /// line (the environment's, else the defaults above): for services
    /// built in code (the benchmarks).
    pub fn settings() -> ConnectionSettings {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            connections: ConnectionArgs,
        }
        (&Only::parse_from(["flashsale"]).connections).into()
    }
}

impl From<&ConnectionArgs> for ConnectionSettings {
    fn from(a: &ConnectionArgs) -> Self {
        let max_open = a
            .max_connections
            .map_or_else(ConnectionSettings::derived_max_open, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            });
        Self {
            header_read_timeout: Duration::from_millis(a.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(a.idle_timeout_ms),
            max_open,
            max_per_address: a
                .max_connections_per_address
                .map_or(max_open / 4, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }
}

/// The guards in front of the order path (see `http::limits`).
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Orders decided at once; beyond it `POST /api/orders` answers 503
    /// `overloaded` at once instead of queueing (0: unbounded).
    #[arg(long, env = "MAX_IN_FLIGHT", default_value_t = crate::http::limits::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Upper bound on handling any request; past it, 503 `unavailable`.
    #[arg(long, env = "REQUEST_TIMEOUT_MS", default_value_t = limit_defaults::REQUEST_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub request_timeout_ms: u64,
    /// Rate limits on `POST /api/orders`, lookups and polls (false turns all off).
    #[arg(long, env = "RATE_LIMITS", default_value_t = true, action = clap::ArgAction::Set)]
    pub rate_limits: bool,
    /// Orders per second per user, sustained (0: no per-user limit).
    #[arg(long, env = "RATE_LIMIT_USER_PER_SEC", default_value_t = limit_defaults::USER_RATE.0)]
    pub rate_limit_user_per_sec: u32,
    /// Orders per user at once before the per-second rate applies.
    #[arg(long, env = "RATE_LIMIT_USER_BURST", default_value_t = limit_defaults::USER_RATE.1)]
    pub rate_limit_user_burst: u32,
    /// Orders per second per client address (0: no per-address limit).
    #[arg(long, env = "RATE_LIMIT_IP_PER_SEC", default_value_t = limit_defaults::IP_RATE.0)]
    pub rate_limit_ip_per_sec: u32,
    #[arg(long, env = "RATE_LIMIT_IP_BURST", default_value_t = limit_defaults::IP_RATE.1)]
    pub rate_limit_ip_burst: u32,
    /// Order lookups, pays, cancels and waiting-room joins per second per
    /// client address (0: no limit): ids cannot be tried by the thousand.
    #[arg(long, env = "RATE_LIMIT_LOOKUP_PER_SEC", default_value_t = limit_defaults::LOOKUP_RATE.0)]
    pub rate_limit_lookup_per_sec: u32,
    #[arg(long, env = "RATE_LIMIT_LOOKUP_BURST", default_value_t = limit_defaults::LOOKUP_RATE.1)]
    pub rate_limit_lookup_burst: u32,
    /// Waiting-room polls per second per client address (0: no limit).
    #[arg(long, env = "RATE_LIMIT_POLL_PER_SEC", default_value_t = limit_defaults::POLL_RATE.0)]
    pub rate_limit_poll_per_sec: u32,
    #[arg(long, env = "RATE_LIMIT_POLL_BURST", default_value_t = limit_defaults::POLL_RATE.1)]
    pub rate_limit_poll_burst: u32,
    /// Clients tracked per limit; idle ones are evicted, and new ones are
    /// refused (429) while the table is full of active ones.
    #[arg(long, env = "RATE_LIMIT_MAX_KEYS", default_value_t = limit_defaults::MAX_KEYS)]
    pub rate_limit_max_keys: usize,
    /// Behind a proxy: read the client address from this header's last entry
    /// (e.g. `X-Forwarded-For`). Only set it when a proxy you run sets it.
    #[arg(long, env = "CLIENT_IP_HEADER")]
    pub client_ip_header: Option<axum::http::HeaderName>,
}

impl From<LimitArgs> for Limits {
    fn from(a: LimitArgs) -> Self {
        let rate = |on: bool, per_sec, burst| if on { Rate::new(per_sec, burst) } else { None };
        Self {
            max_in_flight: a.max_in_flight,
            request_timeout: Duration::from_millis(a.request_timeout_ms),
            user_rate: rate(
                a.rate_limits,
                a.rate_limit_user_per_sec,
                a.rate_limit_user_burst,
            ),
            ip_rate: rate(
                a.rate_limits,
                a.rate_limit_ip_per_sec,
                a.rate_limit_ip_burst,
            ),
            lookup_rate: rate(
                a.rate_limits,
                a.rate_limit_lookup_per_sec,
                a.rate_limit_lookup_burst,
            ),
            poll_rate: rate(
                a.rate_limits,
                a.rate_limit_poll_per_sec,
                a.rate_limit_poll_burst,
            ),
            max_keys: a.rate_limit_max_keys,
            client_ip_header: a.client_ip_header,
            ..Limits::default()
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Serve `GET /metrics` (Prometheus) on this address; off by default
    /// (the API serves its own on its port).
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics listener's connections.
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub worker: DrainArgs,
    /// Check the settings and print them (secrets as fingerprints), then
    /// exit without running.
    #[arg(long)]
    pub dry_run: bool,
}

impl WorkerArgs {
    /// The secrets among these arguments, for a printout to hide.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = Vec::new();
        secrets.extend(url_password(&self.db.database_url));
        secrets.extend(url_password(&self.redis.redis_url));
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this sale.
    #[arg(long)]
    pub product: Option<String>,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    #[arg(long)]
    pub product: String,
    /// Rebuild even if Redis still has the sale or its stream holds orders
    /// not yet in MySQL (those would be forgotten).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SalesArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// As the workers judge it: a sale retires no sooner than this after its end.
    #[arg(long, env = "RETIRE_AFTER_SECS", default_value_t = crate::books::retire::RETIRE_AFTER_SECS)]
    pub retire_after_secs: u64,
    /// JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Only this sale (default: every open sale).
    #[arg(long)]
    pub product: Option<String>,
    /// List at most this many pending entries per sale (the oldest).
    #[arg(long, default_value_t = 20)]
    pub pending: usize,
    /// JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// How the stream workers drain the sales' streams.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Consumer name in the sales' consumer groups [default: <hostname>-<pid>].
    /// Give each worker process a stable, unique name to have it resume its own
    /// pending entries right after a restart.
    #[arg(long, env = "CONSUMER_NAME")]
    pub consumer_name: Option<String>,
    /// Entries per read and rows per MySQL transaction (1-5000).
    #[arg(long, env = "BATCH_SIZE", default_value_t = crate::worker::defaults::BATCH_SIZE,
          value_parser = batch_size)]
    pub batch_size: usize,
    /// How long a read waits for new entries (also bounds shutdown time).
    #[arg(long, env = "BLOCK_MS", default_value_t = crate::worker::defaults::BLOCK_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub block_ms: u64,
    /// Pending entries idle this long are reclaimed from their consumer.
    #[arg(long, env = "CLAIM_IDLE_MS", default_value_t = crate::worker::defaults::CLAIM_IDLE_MS)]
    pub claim_idle_ms: u64,
    /// An entry that cannot be persisted goes to dead letters after this many deliveries.
    #[arg(long, env = "MAX_DELIVERIES", default_value_t = crate::worker::defaults::MAX_DELIVERIES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deliveries: u64,
    /// Acked entries stay in the stream this long before they are trimmed.
    #[arg(long, env = "STREAM_RETENTION_SECS", default_value_t = crate::worker::defaults::STREAM_RETENTION_SECS)]
    pub stream_retention_secs: u64,
    /// Orders confirmed and not paid within this many seconds are cancelled.
    #[arg(long, env = "PAYMENT_TIMEOUT_SECS", default_value_t = crate::worker::defaults::PAYMENT_TIMEOUT_SECS)]
    pub payment_timeout_secs: u64,
    /// Every open sale's books are checked this often (0: never); the
    /// verdict is `flashsale_sale_books_balanced`.
    #[arg(long, env = "BOOKS_CHECK_MS", default_value_t = crate::worker::defaults::BOOKS_CHECK_MS)]
    pub books_check_ms: u64,
    /// Ended sales are looked at this often and retired once settled (0:
    /// never): final audit into MySQL, out of the registry, keys deleted.
    #[arg(long, env = "RETIRE_CHECK_MS", default_value_t = crate::worker::defaults::RETIRE_CHECK_MS)]
    pub retire_check_ms: u64,
    /// A sale retires no sooner than this many seconds after its end.
    #[arg(long, env = "RETIRE_AFTER_SECS", default_value_t = crate::books::retire::RETIRE_AFTER_SECS)]
    pub retire_after_secs: u64,
    /// A retired sale's Redis keys are deleted this many seconds after its
    /// retirement (a last look with redis-cli).
    #[arg(long, env = "RETIRE_GRACE_SECS", default_value_t = crate::books::retire::RETIRE_GRACE_SECS)]
    pub retire_grace_secs: u64,
}

impl From<DrainArgs> for WorkerConfig {
    fn from(a: DrainArgs) -> Self {
        let default = WorkerConfig::default();
        Self {
            consumer: a
                .consumer_name
                .filter(|n| !n.is_empty())
                .unwrap_or(default.consumer),
            batch_size: a.batch_size,
            block: Duration::from_millis(a.block_ms),
            claim_idle: Duration::from_millis(a.claim_idle_ms),
            max_deliveries: a.max_deliveries,
            retention: Duration::from_secs(a.stream_retention_secs),
            payment_timeout: Duration::from_secs(a.payment_timeout_secs),
            books_every: Duration::from_millis(a.books_check_ms),
            retire_every: Duration::from_millis(a.retire_check_ms),
            retire: crate::books::retire::RetireSettings {
                after: Duration::from_secs(a.retire_after_secs),
                grace: Duration::from_secs(a.retire_grace_secs),
                ..default.retire
            },
            ..default
        }
    }
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
    pub wait: Option<Wait>,
}

impl RedisSettings {
    /// The sales over this Redis: handles made without connecting (Redis
    /// need not answer yet).
    pub fn sales(&self) -> Result<Sales, SaleError> {
        self.sales_with(MemorySettings::default())
    }

    /// [`Self::sales`], answering orders from memory as `memory` says.
    pub fn sales_with(&self, memory: MemorySettings) -> Result<Sales, SaleError> {
        Ok(Sales::new(
            self.redis()?,
            self.key_prefix.clone(),
            memory,
            self.wait,
        ))
    }

    /// A handle to this Redis itself, below the sales (for benchmarks of
    /// Redis alone, and tests that look at its nodes).
    pub fn redis(&self) -> Result<Redis, SaleError> {
        Redis::new(&self.target, self.timeout, self.pool_size)
    }
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

impl DbSettings {
    /// The books' database: a pool made without connecting (MySQL need not
    /// answer yet).
    pub fn db(&self) -> Result<Db, StoreError> {
        Db::connect_lazy(&self.url, self.timeout, self.max_connections)
    }
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

/// The HTTP API's settings.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub listen_addr: SocketAddr,
    pub admin_token: Option<Arc<str>>,
    /// Serve `/api/admin/*` (then `admin_token` must be a strong one).
    pub admin_routes: bool,
    /// How long a dashboard login lasts (the admin routes include the dashboard).
    pub dashboard_session: Duration,
    /// Who buyers are (`AuthSettings::off()`: `AUTH=none`).
    pub auth: AuthSettings,
    /// How many connections, and how long each may wait on its client.
    pub connections: ConnectionSettings,
    pub limits: Limits,
    /// Which orders are answered from memory, and for how long.
    pub memory: MemorySettings,
}

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub redis: RedisSettings,
    pub db: DbSettings,
    pub http: HttpSettings,
    /// `None`: this process runs no stream workers.
    pub workers: Option<WorkerConfig>,
}

impl From<ServeArgs> for Settings {
    fn from(a: ServeArgs) -> Self {
        Self {
            redis: (&a.redis).into(),
            db: (&a.db).into(),
            http: HttpSettings {
                listen_addr: a.listen_addr,
                admin_token: a.admin_token.filter(|t| !t.is_empty()).map(Arc::from),
                admin_routes: a.admin_routes,
                dashboard_session: Duration::from_secs(a.dashboard_session_secs),
                auth: a.auth.into(),
                connections: (&a.connections).into(),
                limits: a.limits.into(),
                memory: a.memory.into(),
            },
            workers: a.workers.then(|| a.worker.into()),
        }
    }
}

/// Everything `worker` needs: no HTTP API, only (optionally) its metrics.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub redis: RedisSettings,
    pub db: DbSettings,
    pub worker: WorkerConfig,
    /// Serve `GET /metrics` here.
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics listener's connections.
    pub connections: ConnectionSettings,
}

impl From<WorkerArgs> for WorkerSettings {
    fn from(a: WorkerArgs) -> Self {
        Self {
            redis: (&a.redis).into(),
            db: (&a.db).into(),
            worker: a.worker.into(),
            metrics_addr: a.metrics_addr,
            connections: (&a.connections).into(),
        }
    }
}

/// `BATCH_SIZE`: 1 to `MAX_BATCH_SIZE` (refused otherwise, not clamped).
fn batch_size(s: &str) -> Result<usize, String> {
    let max = crate::worker::MAX_BATCH_SIZE;
    s.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("must be a whole number from 1 to {max}"))
}

/// A key prefix must not contain braces: the first `{...}` of a key is its hash tag.
fn parse_prefix(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(['{', '}']) || s.chars().any(char::is_whitespace) {
        return Err("must be non-empty, without braces or spaces".into());
    }
    Ok(s.to_owned())
}

/// Why `token` must not guard the admin routes, if it must not.
pub fn weak_admin_token(token: Option<&str>) -> Option<&'static str> {
    const PLACEHOLDERS: [&str; 8] = [
        "admin",
        "changeme",
        "change-me",
        "password",
        "secret",
        "token",
        "default",
        "example",
    ];
    let Some(token) = token else {
        return Some("ADMIN_TOKEN is not set");
    };
    let lower = token.to_ascii_lowercase();
    let distinct = token
        .chars()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if token.chars().count() < 16 {
        Some("ADMIN_TOKEN is shorter than 16 characters")
    } else if distinct < 8 || PLACEHOLDERS.iter().any(|p| lower.starts_with(p)) {
        Some("ADMIN_TOKEN looks like a placeholder, not a secret")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_tokens_must_be_long_random_secrets() {
        assert_eq!(weak_admin_token(None), Some("ADMIN_TOKEN is not set"));
        assert!(weak_admin_token(Some("short")).is_some_and(|w| w.contains("16")));
        for placeholder in [
            "changeme-changeme-changeme",
            "Admin-0123456789abcdef",
            "aaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(
                weak_admin_token(Some(placeholder)).is_some_and(|w| w.contains("placeholder")),
                "{placeholder}"
            );
        }
        assert_eq!(weak_admin_token(Some("3f9a1c0b7e2d4a6f8b5c1e0d")), None);
    }
}
