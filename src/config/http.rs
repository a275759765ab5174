//! The API's settings: who buyers are, the bounds on connections, the
//! guards in front of the order path, what is answered from memory.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

use super::DAY_MS;
use crate::domain::Currency;
use crate::domain::webhook::Secret;
use crate::http::auth::{AuthSettings, TrustedProxies};
use crate::http::conn::ConnectionSettings;
use crate::http::limits::{Limits, Rate, defaults as limit_defaults};
use crate::http::payments::PaymentSettings;
use crate::sale::MemorySettings;
use crate::sale::memory::defaults as memory_defaults;

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

/// Payments from the payment side (see `http::payments`).
#[derive(Debug, Clone, Args)]
pub struct PaymentArgs {
    /// The secrets payment notifications are signed with, per Standard
    /// Webhooks (`whsec_<base64>`; comma-separated: several during a
    /// rotation). Set: `POST /api/payments/notifications` is served. Unset:
    /// it is not.
    #[arg(long, env = "PAYMENT_WEBHOOK_SECRETS", hide_env_values = true,
          value_parser = parse_webhook_secrets)]
    pub payment_webhook_secrets: Option<WebhookSecrets>,
    /// The currency sale prices are in (ISO 4217): a payment in another
    /// currency is refused (`amount_mismatch`).
    #[arg(long, env = "SALE_CURRENCY", default_value = "CNY")]
    pub sale_currency: Currency,
}

/// `PAYMENT_WEBHOOK_SECRETS`, parsed.
#[derive(Debug, Clone)]
pub struct WebhookSecrets(pub Vec<Secret>);

fn parse_webhook_secrets(s: &str) -> Result<WebhookSecrets, String> {
    match Secret::parse_list(s) {
        Ok(list) if list.is_empty() => Err("at least one `whsec_` secret".into()),
        Ok(list) => Ok(WebhookSecrets(list)),
        Err(e) => Err(e.to_string()),
    }
}

impl From<PaymentArgs> for Option<PaymentSettings> {
    fn from(a: PaymentArgs) -> Self {
        a.payment_webhook_secrets.map(|s| PaymentSettings {
            secrets: s.0,
            currency: a.sale_currency,
        })
    }
}

/// A JWT algorithm by name (`JWT_ALGORITHM`, the bench's `--jwt-algorithm`).
pub fn parse_algorithm(s: &str) -> Result<jsonwebtoken::Algorithm, String> {
    s.parse().map_err(|_| {
        format!("{s:?}: one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA")
    })
}

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
