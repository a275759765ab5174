//! Typed settings, read once from the command line and the environment
//! (every flag has an env var and a default that works on a developer machine).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod bounds;
mod guards;
mod http;
mod stores;
mod worker;

pub(crate) use self::bounds::DAY_MS;
pub use self::guards::{
    ConnectionArgs, ConnectionSettings, DEFAULT_MAX_IN_FLIGHT, HEADER_READ_TIMEOUT_MS,
    IDLE_TIMEOUT_MS, LimitArgs, Limits, MemoryArgs, MemorySettings, RateLimit, limit_defaults,
    memory_defaults, open_file_limit, raise_open_file_limit,
};
pub use self::http::{
    AUTH_TOKEN_CACHE_SIZE, AuthArgs, AuthSettings, JWT_LEEWAY_SECS, JWT_USER_CLAIM, PaymentArgs,
    PaymentSettings, TrustedProxies, WebhookSecrets, parse_algorithm,
};
pub use self::stores::{DbArgs, DbSettings, RedisArgs, RedisSettings, RedisTarget, ReplicaWait};
pub use self::worker::{
    CaCerts, CaError, DeliverySettings, DrainArgs, MAX_BATCH_SIZE, RETIRE_AFTER_SECS,
    RETIRE_GRACE_SECS, RetireSettings, WorkerConfig, default_consumer_name, worker_defaults,
};

#[derive(Debug, Parser)]
#[command(
    name = "flashsale",
    version = crate::domain::release::LONG,
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
    Worker(Box<WorkerArgs>),
    /// Check that every opened sale's books balance (Redis and MySQL).
    Audit(AuditArgs),
    /// Rebuild a sale in Redis from MySQL after Redis lost it.
    Recover(RecoverArgs),
    /// How a sale went: its report (the one kept at its retirement, or
    /// made now), as a summary, JSON or its timeline as CSV.
    Report(ReportArgs),
    /// Show each sale's stream: length, group lag, pending entries per
    /// consumer, dead letters (what XINFO and XPENDING show).
    Streams(StreamsArgs),
    /// List the opened sales by state: upcoming, live, ended and not yet
    /// retired (and why), retired.
    Sales(SalesArgs),
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
    #[command(flatten)]
    pub payments: PaymentArgs,
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

/// The sale a command names: as its argument, or with `--product`.
fn named<'a>(sale: &'a Option<String>, product: &'a Option<String>) -> Option<&'a str> {
    sale.as_deref().or(product.as_deref())
}

impl AuditArgs {
    pub fn product(&self) -> Option<&str> {
        named(&self.sale, &self.product)
    }
}

impl RecoverArgs {
    /// The sale (clap requires one of the two).
    pub fn product(&self) -> &str {
        named(&self.sale, &self.product).unwrap_or_default()
    }
}

impl StreamsArgs {
    pub fn product(&self) -> Option<&str> {
        named(&self.sale, &self.product)
    }
}

#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this sale (`flashsale audit <product_id>`, or `--product`).
    #[arg(value_name = "PRODUCT_ID", conflicts_with = "product")]
    pub sale: Option<String>,
    /// Only this sale.
    #[arg(long)]
    pub product: Option<String>,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// The sale.
    pub product: String,
    /// The whole report as one JSON object instead of the summary.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// The timeline as CSV, a row per second.
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// The sale (`flashsale recover <product_id>`, or `--product`).
    #[arg(
        value_name = "PRODUCT_ID",
        conflicts_with = "product",
        required_unless_present = "product"
    )]
    pub sale: Option<String>,
    #[arg(long)]
    pub product: Option<String>,
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
    #[arg(long, env = "RETIRE_AFTER_SECS", default_value_t = RETIRE_AFTER_SECS)]
    pub retire_after_secs: u64,
    /// JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Only this sale (`flashsale streams <product_id>`, or `--product`).
    #[arg(value_name = "PRODUCT_ID", conflicts_with = "product")]
    pub sale: Option<String>,
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
    /// Where payment notifications are heard (`None`: nowhere).
    pub payments: Option<PaymentSettings>,
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
        let auth: AuthSettings = a.auth.into();
        let mut limits: Limits = a.limits.into();
        if limits.client_ip_proxies.is_empty() {
            limits.client_ip_proxies = auth.trusted_proxies.clone();
        }
        Self {
            redis: (&a.redis).into(),
            db: (&a.db).into(),
            http: HttpSettings {
                listen_addr: a.listen_addr,
                admin_token: a.admin_token.filter(|t| !t.is_empty()).map(Arc::from),
                admin_routes: a.admin_routes,
                dashboard_session: Duration::from_secs(a.dashboard_session_secs),
                auth,
                connections: (&a.connections).into(),
                limits,
                memory: a.memory.into(),
                payments: a.payments.into(),
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
    // Phrases of a placeholder wherever they stand (`your-admin-token-here`);
    // none can occur in a hex secret, and in a random base64 one hardly
    // (four or more given letters in a row).
    const ANYWHERE: [&str; 7] = [
        "your",
        "here",
        "changeme",
        "change-me",
        "placeholder",
        "example",
        "xxxx",
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
    } else if distinct < 8
        || PLACEHOLDERS.iter().any(|p| lower.starts_with(p))
        || ANYWHERE.iter().any(|p| lower.contains(p))
    {
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
            "your-admin-token-here",
            "put-a-placeholder-0123456789",
            "0123456789-CHANGEME-abcdef",
        ] {
            assert!(
                weak_admin_token(Some(placeholder)).is_some_and(|w| w.contains("placeholder")),
                "{placeholder}"
            );
        }
        assert_eq!(weak_admin_token(Some("3f9a1c0b7e2d4a6f8b5c1e0d")), None);
    }
}
