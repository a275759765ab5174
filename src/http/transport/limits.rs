//! Under a spike: every guard the HTTP layer puts in front
//! of Redis, cheapest first.
//!
//! - On every request ([`guarded`]; the router's routes through
//!   [`guard_request`]): header limits (431) and an upper bound on handling
//!   time (503 `unavailable`), so no request hangs whatever a dependency does.
//! - On `POST /api/orders` ([`admit_order`]): the client address's token
//!   bucket (429 `rate_limited`), then a permit among `max_in_flight` orders
//!   being decided. No free permit means 503 `overloaded` at once: the
//!   service sheds the excess (nothing waits), so latency and memory stay flat
//!   at any multiple of its capacity.
//! - In the order handler, once the buyer is known: the user's token
//!   bucket ([`Guards::check_user`]).
//! - On the routes that take an order or user id ([`guard_lookup`]): the
//!   client address's lookup bucket (429), so ids cannot be tried by the
//!   thousand. Joining a waiting room is one of them.
//! - On the waiting room's polls ([`Guards::check_poll`]): the client
//!   address's poll bucket (429): polls cost no Redis call, but a client
//!   still cannot send them without bound.
//!
//! Token buckets are governor's keyed GCRA limiters (one atomic word per
//! key). Their memory is bounded: a sweeper drops the keys whose bucket has
//! refilled (idle clients), and past `max_keys` live keys a new client is
//! refused (429) until the sweep makes room, rather than growing the map.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use ipnet::IpNet;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::Instrument;

use crate::config::{Limits, RateLimit};
use crate::domain::UserId;
use crate::http::error::ApiError;

/// A keyed token bucket with bounded memory.
struct Buckets<K: std::hash::Hash + Eq + Clone> {
    limiter: DefaultKeyedRateLimiter<K>,
    max_keys: usize,
    /// Last sweep, in ms since `started` (sweeps are rate-limited too).
    last_sweep_ms: AtomicU64,
    started: Instant,
    /// An upper bound on the table's size without counting it (counting
    /// locks every shard): its size when last counted, plus the checks since,
    /// each of which adds at most one key.
    counted: AtomicUsize,
    checks_since: AtomicUsize,
}

impl<K: std::hash::Hash + Eq + Clone> Buckets<K> {
    fn new(rate: RateLimit, max_keys: usize) -> Self {
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(quota(rate)),
            max_keys: max_keys.max(1),
            last_sweep_ms: AtomicU64::new(0),
            started: Instant::now(),
            counted: AtomicUsize::new(0),
            checks_since: AtomicUsize::new(0),
        }
    }

    /// Takes a token for `key`, or says how long until one is free.
    fn check(&self, key: &K) -> Result<(), Duration> {
        let since = self.checks_since.fetch_add(1, Ordering::Relaxed);
        if self.counted.load(Ordering::Relaxed) + since >= self.max_keys
            && self.recount() >= self.max_keys
        {
            self.sweep();
            if self.recount() >= self.max_keys {
                tracing::warn!(
                    keys = self.max_keys,
                    "rate-limit table full: refusing new clients until idle ones expire"
                );
                return Err(Duration::from_secs(1));
            }
        }
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Counts the table (and restarts the bound from there).
    fn recount(&self) -> usize {
        self.checks_since.store(0, Ordering::Relaxed);
        let n = self.limiter.len();
        self.counted.store(n, Ordering::Relaxed);
        n
    }

    /// Drops idle keys, at most once a second.
    fn sweep(&self) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) >= 1000
            && self
                .last_sweep_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.sweep_now();
        }
    }

    /// Drops the keys whose bucket is full again (idle clients).
    fn sweep_now(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        self.recount();
    }

    fn len(&self) -> usize {
        self.limiter.len()
    }
}

/// The guards' state, shared by all requests.
pub struct Guards {
    limits: Limits,
    in_flight: Option<Semaphore>,
    users: Option<Buckets<u64>>,
    ips: Option<Buckets<IpAddr>>,
    lookups: Option<Buckets<IpAddr>>,
    polls: Option<Buckets<IpAddr>>,
}

