//! The stream workers' settings: how they drain the sales' streams, push
//! the outbox to the shop (`worker::deliver`) and retire ended sales
//! (`bookkeeping::retire`). Each default is written here once.

use std::time::Duration;

use clap::Args;

use axum::http::Uri;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::bounds::DAY_MS;
use crate::domain::webhook::Secret;

/// The largest `BATCH_SIZE`: a batch is one multi-row INSERT of 9 values
/// a row, and MySQL takes at most 65,535 placeholders in one statement.
pub const MAX_BATCH_SIZE: usize = 5_000;

/// The workers' settings' defaults: the one place they are written (the
/// command line shows them, [`WorkerConfig::default`] uses them).
pub mod worker_defaults {
    pub const BATCH_SIZE: usize = 500;
    pub const BLOCK_MS: u64 = 2_000;
    pub const CLAIM_IDLE_MS: u64 = 15_000;
    pub const MAX_DELIVERIES: u64 = 5;
    pub const STREAM_RETENTION_SECS: u64 = 600;
    pub const PAYMENT_TIMEOUT_SECS: u64 = 900;
    pub const BOOKS_CHECK_MS: u64 = 5_000;
    pub const RETIRE_CHECK_MS: u64 = 10_000;
    pub const EVENT_WEBHOOK_MAX_ATTEMPTS: u32 = 12;
    /// The first retry of a failed delivery comes after 100-200 ms (the
    /// upper half of this), then the wait doubles, up to 5 minutes: a
    /// receiver's one-off failure holds the endpoint's events back only
    /// briefly (they go in order), an outage still gets minutes of
    /// retries (12 attempts: about 5 minutes) before a dead letter.
    pub const EVENT_WEBHOOK_BACKOFF_MIN_MS: u64 = 200;
    pub const EVENT_WEBHOOK_BACKOFF_MAX_MS: u64 = 300_000;
    pub const EVENT_WEBHOOK_TIMEOUT_MS: u64 = 5_000;
}

/// How the workers behave.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This process's consumer name in every sale's group; unique per process.
    pub consumer: String,
    /// Entries per `XREADGROUP` (and rows per MySQL transaction).
    pub batch_size: usize,
    /// How long a read waits for new entries.
    pub block: Duration,
    /// Entries pending longer than this are taken over from their consumer.
    pub claim_idle: Duration,
    /// Deliveries after which an entry that cannot be persisted is dead-lettered.
    pub max_deliveries: u64,
    /// Acked entries stay in the stream this long, for operators.
    pub retention: Duration,
    pub trim_every: Duration,
    /// How often the registry of open sales is read.
    pub registry_refresh: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Orders confirmed and unpaid this long are cancelled.
    pub payment_timeout: Duration,
    /// How often the sweeper passes (payment timeouts, interrupted cancels).
    pub sweep_every: Duration,
    /// How often the Redis masters behind the open sales are checked for a
    /// change (a failover, a restart) that calls for reconciliation.
    pub reconcile_every: Duration,
    /// A cancel's Redis half missing for this long counts as interrupted.
    pub release_grace: Duration,
    /// How often every open sale's books are checked (`bookkeeping::live`);
    /// zero: never.
    pub books_every: Duration,
    /// How often ended sales are looked at for retirement
    /// (`bookkeeping::retire`); zero: never.
    pub retire_every: Duration,
    pub retire: RetireSettings,
    /// Where the outbox's events are pushed, one entry per endpoint (none:
    /// nowhere; readers pull).
    pub events: Vec<DeliverySettings>,
    /// How often the deliverer passes.
    pub deliver_every: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            consumer: default_consumer_name(),
            batch_size: worker_defaults::BATCH_SIZE,
            block: Duration::from_millis(worker_defaults::BLOCK_MS),
            claim_idle: Duration::from_millis(worker_defaults::CLAIM_IDLE_MS),
            max_deliveries: worker_defaults::MAX_DELIVERIES,
            retention: Duration::from_secs(worker_defaults::STREAM_RETENTION_SECS),
            trim_every: Duration::from_secs(5),
            registry_refresh: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            payment_timeout: Duration::from_secs(worker_defaults::PAYMENT_TIMEOUT_SECS),
            sweep_every: Duration::from_secs(5),
            reconcile_every: Duration::from_secs(1),
            release_grace: Duration::from_secs(10),
            books_every: Duration::from_millis(worker_defaults::BOOKS_CHECK_MS),
            retire_every: Duration::from_millis(worker_defaults::RETIRE_CHECK_MS),
            retire: RetireSettings::default(),
            events: Vec::new(),
            deliver_every: Duration::from_millis(200),
        }
    }
}

