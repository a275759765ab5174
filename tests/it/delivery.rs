//! The outbox pushed to the shop: a real receiver (an HTTP server this test
//! starts) verifies each Standard Webhooks signature with its own code,
//! and fails, times out and answers slowly at random. Every event arrives,
//! in order, none lost; a duplicate only ever repeats a `webhook-id`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use flashsale::config::Limits;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::*;

/// How long the service waits for an endpoint's answer (EVENT_WEBHOOK_TIMEOUT_MS).
const SENDER_TIMEOUT: Duration = Duration::from_millis(300);

const SECRET: &str = "whsec_ZGVsaXZlcnktc2VjcmV0LW9mLXRoZS10ZXN0cy0w";

/// How the receiver answers.
const FLAKY: u8 = 0;
const DOWN: u8 = 1;
const UP: u8 = 2;

#[derive(Default)]
struct Receiver {
    mode: AtomicU8,
    /// Acknowledged deliveries (answered 2xx), in arrival order: (webhook-id, body).
    acked: Mutex<Vec<(String, String)>>,
    /// Requests whose signature did not verify.
    forged: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    seq: AtomicU64,
}

impl Receiver {
    /// The ids of the deliveries acknowledged, in order, a repeat in a row once.
    fn acked_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .acked
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        ids.dedup();
        ids
    }
}

/// The receiver's own check of a Standard Webhooks signature.
fn verifies(headers: &HeaderMap, body: &[u8]) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return false;
    };
    let Ok(ts) = ts.parse::<i64>() else {
        return false;
    };
    if (now_ms() / 1000 - ts).abs() > 300 {
        return false;
    }
    let key = STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    sigs.split(' ').any(|s| s == expected)
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> AxumStatus {
    let now = r.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    r.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let answer = async {
        if !verifies(&headers, &body) {
            r.forged.fetch_add(1, Ordering::SeqCst);
            return AxumStatus::UNAUTHORIZED;
        }
        // A cheap, repeatable draw per request.
        let n = r.seq.fetch_add(1, Ordering::SeqCst);
        let draw = (n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 33)
            % 10;
        match r.mode.load(Ordering::SeqCst) {
            DOWN => return AxumStatus::SERVICE_UNAVAILABLE,
            UP => {}
            _ => match draw {
                0 | 1 => return AxumStatus::INTERNAL_SERVER_ERROR,
                // Answers after the sender gave up (so no longer counted
                // in flight): taken, yet retried.
                2 => {
                    r.in_flight.fetch_sub(1, Ordering::SeqCst);
                    tokio::time::sleep(SENDER_TIMEOUT * 5 / 3).await;
                    r.in_flight.fetch_add(1, Ordering::SeqCst);
                }
                3 => tokio::time::sleep(Duration::from_millis(60)).await,
                // Even a quick answer takes a moment: two deliverers at
                // once would overlap here.
                _ => tokio::time::sleep(Duration::from_millis(15)).await,
            },
        }
        let id = headers["webhook-id"].to_str().unwrap().to_owned();
        let text = String::from_utf8(body.to_vec()).unwrap();
        r.acked.lock().unwrap().push((id, text));
        AxumStatus::NO_CONTENT
    }
    .await;
    r.in_flight.fetch_sub(1, Ordering::SeqCst);
    answer
}

/// A listener that speaks TLS with the fixture certificate `name`
/// (tests/fixtures/tls): `receiver` (signed by the test CA) or `stranger`
/// (self-signed). A failed handshake is dropped; the next is awaited.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
}