impl Guards {
    pub fn new(limits: Limits) -> Self {
        Self {
            in_flight: (limits.max_in_flight > 0).then(|| Semaphore::new(limits.max_in_flight)),
            users: limits.user_rate.map(|r| Buckets::new(r, limits.max_keys)),
            ips: limits.ip_rate.map(|r| Buckets::new(r, limits.max_keys)),
            lookups: limits.lookup_rate.map(|r| Buckets::new(r, limits.max_keys)),
            polls: limits.poll_rate.map(|r| Buckets::new(r, limits.max_keys)),
            limits,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes a token from `user_id`'s bucket: 429 when it is empty.
    pub fn check_user(&self, user_id: UserId) -> Result<(), ApiError> {
        match &self.users {
            Some(b) => b.check(&user_id.get()).map_err(rate_limited),
            None => Ok(()),
        }
    }

    /// Live keys in the user and address tables (for tests and metrics).
    pub fn tracked_keys(&self) -> (usize, usize) {
        (
            self.users.as_ref().map_or(0, Buckets::len),
            self.ips.as_ref().map_or(0, Buckets::len),
        )
    }

    /// Orders holding a permit now (0 when shedding is off).
    pub fn in_flight(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |s| {
            self.limits
                .max_in_flight
                .saturating_sub(s.available_permits())
        })
    }

    /// Drops idle keys from both tables now (the background sweep's work).
    pub fn sweep(&self) {
        self.users.iter().for_each(Buckets::sweep_now);
        self.ips.iter().for_each(Buckets::sweep_now);
        self.lookups.iter().for_each(Buckets::sweep_now);
        self.polls.iter().for_each(Buckets::sweep_now);
    }

    /// Takes a token from the client address's poll bucket: 429 when empty.
    pub fn check_poll(
        &self,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<(), ApiError> {
        match (&self.polls, self.client_ip(headers, peer)) {
            (Some(polls), Some(ip)) => polls.check(&ip).map_err(rate_limited),
            _ => Ok(()),
        }
    }

    /// The client's address: the peer's, unless the peer is a trusted
    /// proxy (see [`client_ip`]).
    pub(crate) fn client_ip(
        &self,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Option<IpAddr> {
        let peer = peer?.ip();
        Some(match &self.limits.client_ip_header {
            Some(name) => client_ip(headers, name, peer, &self.limits.client_ip_proxies),
            None => peer,
        })
    }
}

/// Behind trusted proxies, the client's address: from a peer that is one
/// of `proxies`, the rightmost entry of header `name` that is not one of
/// them (each proxy appends the address it heard from; entries left of the
/// first untrusted one are the client's to write, and not believed); the
/// peer itself when it is not trusted, or when that entry is not an
/// address. Every proxy on the way: the leftmost entry.
fn client_ip(headers: &HeaderMap, name: &HeaderName, peer: IpAddr, proxies: &[IpNet]) -> IpAddr {
    let trusted = |ip: &IpAddr| proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return peer;
    }
    let entries = headers
        .get_all(name)
        .iter()
        .rev()
        .flat_map(|v| v.to_str().unwrap_or("").rsplit(','));
    let mut last = peer;
    for entry in entries {
        match entry.trim().parse::<IpAddr>() {
            Ok(ip) if trusted(&ip) => last = ip,
            Ok(ip) => return ip,
            Err(_) => return peer,
        }
    }
    last
}

fn rate_limited(wait: Duration) -> ApiError {
    // Retry-After is in whole seconds; round up so a retry then succeeds.
    let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
    ApiError::RateLimited {
        retry_after_secs: secs,
    }
}

/// Every request: its body read in full (so that any early answer keeps the
/// connection, see [`crate::http::transport::body`]), header limits, then `handle` within the
/// handling-time bound (and, at debug level, the request's span and log
/// line). One deadline bounds it all.
pub(crate) async fn guarded<B, Handled>(
    guards: &Guards,
    req: Request<B>,
    handle: impl FnOnce(Parts, Bytes) -> Handled,
) -> Response
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
    Handled: Future<Output = Response>,
{
    let limits = &guards.limits;
    let deadline = tokio::time::Instant::now() + limits.request_timeout;
    let (parts, body) =
        match super::body::read_whole(req, super::body::MAX_BODY_BYTES, deadline).await {
            Ok(read) => read,
            Err(refused) => return refused,
        };
    if let Err(refused) = check_headers(&parts.headers, limits) {
        return refused.into_response();
    }
    // Disabled (and free) unless the debug level is on. The handling is
    // awaited at one place, never passed to another async fn: a future
    // passed as an argument is laid out twice in the callee's.
    let span = super::logs::request_span(&parts);
    let started = (!span.is_disabled()).then(Instant::now);
    let handled = tokio::time::timeout_at(deadline, handle(parts, body))
        .instrument(span.clone())
        .await;
    let response = match handled {
        Ok(response) => response,
        Err(_) => ApiError::Unavailable("request not handled within REQUEST_TIMEOUT_MS".into())
            .into_response(),
    };
    super::logs::handled(&span, &response, started);
    super::logs::failure(&response);
    response
}

/// [`guarded`] as the router's middleware, for every route but the order
/// path (which `serve` hands to [`crate::http::buyers::orders::place::endpoint`] directly).
pub async fn guard_request(
    State(guards): State<Arc<Guards>>,
    req: Request,
    next: Next,
) -> Response {
    guarded(&guards, req, |parts, body| {
        next.run(Request::from_parts(parts, Body::from(body)))
    })
    .await
}

/// 431 beyond the header limits.
fn check_headers(headers: &HeaderMap, limits: &Limits) -> Result<(), ApiError> {
    if headers.len() > limits.max_headers {
        return Err(ApiError::HeadersTooLarge(format!(
            "at most {} request headers are accepted",
            limits.max_headers
        )));
    }
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > limits.max_header_bytes {
        return Err(ApiError::HeadersTooLarge(format!(
            "request headers may total at most {} bytes",
            limits.max_header_bytes
        )));
    }
    Ok(())
}

/// `POST /api/orders`: the address's bucket (429 `rate_limited`), then a
/// permit among `max_in_flight` (503 `overloaded`), to hold while the order
/// is decided (`None`: shedding is off).
pub(crate) fn admit_order<'g>(
    guards: &'g Guards,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Option<SemaphorePermit<'g>>, ApiError> {
    // The address is only looked up when its limit is on.
    if let Some(ips) = &guards.ips
        && let Some(ip) = guards.client_ip(headers, peer)
        && let Err(wait) = ips.check(&ip)
    {
        return Err(rate_limited(wait));
    }
    match guards.in_flight.as_ref().map(Semaphore::try_acquire) {
        None => Ok(None),
        Some(Ok(permit)) => Ok(Some(permit)),
        Some(Err(_)) => Err(ApiError::Overloaded),
    }
}

/// Routes that take an order or user id: the address's lookup bucket.
pub async fn guard_lookup(State(guards): State<Arc<Guards>>, req: Request, next: Next) -> Response {
    if let Some(lookups) = &guards.lookups
        && let Some(ip) =
            guards.client_ip(req.headers(), crate::http::extract::peer(req.extensions()))
        && let Err(wait) = lookups.check(&ip)
    {
        return rate_limited(wait).into_response();
    }
    next.run(req).await
}

/// Sweeps idle rate-limit keys every `every` until the token is cancelled.
pub async fn sweep_buckets(
    guards: Arc<Guards>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => guards.sweep(),
        }
    }
}

