//! Refusals keep the connection: a keep-alive client never sees a transport
//! error because the service refused one of its requests. The client here
//! writes each request's head and body in two writes, as many HTTP clients
//! do, so an answer can leave before the body has arrived.

use std::time::Duration;

use flashsale::config::{Limits, RateLimit};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::helpers::{ADMIN_TOKEN, TestApp, spawn_app_with};
use crate::proxy::{Mode, Proxy};

/// An HTTP/1.1 client on one keep-alive connection, which it replaces only
/// when an answer says `Connection: close` (as every client does) or when
/// the connection fails under it (a transport error, counted).
struct KeepAlive {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    transport_errors: u32,
    /// New connections after the first, because an answer said `close`.
    reconnects: u32,
}

/// One answer: its status and whether it said `Connection: close`.
#[derive(Debug)]
struct Answer {
    status: u16,
    close: bool,
}

impl KeepAlive {
    fn new(app: &TestApp) -> Self {
        Self {
            addr: app.base.trim_start_matches("http://").to_owned(),
            conn: None,
            transport_errors: 0,
            reconnects: 0,
        }
    }

    /// Sends `head` (request line and headers, without the blank line) and
    /// `body`; `Content-Length` is added. A transport error is retried once
    /// on a new connection (and counted).
    async fn send(&mut self, head: &str, body: &str) -> Answer {
        for _ in 0..2 {
            match self.try_send(head, body).await {
                Ok(answer) => {
                    if answer.close {
                        self.conn = None;
                        self.reconnects += 1;
                    }
                    return answer;
                }
                Err(_) => {
                    self.transport_errors += 1;
                    self.conn = None;
                }
            }
        }
        panic!("two transport errors in a row on {head}");
    }

    async fn try_send(&mut self, head: &str, body: &str) -> std::io::Result<Answer> {
        if self.conn.is_none() {
            self.conn = Some(BufReader::new(TcpStream::connect(&self.addr).await?));
        }
        let conn = self.conn.as_mut().expect("connected");
        let head = format!(
            "{head}\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        conn.get_mut().write_all(head.as_bytes()).await?;
        if !body.is_empty() {
            // The body follows a moment later, as from a client that writes
            // the head and the body separately.
            tokio::time::sleep(Duration::from_millis(2)).await;
            conn.get_mut().write_all(body.as_bytes()).await?;
        }
        read_answer(conn).await
    }
}

async fn read_answer(conn: &mut BufReader<TcpStream>) -> std::io::Result<Answer> {
    let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err(eof());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(eof)?;
    let (mut length, mut close) = (0usize, false);
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            return Err(eof());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').ok_or_else(eof)?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().map_err(|_| eof())?,
            "connection" => close = value.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await?;
    Ok(Answer { status, close })
}

fn order(sku: &str, user: u64) -> String {
    format!(r#"{{"user_id":{user},"product_id":"{sku}","quantity":1}}"#)
}

const POST_ORDER: &str = "POST /api/orders HTTP/1.1\r\nContent-Type: application/json";

/// 429 per address, then 401, 404, 405, 415 and 431, all answered without
/// the handler reading the body: each on the same connection, which stays
/// usable.
#[tokio::test]
async fn refusals_before_the_body_is_read_keep_the_connection() {
    let app = spawn_app_with(|s| {
        s.http.limits = Limits {
            ip_rate: RateLimit::new(1, 3),
            ..Limits::unlimited()
        };
    })
    .await;
    let sku = app.new_sale(100, 100).await;
    let mut client = KeepAlive::new(&app);
    let mut statuses = Vec::new();
    for user in 1..=20 {
        statuses.push(client.send(POST_ORDER, &order(&sku, user)).await.status);
    }
    assert!(statuses.contains(&202), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let body = order(&sku, 1);
    let refusals = [
        (
            "POST /api/admin/products HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            401,
        ),
        (
            "POST /api/nowhere HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            404,
        ),
        (
            "PUT /api/orders HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            405,
        ),
        (
            "POST /api/orders/sku-1:00/pay HTTP/1.1\r\nContent-Type: text/plain".to_owned(),
            415,
        ),
        (
            format!(
                "{POST_ORDER}\r\nAuthorization: Bearer {ADMIN_TOKEN}{}",
                (0..70)
                    .map(|i| format!("\r\nX-Filler-{i}: x"))
                    .collect::<String>()
            ),
            431,
        ),
    ];
    for _ in 0..3 {
        for (head, status) in &refusals {
            let answer = client.send(head, &body).await;
            assert_eq!(answer.status, *status, "{head}");
        }
    }
    assert_eq!(client.transport_errors, 0, "a refusal broke the connection");
    assert_eq!(client.reconnects, 0, "a refusal closed the connection");
}

/// Under overload (a slow Redis keeps the one permit busy) keep-alive clients
/// get 503 `overloaded` and keep their connections.
#[tokio::test]
async fn shed_orders_keep_the_connection() {
    let redis = Proxy::start("127.0.0.1:6379").await;
    let app = spawn_app_with(|s| {
        s.redis.target =
            flashsale::config::RedisTarget::Single(format!("redis://127.0.0.1:{}", redis.port));
        s.http.limits = Limits {
            max_in_flight: 1,
            ..Limits::unlimited()
        };
    })
    .await;
    let sku = app.new_sale(1000, 1000).await;
    redis.set_mode(Mode::Slow(Duration::from_millis(20)));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..8 {
        let mut client = KeepAlive::new(&app);
        let sku = sku.clone();
        clients.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..15 {
                let user = c * 100 + i + 1;
                statuses.push(client.send(POST_ORDER, &order(&sku, user)).await.status);
            }
            (statuses, client.transport_errors, client.reconnects)
        });
    }
    let results = clients.join_all().await;
    let statuses: Vec<u16> = results.iter().flat_map(|r| r.0.clone()).collect();
    assert!(statuses.contains(&202), "{statuses:?}");
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| [202, 503].contains(s)),
        "{statuses:?}"
    );
    let errors: u32 = results.iter().map(|r| r.1).sum();
    let reconnects: u32 = results.iter().map(|r| r.2).sum();
    assert_eq!(
        (errors, reconnects),
        (0, 0),
        "shedding broke or closed connections"
    );
    redis.set_mode(Mode::Forward);
}

/// A body declared larger than the limit is not read: the 413 says
/// `Connection: close`, so the client opens a new connection, without error.
#[tokio::test]
async fn a_body_too_large_closes_the_connection_and_says_so() {
    let app = spawn_app_with(|_| {}).await;
    let mut client = KeepAlive::new(&app);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(20 * 1024));
    let answer = client.send(POST_ORDER, &big).await;
    assert_eq!((answer.status, answer.close), (413, true));
    let answer = client.send("GET /healthz HTTP/1.1", "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(client.transport_errors, 0);
}

/// A body that does not arrive within the request timeout is answered 408
/// with `Connection: close` (the rest of it would never be read).
#[tokio::test]
async fn a_body_too_slow_gets_408_and_closes_the_connection() {
    let app = spawn_app_with(|s| s.http.limits.request_timeout = Duration::from_millis(300)).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = BufReader::new(TcpStream::connect(&addr).await.expect("connects"));
    let head = format!("{POST_ORDER}\r\nHost: {addr}\r\nContent-Length: 50\r\n\r\n{{\"user_id\":");
    conn.get_mut()
        .write_all(head.as_bytes())
        .await
        .expect("sent");
    let answer = read_answer(&mut conn).await.expect("an answer, not a cut");
    assert_eq!((answer.status, answer.close), (408, true));
}
