//! Clients that hold connections without using them: silent ones, ones
//! that trickle half a header block, idle keep-alive ones, crowds of them
//! from one address or many. The service closes them on their deadlines,
//! gives their places to newcomers at its cap, and keeps answering
//! well-behaved clients throughout. The bounds are set through `serve`'s
//! command line, as an operator sets them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{TestApp, eventually, spawn_app_cli};

fn addr(app: &TestApp) -> SocketAddr {
    app.base.trim_start_matches("http://").parse().unwrap()
}

/// A connection to the app from `from` (a loopback address).
async fn connect_from(app: &TestApp, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr(app)).await.unwrap()
}

/// How long until the service closes `conn` (reads until EOF or a reset),
/// within `limit`; `None` if it is still open then.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

async fn healthz(app: &TestApp) -> StatusCode {
    // A fresh connection each time, as a load balancer's health check.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    match client.get(app.url("/healthz")).send().await {
        Ok(resp) => resp.status(),
        Err(e) => panic!("/healthz unanswered: {e}"),
    }
}

async fn metric(app: &TestApp, reason: &str) -> u64 {
    let text = app.metrics_text().await;
    let series = format!("flashsale_http_connections_ended_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.parse().unwrap())
}

/// Starts a request on `conn` and sends a header line every 100 ms, never
/// ending the header block: how long until the server closes it (5 s at most).
async fn trickle_headers(conn: &mut TcpStream) -> Duration {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut header = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        header += 1;
        let line = format!("X-Slow-{header}: 1\r\n");
        if conn.write_all(line.as_bytes()).await.is_err() {
            return started.elapsed();
        }
        let mut probe = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), conn.read(&mut probe)).await
        {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "never closed");
    }
}

/// A silent connection and one that trickles half a header block are
/// closed at the header-read timeout (trickling does not extend it); an
/// idle keep-alive connection lives to its own, longer idle timeout; a
/// request taking longer than either is not cut.
#[tokio::test]
async fn slow_and_idle_connections_are_closed_on_their_deadlines() {
    let app = spawn_app_cli(
        &[
            "--auth=none",
            "--header-read-timeout-ms=400",
            "--idle-timeout-ms=1200",
        ],
        |_| {},
    )
    .await;
    let mut silent = connect_from(&app, "127.0.0.1").await;
    let mut trickling = connect_from(&app, "127.0.0.1").await;
    let trickle = trickle_headers(&mut trickling);
    // Two requests kept alive (an order with its body, then a GET), then
    // nothing.
    let sku = app.new_sale(10, 1).await;
    let mut idle = connect_from(&app, "127.0.0.1").await;
    let order = format!(r#"{{"user_id":1,"product_id":"{sku}","quantity":1}}"#);
    let request = format!(
        "POST /api/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{order}",
        order.len()
    );
    let mut answer = [0u8; 4096];
    for request in [request.as_str(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"] {
        idle.write_all(request.as_bytes()).await.unwrap();
        let n = idle.read(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(text.starts_with("HTTP/1.1 20"), "{text}");
    }
    let answered = Instant::now();

    let (silent_after, trickled_for) =
        tokio::join!(closed_within(&mut silent, Duration::from_secs(5)), trickle);
    let silent_after = silent_after.expect("a silent connection is closed");
    assert!(
        silent_after >= Duration::from_millis(300),
        "{silent_after:?}"
    );
    assert!(trickled_for < Duration::from_secs(2), "{trickled_for:?}");
    // The idle one outlives the header timeout, not its own.
    assert_eq!(
        closed_within(&mut idle, Duration::from_millis(300)).await,
        None,
        "an idle connection closed at the header timeout"
    );
    let idle_for = closed_within(&mut idle, Duration::from_secs(5))
        .await
        .map(|_| answered.elapsed())
        .expect("an idle keep-alive connection is closed");
    assert!(idle_for >= Duration::from_millis(1100), "{idle_for:?}");
    assert_eq!(healthz(&app).await, StatusCode::OK);
    assert!(metric(&app, "header_timeout").await >= 2);
    assert!(metric(&app, "idle_timeout").await >= 1);
}

/// At the cap, a crowd of silent connections (from many addresses) gives
/// way to newcomers: health checks and orders on new connections are
/// answered, one after another, while the crowd is kept at the cap.
#[tokio::test]
async fn at_the_cap_newcomers_take_the_places_of_the_longest_waiting() {
    let app = spawn_app_cli(
        &[
            "--auth=none",
            "--header-read-timeout-ms=60000",
            "--max-connections=20",
            "--max-connections-per-address=0",
        ],
        |_| {},
    )
    .await;
    let sku = app.new_sale(100, 100).await;
    let mut crowd = Vec::new();
    for n in 0..40u32 {
        crowd.push(connect_from(&app, &format!("127.0.1.{}", n % 8 + 1)).await);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for user in 1..=10u64 {
        assert_eq!(healthz(&app).await, StatusCode::OK);
        let resp = client
            .post(app.url("/api/orders"))
            .json(&serde_json::json!({"user_id": user, "product_id": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }
    assert!(metric(&app, "evicted").await >= 20, "the crowd gave way");
    // The crowd's oldest were closed by the service.
    let closed = {
        let mut n = 0;
        for conn in &mut crowd {
            if closed_within(conn, Duration::from_millis(20))
                .await
                .is_some()
            {
                n += 1;
            }
        }
        n
    };
    assert!(closed >= 20, "{closed} of the crowd closed");
}

/// One address gets its share of the connections: beyond it, a new one is
/// answered 503 `overloaded` (with the error body) and closed; other
/// addresses are not held back.
#[tokio::test]
async fn one_address_gets_its_share_of_connections() {
    let app = spawn_app_cli(
        &[
            "--auth=none",
            "--header-read-timeout-ms=60000",
            "--max-connections-per-address=5",
        ],
        |_| {},
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(connect_from(&app, "127.0.0.2").await);
    }
    let mut sixth = connect_from(&app, "127.0.0.2").await;
    sixth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sixth.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"], "overloaded", "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(healthz(&app).await, StatusCode::OK, "another address");
    drop(held.pop());
    // Once the service has seen it closed, its place is free again.
    eventually("a place free again", Duration::from_secs(5), || async {
        let mut again = connect_from(&app, "127.0.0.2").await;
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let mut answer = Vec::new();
        again.write_all(request).await.is_ok()
            && again.read_to_end(&mut answer).await.is_ok()
            && String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(metric(&app, "refused_address").await >= 1);
}

/// A client that sends requests and stops reading the answers holds its
/// connection no longer than the idle timeout once the service cannot
/// write: it is closed before the answers are all out.
#[tokio::test]
async fn a_client_that_stops_reading_is_dropped() {
    let app = spawn_app_cli(
        &[
            "--auth=none",
            "--header-read-timeout-ms=60000",
            "--idle-timeout-ms=600",
        ],
        |_| {},
    )
    .await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr(&app)).await.unwrap();
    // 42 KB answers, 2,000 of them pipelined: far more than the socket
    // buffers hold.
    let requests = "GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2_000);
    conn.write_all(requests.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut received = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received += n,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "still open after 10 s");
    let one: usize = app.get_json("/openapi.json").await.1.to_string().len();
    assert!(
        received < 1_000 * one,
        "{received} bytes received: the answers went on"
    );
    assert!(metric(&app, "write_stall").await >= 1);
}