impl TlsListener {
    async fn bind(name: &str) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(format!("{dir}/{name}.pem"))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_file(format!("{dir}/{name}.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        Self {
            tcp: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tls: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.tls.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// The receiver over https, with the fixture certificate `cert`.
async fn start_tls_receiver(cert: &str) -> (Arc<Receiver>, SocketAddr) {
    let receiver = Arc::new(Receiver::default());
    receiver.mode.store(UP, Ordering::SeqCst);
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(receiver.clone());
    let listener = TlsListener::bind(cert).await;
    let addr = axum::serve::Listener::local_addr(&listener).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, addr)
}

async fn start_receiver(mode: u8) -> (Arc<Receiver>, SocketAddr) {
    let receiver = Arc::new(Receiver::default());
    receiver.mode.store(mode, Ordering::SeqCst);
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(receiver.clone());
    (receiver, serve_on_loopback(app).await)
}

/// A service pushing to `addr`, through its real command line; quick
/// back-off and a short settle for the test.
async fn spawn_pushing(addr: SocketAddr, max_attempts: u32) -> TestApp {
    spawn_pushing_to(&[format!("http://{addr}/hook")], max_attempts, &[]).await
}

/// A service pushing to every one of `urls` (one comma-separated
/// `EVENT_WEBHOOK_URL`), with `extra` flags.
async fn spawn_pushing_to(urls: &[String], max_attempts: u32, extra: &[&str]) -> TestApp {
    let url = format!("--event-webhook-url={}", urls.join(","));
    let secret = format!("--event-webhook-secret={SECRET}");
    let attempts = format!("--event-webhook-max-attempts={max_attempts}");
    let pay = format!("--payment-webhook-secrets={PAY_SECRET}");
    let timeout = format!("--event-webhook-timeout-ms={}", SENDER_TIMEOUT.as_millis());
    let mut args = vec![
        "--auth=none",
        url.as_str(),
        secret.as_str(),
        attempts.as_str(),
        timeout.as_str(),
        pay.as_str(),
    ];
    args.extend_from_slice(extra);
    spawn_app_cli(&args, |s| {
        s.http.limits = Limits::unlimited();
        s.db.timeout = Duration::from_millis(500);
        fast_delivery(s);
    })
    .await
}

fn fast_delivery(s: &mut flashsale::config::Settings) {
    let w = s.workers.as_mut().expect("workers");
    w.deliver_every = Duration::from_millis(50);
    assert!(!w.events.is_empty(), "delivery configured");
    for events in &mut w.events {
        events.backoff_min = Duration::from_millis(10);
        events.backoff_max = Duration::from_millis(40);
    }
}

/// The dead letters an operator lists (`GET /api/admin/events/dead`).
async fn dead_letters(app: &TestApp) -> Vec<Value> {
    let dead: Value = app
        .client
        .get(app.url("/api/admin/events/dead"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    dead["dead"].as_array().cloned().unwrap_or_default()
}

impl TestApp {
    /// The ids of every event recorded so far, as the feed lists them
    /// (once settled: waited for until their count is `n`).
    async fn event_ids(&self, n: usize) -> Vec<i64> {
        eventually("the events are listed", Duration::from_secs(10), || async {
            self.events(500).await.len() >= n
        })
        .await;
        self.events(500)
            .await
            .iter()
            .map(|e| e["id"].as_i64().expect("an id"))
            .collect()
    }
}

#[tokio::test]
async fn every_event_reaches_a_flaky_receiver_in_order() {
    let (receiver, addr) = start_receiver(FLAKY).await;
    let app = spawn_pushing(addr, 100).await;
    // A second worker process beside it, delivering to the same endpoint.
    let _beside = app.workers_beside("beside", |_| {}).await;
    let sku = app.new_sale(20, 1).await;
    let mut ids = Vec::new();
    for user in 1..=12 {
        let order: Value = app.place_order(user, &sku, 1).await.json().await.unwrap();
        ids.push(order["order_id"].as_str().unwrap().to_owned());
    }
    app.drained(&sku, 12).await;
    for id in &ids[..4] {
        app.pay(id, &format!("p-{id}"), "4999.00").await;
    }
    for (user, id) in (5..=8).zip(&ids[4..8]) {
        assert_eq!(app.cancel(id, user).await.status(), StatusCode::OK);
    }
    let events = app.event_ids(12 + 4 + 4).await;
    assert_eq!(events.len(), 12 + 4 + 4);
    let expected: Vec<String> = events.iter().map(|id| format!("evt_{id}")).collect();

    eventually(
        "every event acknowledged",
        Duration::from_secs(60),
        || async {
            // Every id, however often and wherever its repeats came (two
            // processes deliver: a repeat need not follow its first).
            let acked = receiver.acked.lock().unwrap();
            let seen: std::collections::HashSet<&String> = acked.iter().map(|(id, _)| id).collect();
            expected.iter().all(|id| seen.contains(id))
        },
    )
    .await;
    let acked = receiver.acked.lock().unwrap().clone();
    assert_eq!(
        receiver.forged.load(Ordering::SeqCst),
        0,
        "every signature verified"
    );
    assert_eq!(
        receiver.max_in_flight.load(Ordering::SeqCst),
        1,
        "one delivery awaited at a time, whatever the number of workers"
    );
    // In order: the first acknowledgements of the ids are the events' ids,
    // in id order; a repeat is the same id with the same body.
    let mut first: Vec<String> = Vec::new();
    let mut bodies: BTreeMap<String, String> = BTreeMap::new();
    for (id, body) in &acked {
        match bodies.get(id) {
            Some(earlier) => assert_eq!(earlier, body, "a duplicate repeats its message"),
            None => {
                bodies.insert(id.clone(), body.clone());
                first.push(id.clone());
            }
        }
    }
    assert_eq!(first, expected, "each event once, in order");
    // What they said: per order, its changes in order.
    let mut per_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in &first {
        let msg: Value = serde_json::from_str(&bodies[id]).unwrap();
        assert_eq!(format!("evt_{}", msg["id"]), *id);
        per_order
            .entry(msg["data"]["order_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(msg["type"].as_str().unwrap().to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        let want: &[&str] = match i {
            0..4 => &["order.confirmed", "order.paid"],
            4..8 => &["order.confirmed", "order.cancelled"],
            _ => &["order.confirmed"],
        };
        assert_eq!(per_order[id], want, "{id}");
    }
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("flashsale_event_deliveries_total{result=\"failed\"}"),
        "failures are counted"
    );
}

/// Every process renews the lease on each pass while the holder moves its
/// cursor: on the same row, at once, none of them fails (a deadlock
/// between two renewals, or a renewal and a cursor write, is avoided or
/// tried again, never the holder's error: that would deliver its pass
/// again).
#[tokio::test]
async fn lease_renewals_and_cursor_writes_at_once_never_fail() {
    let app = spawn_app().await;
    let deliveries = app.db.deliveries();
    let endpoint = unique("http://leases.test/");
    let mut tasks = tokio::task::JoinSet::new();
    for owner in 0..6 {
        let (deliveries, endpoint) = (deliveries.clone(), endpoint.clone());
        tasks.spawn(async move {
            let owner = format!("w{owner}");
            let mut failures = Vec::new();
            for i in 0..150i64 {
                let now = now_ms();
                match deliveries
                    .lease_delivery(&endpoint, &owner, now, now + 60_000)
                    .await
                {
                    Ok(Some(_)) => {
                        if let Err(e) = deliveries.delivered(&endpoint, &owner, i + 1).await {
                            failures.push(format!("cursor: {e:?}"));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => failures.push(format!("lease: {e:?}")),
                }
            }
            failures
        });
    }
    let failures: Vec<String> = tasks.join_all().await.concat();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
}

#[tokio::test]
async fn an_event_that_keeps_failing_is_dead_lettered_and_replayed() {
    let (receiver, addr) = start_receiver(DOWN).await;
    let app = spawn_pushing(addr, 2).await;
    let sku = app.new_sale(10, 1).await;
    let order: Value = app.place_order(1, &sku, 1).await.json().await.unwrap();
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    app.drained(&sku, 1).await;
    let admin = |method: reqwest::Method, path: &str| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(ADMIN_TOKEN)
    };
    eventually(
        "the event is dead-lettered",
        Duration::from_secs(30),
        || async {
            let dead: Value = admin(reqwest::Method::GET, "/api/admin/events/dead")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            dead["dead"].as_array().is_some_and(|d| d.len() == 1)
        },
    )
    .await;
    // The operator's page shows it (this process's workers deliver).
    let cookie = crate::dashboard::session_cookie(&app).await;
    let shown = crate::dashboard::data(&app, &cookie).await;
    assert_eq!(shown["instance"]["events"]["dead_letters"], 1, "{shown}");
    // Delivery moved on: the next event goes through once the receiver is up.
    receiver.mode.store(UP, Ordering::SeqCst);
    assert_eq!(app.cancel(&order_id, 1).await.status(), StatusCode::OK);
    eventually(
        "the next event is delivered",
        Duration::from_secs(30),
        || async { receiver.acked.lock().unwrap().len() == 1 },
    )
    .await;
    // The operator replays the dead letter: it arrives, and leaves the list.
    let replay: Value = admin(reqwest::Method::POST, "/api/admin/events/dead/replay")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(replay["replaying"], 1);
    eventually(
        "the dead letter is delivered",
        Duration::from_secs(30),
        || async { receiver.acked.lock().unwrap().len() == 2 },
    )
    .await;
    let acked = receiver.acked.lock().unwrap().clone();
    let types: Vec<Value> = acked
        .iter()
        .map(|(_, b)| serde_json::from_str::<Value>(b).unwrap()["type"].clone())
        .collect();
    assert_eq!(
        types,
        vec![json!("order.cancelled"), json!("order.confirmed")]
    );
    let dead: Value = admin(reqwest::Method::GET, "/api/admin/events/dead")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dead["dead"], json!([]));
    // The sale's report counts them as the receiver saw them: two
    // deliveries, one given up on.
    eventually(
        "the report counts the events",
        Duration::from_secs(10),
        || async {
            let s = crate::report::report(&app, &sku).await["summary"].clone();
            s["events_delivered"] == 2 && s["events_dead"] == 1
        },
    )
    .await;
}

/// Two endpoints: each gets every event, in order, on its own; one that is
/// down holds back only itself (its events dead-lettered for it alone), and
/// a replay brings them to it.
#[tokio::test]
async fn each_endpoint_gets_every_event_on_its_own() {
    let (up, up_addr) = start_receiver(UP).await;
    let (down, down_addr) = start_receiver(DOWN).await;
    let urls = [up_addr, down_addr].map(|a| format!("http://{a}/hook"));
    let app = spawn_pushing_to(&urls, 2, &[]).await;
    let sku = app.new_sale(10, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    app.drained(&sku, 3).await;
    let expected: Vec<String> = app
        .event_ids(3)
        .await
        .iter()
        .map(|id| format!("evt_{id}"))
        .collect();
    assert_eq!(expected.len(), 3);
    let ids_of = Receiver::acked_ids;
    eventually(
        "the healthy endpoint has them all",
        Duration::from_secs(30),
        || async { ids_of(&up) == expected },
    )
    .await;
    let dead = || dead_letters(&app);
    eventually(
        "the down endpoint's are dead letters",
        Duration::from_secs(30),
        || async { dead().await.len() == 3 },
    )
    .await;
    let down_url = format!("http://{down_addr}/hook");
    assert!(
        dead()
            .await
            .iter()
            .all(|d| d["endpoint"] == down_url.as_str()),
        "dead letters of the failing endpoint only"
    );
    assert!(ids_of(&down).is_empty());
    down.mode.store(UP, Ordering::SeqCst);
    let (status, _) = app.admin_post("/api/admin/events/dead/replay").await;
    assert_eq!(status, StatusCode::OK);
    eventually(
        "replayed to the endpoint that missed them",
        Duration::from_secs(30),
        || async {
            let mut got = ids_of(&down);
            got.sort();
            let mut want = expected.clone();
            want.sort();
            got == want
        },
    )
    .await;
    // The healthy one got nothing twice from the replay.
    assert_eq!(ids_of(&up), expected);
}

/// An `https://` endpoint: reached when its certificate chains to a CA
/// the service trusts (`EVENT_WEBHOOK_CA_FILE`, beside the public web
/// PKI's); one that does not is refused at the handshake, and the
/// operator reads why in the dead letter.
#[tokio::test]
async fn events_reach_an_https_endpoint_whose_certificate_is_trusted() {
    let (trusted, trusted_addr) = start_tls_receiver("receiver").await;
    let (stranger, stranger_addr) = start_tls_receiver("stranger").await;
    let urls = [
        format!("https://127.0.0.1:{}/hook", trusted_addr.port()),
        format!("https://localhost:{}/hook", stranger_addr.port()),
    ];
    let ca = format!(
        "--event-webhook-ca-file={}/tests/fixtures/tls/ca.pem",
        env!("CARGO_MANIFEST_DIR")
    );
    let app = spawn_pushing_to(&urls, 2, &[ca.as_str()]).await;
    let sku = app.new_sale(10, 1).await;
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    app.drained(&sku, 1).await;
    let expected: Vec<String> = app
        .event_ids(1)
        .await
        .iter()
        .map(|id| format!("evt_{id}"))
        .collect();
    eventually("delivered over TLS", Duration::from_secs(30), || async {
        trusted.acked.lock().unwrap().len() == 1
    })
    .await;
    assert_eq!(trusted.acked.lock().unwrap()[0].0, expected[0]);
    assert_eq!(trusted.forged.load(Ordering::SeqCst), 0);
    let dead = || dead_letters(&app);
    eventually(
        "the untrusted endpoint's event is a dead letter",
        Duration::from_secs(30),
        || async { dead().await.len() == 1 },
    )
    .await;
    let letter = &dead().await[0];
    assert!(
        letter["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("certificate")),
        "{letter}"
    );
    assert!(stranger.acked.lock().unwrap().is_empty());
}

/// A redirect is not followed: a 3xx is a failed attempt like any other
/// non-2xx (the message goes only where the operator pointed it), and
/// the operator reads the status in the dead letter.
#[tokio::test]
async fn a_redirect_is_a_failure_not_followed() {
    let (elsewhere, elsewhere_addr) = start_receiver(UP).await;
    let to = format!("http://{elsewhere_addr}/hook");
    let moved = Router::new().route(
        "/hook",
        post(move || async move { (AxumStatus::TEMPORARY_REDIRECT, [("location", to)]) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, moved).await });
    let app = spawn_pushing(addr, 2).await;
    let sku = app.new_sale(10, 1).await;
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    app.drained(&sku, 1).await;
    let dead = || dead_letters(&app);
    eventually(
        "the redirected event is a dead letter",
        Duration::from_secs(30),
        || async { dead().await.len() == 1 },
    )
    .await;
    let letter = &dead().await[0];
    assert!(
        letter["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("307")),
        "{letter}"
    );
    assert!(elsewhere.acked.lock().unwrap().is_empty(), "not followed");
}
