//! What the integration tests share, by what it helps:
//!
//! - `app`: a real `flashsale serve` on port 0 (`spawn_app()` and its
//!   variants), its settings as its command line makes them, instances and
//!   workers beside it, and `TestApp`'s teardown;
//! - `requests`: `TestApp`'s calls of the HTTP API (as buyers and operators do);
//! - `stores`: Redis and MySQL read directly (the test cluster, the sale's
//!   keys, `tb_order`), and the library's handles over them (the books);
//! - `signed`: signed messages (buyers' JWTs, Standard Webhooks payment
//!   notifications);
//! - here: the constants, `unique` names, `eventually`, a product's body and
//!   an answer's status and error code.
//!
//! Everything is re-exported here: tests write `crate::helpers::X`.

mod app;
mod requests;
mod signed;
mod stores;

pub use app::*;
pub use requests::*;
pub use signed::*;
pub use stores::*;

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

pub fn unique(tag: &str) -> String {
    // The tail of a UUIDv7 is random (its head is the clock, shared by parallel tests).
    format!("{tag}{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

pub fn now_ms() -> i64 {
    flashsale::domain::now_ms()
}

/// The time from now until `at_ms` (a Unix time in ms; zero once past).
pub fn until(at_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(at_ms - now_ms()).unwrap_or(0))
}

/// How often the waits below ask again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it gives a value, for `limit` at most (then `None`).
pub async fn poll_for<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `check` until it gives a value; panics with `what` after `limit`.
pub async fn eventually_some<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_for(limit, check).await {
        Some(value) => value,
        None => panic!("gave up waiting: {what}"),
    }
}

/// The pace of a polling loop that keeps state of its own across rounds
/// (where `eventually`'s closure cannot hold it): each [`Polling::next`]
/// waits [`POLL`] (not before the first round) and panics with `what` once
/// `limit` has passed.
pub struct Polling {
    what: String,
    deadline: tokio::time::Instant,
    first: bool,
}

impl Polling {
    pub fn at_most(what: impl Into<String>, limit: Duration) -> Self {
        Self {
            what: what.into(),
            deadline: tokio::time::Instant::now() + limit,
            first: true,
        }
    }

    /// Before the next round.
    pub async fn next(&mut self) {
        if !std::mem::take(&mut self.first) {
            tokio::time::sleep(POLL).await;
        }
        assert!(
            tokio::time::Instant::now() < self.deadline,
            "gave up waiting: {}",
            self.what
        );
    }
}

/// Polls `check` until it holds; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(what, limit, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// A product body with an open window around now; override fields with `extra`.
/// A crowd task's own generator (xorshift), seeded by `seed`: `next(n)`
/// draws from `0..n`.
pub fn draws(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (seed + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// What a buyer of a sale with stock may hear: an order accepted, or
/// refused for want of units or allowance.
pub fn a_buyers_answer(status: StatusCode, code: &str) -> bool {
    matches!(
        (status, code),
        (StatusCode::ACCEPTED, _)
            | (
                StatusCode::CONFLICT,
                "sold_out" | "insufficient_stock" | "limit_exceeded"
            )
    )
}

pub fn product_body(product_id: &str, stock: u64, limit: u64) -> Value {
    let now = now_ms();
    json!({
        "product_id": product_id,
        "title": "Phone",
        "price": "4999.00",
        "available_qty": stock,
        "start_time": now - 3_600_000,
        "end_time": now + 3_600_000,
        "limit_per_user": limit,
    })
}

/// Asserts a refusal: its status and the `error` code of its body.
pub async fn assert_refused(resp: Response, status: StatusCode, code: &str) {
    let (got, got_code) = status_code(resp).await;
    assert_eq!((got, got_code.as_str()), (status, code));
}

/// Asserts an answer read (its status and JSON body) is a refusal: its
/// status and the body's `error` code.
pub fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(
        (status, body["error"].as_str()),
        (want, Some(code)),
        "{body}"
    );
}

/// Status and `error` code of an answer, consuming it.
pub async fn status_code(resp: Response) -> (StatusCode, String) {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (status, body["error"].as_str().unwrap_or("").to_owned())
}

/// Serves `app` on a loopback port of its own until the test ends.
pub async fn serve_on_loopback(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}
