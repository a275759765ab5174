//! The shop's end of the events' push: an HTTP server in the test process,
//! up for the whole run (it never fails over, only the senders do), that
//! the workers POST every event of the outbox to. It checks each Standard
//! Webhooks signature with its own HMAC code (not the crate's), records
//! every message by `webhook-id`, and answers 500 to a seeded share of the
//! requests, so deliveries are retried, across the faults, under the same
//! id.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::procs::free_port;
use crate::rng::Rng;

/// The secret the workers sign events with (`EVENT_WEBHOOK_SECRET`).
pub const EVENT_SECRET: &str = "whsec_Y2hhb3MtZXZlbnRzLXJlY2VpdmVyLXNlY3JldC0wMQ==";
/// The Standard Webhooks tolerance on `webhook-timestamp`.
const TOLERANCE_SECS: i64 = 300;

/// What the receiver saw.
#[derive(Debug, Default, Clone)]
pub struct Received {
    /// Acknowledged (answered 2xx) deliveries in arrival order: (webhook-id, body).
    pub acked: Vec<(String, String)>,
    /// The first body each verified `webhook-id` came with (acknowledged or not).
    pub bodies: BTreeMap<String, String>,
    /// A `webhook-id` that came again with another body: (id, first, later).
    pub changed: Vec<(String, String, String)>,
    /// Requests whose signature did not verify (answered 401).
    pub forged: Vec<String>,
    /// Requests answered 500 on purpose.
    pub failed: u64,
}

pub struct Receiver {
    key: Vec<u8>,
    /// Percent of the verified requests answered 500.
    fail_percent: u64,
    rng: Mutex<Rng>,
    log: Mutex<Received>,
    pub url: String,
}

impl Receiver {
    /// Binds a free loopback port and serves `POST /events` on the test's
    /// runtime until the test ends.
    pub async fn start(rng: Rng, fail_percent: u64) -> Arc<Self> {
        let port = free_port();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the receiver binds its port");
        let key = STANDARD
            .decode(EVENT_SECRET.trim_start_matches("whsec_"))
            .expect("the receiver's secret is base64");
        let receiver = Arc::new(Self {
            key,
            fail_percent,
            rng: Mutex::new(rng),
            log: Mutex::default(),
            url: format!("http://127.0.0.1:{port}/events"),
        });
        let app = Router::new()
            .route("/events", post(hook))
            .with_state(receiver.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the receiver serves until the test ends")
        });
        receiver
    }

    pub fn received(&self) -> MutexGuard<'_, Received> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ok(webhook-id) when the Standard Webhooks signature verifies: one of
    /// the space-separated `v1,<base64>` is HMAC-SHA256(key,
    /// "<id>.<timestamp>.<body>"), the timestamp within 5 minutes of now.
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, String> {
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(format!("no {name}"))
        };
        let (id, ts, sigs) = (
            get("webhook-id")?,
            get("webhook-timestamp")?,
            get("webhook-signature")?,
        );
        let ts: i64 = ts.parse().map_err(|_| format!("timestamp {ts:?}"))?;
        let now = flashsale::domain::now_ms() / 1000;
        if (now - ts).abs() > TOLERANCE_SECS {
            return Err(format!("{id}: timestamp {ts} is {}s from now", now - ts));
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(format!("{id}.{ts}.").as_bytes());
        mac.update(body);
        let expected = STANDARD.encode(mac.finalize().into_bytes());
        let signed = sigs
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .any(|s| s == expected);
        match signed {
            true => Ok(id.to_owned()),
            false => Err(format!("{id}: no signature matches ({sigs})")),
        }
    }
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let id = match r.verify(&headers, &body) {
        Ok(id) => id,
        Err(why) => {
            r.received().forged.push(why);
            return StatusCode::UNAUTHORIZED;
        }
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let fail = {
        let mut rng = r.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.chance(r.fail_percent)
    };
    let mut log = r.received();
    match log.bodies.get(&id) {
        Some(first) if *first != text => {
            let first = first.clone();
            log.changed.push((id.clone(), first, text.clone()));
        }
        Some(_) => {}
        None => {
            log.bodies.insert(id.clone(), text.clone());
        }
    }
    if fail {
        log.failed += 1;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    log.acked.push((id, text));
    StatusCode::NO_CONTENT
}
