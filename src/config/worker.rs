//! How the stream workers drain the sales' streams.

use std::time::Duration;

use clap::Args;

use super::DAY_MS;
use crate::domain::webhook::Secret;
use crate::worker::WorkerConfig;
use crate::worker::deliver::{CaCerts, DeliverySettings};

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
    /// Push every event of the outbox to these `http://` endpoints
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
          default_value_t = crate::worker::defaults::EVENT_WEBHOOK_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub event_webhook_max_attempts: u32,
    /// Bound on one delivery attempt (connect, send, answer).
    #[arg(long, env = "EVENT_WEBHOOK_TIMEOUT_MS",
          default_value_t = crate::worker::defaults::EVENT_WEBHOOK_TIMEOUT_MS,
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
            retire: crate::books::retire::RetireSettings {
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
                            crate::worker::defaults::EVENT_WEBHOOK_BACKOFF_MIN_MS,
                        ),
                        backoff_max: Duration::from_millis(
                            crate::worker::defaults::EVENT_WEBHOOK_BACKOFF_MAX_MS,
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
    let max = crate::worker::MAX_BATCH_SIZE;
    s.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("must be a whole number from 1 to {max}"))
}