/// `<hostname>-<pid>`: unique across hosts and across processes on one host.
pub fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "flashsale".into());
    format!("{host}-{}", std::process::id())
}

/// Where and how events are pushed.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// An `https://` endpoint (or `http://`, on a network of its own).
    pub url: Uri,
    pub secret: Secret,
    /// Attempts of one event before it is dead-lettered.
    pub max_attempts: u32,
    /// Bound on one attempt (connect, send, answer).
    pub timeout: Duration,
    /// The back-off after the first failure, doubled after each, at most
    /// `backoff_max`; each drawn at random from its upper half (jitter).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// CA certificates trusted besides the public web PKI's.
    pub ca: Option<CaCerts>,
}

/// CA certificates read from a PEM file (`EVENT_WEBHOOK_CA_FILE`).
#[derive(Clone)]
pub struct CaCerts {
    path: String,
    certs: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for CaCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} certificate(s) from {}", self.certs.len(), self.path)
    }
}

/// Why a CA file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read the certificates in {path}: {source}")]
    Pem {
        path: String,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    Empty(String),
    #[error("a certificate of {path} is not a usable CA: {source}")]
    Invalid { path: String, source: rustls::Error },
}

impl CaCerts {
    /// The certificates, as read.
    pub fn certs(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    pub fn read(path: &std::path::Path) -> Result<Self, CaError> {
        let name = path.display().to_string();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|source| CaError::Pem {
                path: name.clone(),
                source,
            })?;
        if certs.is_empty() {
            return Err(CaError::Empty(name));
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in &certs {
            roots.add(cert.clone()).map_err(|source| CaError::Invalid {
                path: name.clone(),
                source,
            })?;
        }
        Ok(Self { path: name, certs })
    }
}

/// When and how the workers retire sales.
#[derive(Debug, Clone, Copy)]
pub struct RetireSettings {
    /// A sale is retired no sooner than this after its end.
    pub after: Duration,
    /// Its Redis keys are deleted this long after it is retired.
    pub grace: Duration,
    /// Sales read from MySQL per page (ended; retired, not purged).
    pub batch: u32,
    /// The least time one sale's retirement, or purge, takes: a pass over
    /// thousands of sales leaves the cores to the order path of the sales
    /// that run (BENCHMARKS.md, "Ended sales, and retiring them").
    pub pace: Duration,
}

/// `RETIRE_AFTER_SECS` and `RETIRE_GRACE_SECS` by default.
pub const RETIRE_AFTER_SECS: u64 = 60;

pub const RETIRE_GRACE_SECS: u64 = 60;

impl Default for RetireSettings {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(RETIRE_AFTER_SECS),
            grace: Duration::from_secs(RETIRE_GRACE_SECS),
            batch: 500,
            pace: Duration::from_millis(5),
        }
    }
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
    #[arg(long, env = "BATCH_SIZE", default_value_t = worker_defaults::BATCH_SIZE,
          value_parser = batch_size)]
    pub batch_size: usize,
    /// How long a read waits for new entries (also bounds shutdown time).
    #[arg(long, env = "BLOCK_MS", default_value_t = worker_defaults::BLOCK_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub block_ms: u64,
    /// Pending entries idle this long are reclaimed from their consumer.
    #[arg(long, env = "CLAIM_IDLE_MS", default_value_t = worker_defaults::CLAIM_IDLE_MS)]
    pub claim_idle_ms: u64,
    /// An entry that cannot be persisted goes to dead letters after this many deliveries.
    #[arg(long, env = "MAX_DELIVERIES", default_value_t = worker_defaults::MAX_DELIVERIES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deliveries: u64,
    /// Acked entries stay in the stream this long before they are trimmed.
    #[arg(long, env = "STREAM_RETENTION_SECS", default_value_t = worker_defaults::STREAM_RETENTION_SECS)]
    pub stream_retention_secs: u64,
    /// Orders confirmed and not paid within this many seconds are cancelled.
    #[arg(long, env = "PAYMENT_TIMEOUT_SECS", default_value_t = worker_defaults::PAYMENT_TIMEOUT_SECS)]
    pub payment_timeout_secs: u64,
    /// Every open sale's books are checked this often (0: never); the
    /// verdict is `flashsale_sale_books_balanced`.
    #[arg(long, env = "BOOKS_CHECK_MS", default_value_t = worker_defaults::BOOKS_CHECK_MS)]
    pub books_check_ms: u64,
    /// Ended sales are looked at this often and retired once settled (0:
    /// never): final audit into MySQL, out of the registry, keys deleted.
    #[arg(long, env = "RETIRE_CHECK_MS", default_value_t = worker_defaults::RETIRE_CHECK_MS)]
    pub retire_check_ms: u64,
    /// A sale retires no sooner than this many seconds after its end.
    #[arg(long, env = "RETIRE_AFTER_SECS", default_value_t = RETIRE_AFTER_SECS)]
    pub retire_after_secs: u64,
    /// A retired sale's Redis keys are deleted this many seconds after its
    /// retirement (a last look with redis-cli).
    #[arg(long, env = "RETIRE_GRACE_SECS", default_value_t = RETIRE_GRACE_SECS)]
    pub retire_grace_secs: u64,
    /// Push every event of the outbox to these `https://` endpoints (or
    /// `http://`, on a network of its own)
    /// (comma-separated; each gets every event, in order, on its own),
    /// signed per Standard Webhooks (needs `EVENT_WEBHOOK_SECRET`). Unset:
    /// events are only pulled (`GET /api/admin/events`).
    #[arg(long, env = "EVENT_WEBHOOK_URL", value_parser = webhook_url,
          value_delimiter = ',', requires = "event_webhook_secret")]
    pub event_webhook_url: Vec<axum::http::Uri>,
    /// A PEM file of CA certificates trusted for `https://` endpoints
    /// besides the public web PKI's (a shop's private CA).
    #[arg(long, env = "EVENT_WEBHOOK_CA_FILE", value_parser = ca_file,
          requires = "event_webhook_url")]
    pub event_webhook_ca_file: Option<CaCerts>,
    /// The `whsec_` secret events are signed with (the receiver holds it too).
    #[arg(long, env = "EVENT_WEBHOOK_SECRET", hide_env_values = true,
          value_parser = webhook_secret, requires = "event_webhook_url")]
    pub event_webhook_secret: Option<Secret>,
    /// Attempts of one event before it goes to the dead letters (1-100).
    #[arg(long, env = "EVENT_WEBHOOK_MAX_ATTEMPTS",
          default_value_t = worker_defaults::EVENT_WEBHOOK_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub event_webhook_max_attempts: u32,
    /// Bound on one delivery attempt (connect, send, answer).
    #[arg(long, env = "EVENT_WEBHOOK_TIMEOUT_MS",
          default_value_t = worker_defaults::EVENT_WEBHOOK_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub event_webhook_timeout_ms: u64,
}