/// A rate as governor's quota.
fn quota(rate: RateLimit) -> Quota {
    Quota::per_second(rate.per_second).allow_burst(rate.burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn from(peer: &str, forwarded: &[&str]) -> IpAddr {
        let name = HeaderName::from_static("x-forwarded-for");
        let mut headers = HeaderMap::new();
        for v in forwarded {
            headers.append(&name, v.parse().unwrap());
        }
        let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        client_ip(&headers, &name, ip(peer), &proxies)
    }

    #[test]
    fn the_header_is_believed_only_from_a_trusted_proxy() {
        // A client reaching the service directly picks nothing.
        assert_eq!(from("203.0.113.5", &["198.51.100.1"]), ip("203.0.113.5"));
        // Through the proxy: the address it heard from.
        assert_eq!(from("10.0.0.2", &["198.51.100.1"]), ip("198.51.100.1"));
    }

    #[test]
    fn what_the_client_wrote_left_of_the_proxies_is_not_believed() {
        // The client sent "X-Forwarded-For: 1.1.1.1"; the proxy appended
        // the client's address; a second proxy appended the first's.
        assert_eq!(
            from("10.0.0.2", &["1.1.1.1, 198.51.100.1, 10.0.0.3"]),
            ip("198.51.100.1")
        );
        // The same, one header line per proxy.
        assert_eq!(
            from("10.0.0.2", &["1.1.1.1", "198.51.100.1", "10.0.0.3"]),
            ip("198.51.100.1")
        );
        // An entry that is no address: the proxy's own.
        assert_eq!(from("10.0.0.2", &["1.1.1.1, junk"]), ip("10.0.0.2"));
        // Nothing but proxies: the leftmost; no header: the proxy.
        assert_eq!(from("10.0.0.2", &["10.0.0.9, 10.0.0.3"]), ip("10.0.0.9"));
        assert_eq!(from("10.0.0.2", &[]), ip("10.0.0.2"));
    }
}
