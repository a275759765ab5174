//! The guards in front of the order path and around it: the bounds on
//! client connections (see `http::transport::conn`), the limits and rate limits on
//! requests (`http::transport::limits`), and the orders answered from memory without
//! Redis (`sale::memory`). Each setting's default is written here once:
//! the command line shows it, the type's `Default` uses it.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::HeaderName;
use clap::{Args, Parser};
use ipnet::IpNet;

use super::bounds::DAY_MS;
use super::http::TrustedProxies;

// ---- connections

/// Descriptors kept for everything but client connections (Redis, MySQL,
/// the listener, files) when the cap is derived from the open-file limit.
const RESERVED_FDS: usize = 256;

/// The least derived cap, whatever the open-file limit.
const MIN_DERIVED: usize = 64;

/// `HEADER_READ_TIMEOUT_MS` and `IDLE_TIMEOUT_MS` by default.
pub const HEADER_READ_TIMEOUT_MS: u64 = 5_000;

pub const IDLE_TIMEOUT_MS: u64 = 75_000;

/// The connection bounds (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Open connections at most (at it, the longest-waiting one gives way).
    pub max_open: usize,
    /// Open connections from one client address at most (0: no such cap).
    pub max_per_address: usize,
}

impl ConnectionSettings {
    /// The process's open-file limit less a reserve: the default of
    /// `MAX_CONNECTIONS`.
    pub fn derived_max_open() -> usize {
        open_file_limit()
            .saturating_sub(RESERVED_FDS)
            .max(MIN_DERIVED)
    }
}

/// The process's soft limit on open files (`RLIMIT_NOFILE`).
pub fn open_file_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return 1024;
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

/// Raises the soft open-file limit to the hard one (as Go's runtime does at
/// start): the service's connections are bounded by its own cap, derived
/// from this limit. Returns the limit now in force.
pub fn raise_open_file_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0
            && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
    open_file_limit()
}

/// The bounds on client connections (see `http::transport::conn`).
#[derive(Debug, Clone, Args)]
pub struct ConnectionArgs {
    /// A request head must arrive whole within this long of the
    /// connection's accept, or of its first byte after an answer.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = HEADER_READ_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection waits this long for its next request (and
    /// an answer this long for a client that stopped reading). Behind a
    /// load balancer, keep it above the balancer's own idle timeout.
    #[arg(long, env = "IDLE_TIMEOUT_MS", default_value_t = IDLE_TIMEOUT_MS,
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

// ---- requests

/// A token bucket: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

impl RateLimit {
    /// `None` when `per_second` is 0 (the limit is off).
    pub fn new(per_second: u32, burst: u32) -> Option<Self> {
        let per_second = NonZeroU32::new(per_second)?;
        Some(Self {
            per_second,
            burst: NonZeroU32::new(burst).unwrap_or(per_second),
        })
    }
}

/// The guards' settings.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Orders decided at once; 0: unbounded (no shedding).
    pub max_in_flight: usize,
    /// Upper bound on handling any request.
    pub request_timeout: Duration,
    /// Per-user bucket on `POST /api/orders` (`None`: off).
    pub user_rate: Option<RateLimit>,
    /// Per-client-address bucket on `POST /api/orders` (`None`: off).
    pub ip_rate: Option<RateLimit>,
    /// Per-client-address bucket on lookups, pay and cancel (`None`: off).
    pub lookup_rate: Option<RateLimit>,
    /// Per-client-address bucket on the waiting room's polls (`None`: off).
    pub poll_rate: Option<RateLimit>,
    /// Live keys each bucket map may hold.
    pub max_keys: usize,
    /// Take the client address from this header (the rightmost entry that
    /// is not one of `client_ip_proxies`) instead of the TCP peer, when the
    /// peer is one of `client_ip_proxies`.
    pub client_ip_header: Option<HeaderName>,
    /// The proxies whose `client_ip_header` is believed (required with it).
    pub client_ip_proxies: Vec<IpNet>,
    /// Most request headers, and most bytes of them all.
    pub max_headers: usize,
    pub max_header_bytes: usize,
}

/// Orders in flight beyond which orders are shed: chosen by `flashsale-bench
/// guards` for a low p99 with most of the peak throughput (BENCHMARKS.md,
/// "The guards, and 20× overload").
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// The limits' defaults: the one place they are written (the command line
/// shows them, [`Limits::default`] uses them). Rates are (per second, burst).
pub mod limit_defaults {
    pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
    pub const USER_RATE: (u32, u32) = (5, 10);
    pub const IP_RATE: (u32, u32) = (200, 400);
    pub const LOOKUP_RATE: (u32, u32) = (50, 100);
    pub const POLL_RATE: (u32, u32) = (100, 200);
    pub const MAX_KEYS: usize = 200_000;
}