/// `EVENT_WEBHOOK_URL`: an absolute `https://` (or `http://`) URL.
fn webhook_url(s: &str) -> Result<axum::http::Uri, String> {
    let uri: axum::http::Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("https" | "http"), Some(_)) => Ok(uri),
        _ => Err("an absolute https:// or http:// URL".into()),
    }
}

/// `EVENT_WEBHOOK_CA_FILE`: at least one PEM certificate, read at start.
fn ca_file(path: &str) -> Result<CaCerts, String> {
    CaCerts::read(std::path::Path::new(path)).map_err(|e| e.to_string())
}

/// `EVENT_WEBHOOK_SECRET`: one `whsec_` secret.
fn webhook_secret(s: &str) -> Result<Secret, String> {
    Secret::parse(s).map_err(|e| e.to_string())
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
            retire: RetireSettings {
                after: Duration::from_secs(a.retire_after_secs),
                grace: Duration::from_secs(a.retire_grace_secs),
                ..default.retire
            },
            events: match a.event_webhook_secret {
                // One deliverer per endpoint: a URL given twice is one
                // endpoint (two would share its lease as one owner).
                Some(secret) => a
                    .event_webhook_url
                    .into_iter()
                    .fold(Vec::new(), |mut urls, url| {
                        if !urls.contains(&url) {
                            urls.push(url);
                        }
                        urls
                    })
                    .into_iter()
                    .map(|url| DeliverySettings {
                        url,
                        secret: secret.clone(),
                        max_attempts: a.event_webhook_max_attempts,
                        timeout: Duration::from_millis(a.event_webhook_timeout_ms),
                        backoff_min: Duration::from_millis(
                            worker_defaults::EVENT_WEBHOOK_BACKOFF_MIN_MS,
                        ),
                        backoff_max: Duration::from_millis(
                            worker_defaults::EVENT_WEBHOOK_BACKOFF_MAX_MS,
                        ),
                        ca: a.event_webhook_ca_file.clone(),
                    })
                    .collect(),
                None => Vec::new(),
            },
            ..default
        }
    }
}

/// `BATCH_SIZE`: 1 to `MAX_BATCH_SIZE` (refused otherwise, not clamped).
fn batch_size(s: &str) -> Result<usize, String> {
    let max = MAX_BATCH_SIZE;
    s.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("must be a whole number from 1 to {max}"))
}