impl Default for Limits {
    fn default() -> Self {
        let rate = |(per_second, burst)| RateLimit::new(per_second, burst);
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            request_timeout: Duration::from_millis(limit_defaults::REQUEST_TIMEOUT_MS),
            user_rate: rate(limit_defaults::USER_RATE),
            ip_rate: rate(limit_defaults::IP_RATE),
            lookup_rate: rate(limit_defaults::LOOKUP_RATE),
            poll_rate: rate(limit_defaults::POLL_RATE),
            max_keys: limit_defaults::MAX_KEYS,
            client_ip_header: None,
            client_ip_proxies: Vec::new(),
            max_headers: 64,
            max_header_bytes: 8 * 1024,
        }
    }
}

impl Limits {
    /// No rate limits and no shedding (timeouts and header limits stay):
    /// for benchmarks of the bare path and tests of other things.
    pub fn unlimited() -> Self {
        Self {
            max_in_flight: 0,
            user_rate: None,
            ip_rate: None,
            lookup_rate: None,
            poll_rate: None,
            ..Self::default()
        }
    }
}

/// The guards in front of the order path (see `http::transport::limits`).
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Orders decided at once; beyond it `POST /api/orders` answers 503
    /// `overloaded` at once: nothing waits (0: unbounded).
    #[arg(long, env = "MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
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
    /// Behind a proxy: read the client address from this header (e.g.
    /// `X-Forwarded-For`) on requests from CLIENT_IP_TRUSTED_PROXIES.
    #[arg(long, env = "CLIENT_IP_HEADER")]
    pub client_ip_header: Option<axum::http::HeaderName>,
    /// The proxies whose CLIENT_IP_HEADER is believed: comma-separated
    /// addresses or ranges (default: AUTH_TRUSTED_PROXIES).
    #[arg(long, env = "CLIENT_IP_TRUSTED_PROXIES")]
    pub client_ip_trusted_proxies: Option<TrustedProxies>,
}

impl From<LimitArgs> for Limits {
    fn from(a: LimitArgs) -> Self {
        let rate = |on: bool, per_sec, burst| {
            if on {
                RateLimit::new(per_sec, burst)
            } else {
                None
            }
        };
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
            client_ip_proxies: a.client_ip_trusted_proxies.unwrap_or_default().0,
            ..Limits::default()
        }
    }
}

// ---- answers from memory

/// What is answered from memory, and for how long.
#[derive(Debug, Clone)]
pub struct MemorySettings {
    /// How long a `sold_out` is trusted (zero: never).
    pub sold_out_ttl: Duration,
    /// How long a buyer's allowance is trusted (zero: never).
    pub limit_ttl: Duration,
    /// Buyers remembered per sale.
    pub limit_entries: usize,
    /// How long a read of the registry is trusted to say which sales
    /// exist (zero: unknown ids go to Redis).
    pub unknown_ttl: Duration,
    /// How far outside a sale's window Redis's time must certainly be for
    /// `sale_not_started` / `sale_ended` to be answered here (`None`: never).
    pub window_margin: Option<Duration>,
    /// For tests: this process's clock is off by this much (ms).
    pub clock_skew_ms: i64,
}

/// The memory's defaults: the one place they are written (the command
/// line shows them, [`MemorySettings::default`] uses them).
pub mod memory_defaults {
    pub const SOLD_OUT_CACHE_MS: u64 = 1_000;
    pub const LIMIT_CACHE_MS: u64 = 2_000;
    pub const LIMIT_CACHE_ENTRIES: usize = 100_000;
    pub const UNKNOWN_PRODUCT_CACHE_MS: u64 = 1_000;
    pub const WINDOW_MARGIN_MS: u64 = 50;
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            sold_out_ttl: Duration::from_millis(memory_defaults::SOLD_OUT_CACHE_MS),
            limit_ttl: Duration::from_millis(memory_defaults::LIMIT_CACHE_MS),
            limit_entries: memory_defaults::LIMIT_CACHE_ENTRIES,
            unknown_ttl: Duration::from_millis(memory_defaults::UNKNOWN_PRODUCT_CACHE_MS),
            window_margin: Some(Duration::from_millis(memory_defaults::WINDOW_MARGIN_MS)),
            clock_skew_ms: 0,
        }
    }
}

impl MemorySettings {
    /// Every order goes to Redis.
    pub fn off() -> Self {
        Self {
            sold_out_ttl: Duration::ZERO,
            limit_ttl: Duration::ZERO,
            limit_entries: 0,
            unknown_ttl: Duration::ZERO,
            window_margin: None,
            clock_skew_ms: 0,
        }
    }
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
