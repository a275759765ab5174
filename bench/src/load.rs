//! The load generator: C concurrent callers, each sending the next planned
//! request as soon as its previous one is answered (closed loop), or at a
//! fixed pace (`rate`, open loop). A caller is an HTTP/1.1 keep-alive
//! connection (hyper's bare client, no pool) or, for the Redis limit, a
//! direct call of the order script.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use super::plan::Planned;
use super::tokens::Tokens;
use flashsale::domain::ProductId;
use flashsale::http::error::ApiError;
use flashsale::sale::{Decision, Sales};

/// What one request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Accepted(String),
    /// The `error` code of a refusal (or `transport` when no answer came).
    Refused(String),
}

/// A caller that answers planned requests.
pub trait Caller: Send + 'static {
    fn call(&mut self, i: usize, p: &Planned) -> impl Future<Output = Answer> + Send;
}

/// What a load run measured.
pub struct LoadRun {
    pub elapsed: Duration,
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
    pub answers: Vec<Answer>,
    /// Each answer's latency in microseconds (by plan index).
    pub latencies_us: Vec<u64>,
}

impl LoadRun {
    pub fn per_second(&self) -> f64 {
        self.answers.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// Answers by outcome: `accepted` (a new order), `replayed` (an order
    /// answered before, under the same Idempotency-Key) or the refusal code.
    pub fn outcomes(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        for a in &self.answers {
            let key = match a {
                Answer::Accepted(id) if seen.insert(id.as_str()) => "accepted",
                Answer::Accepted(_) => "replayed",
                Answer::Refused(code) => code.as_str(),
            };
            *out.entry(key.to_owned()).or_default() += 1;
        }
        out
    }

    /// Latency quantiles (ms) of the answers with each outcome.
    pub fn latency_by_outcome(&self, quantiles: &[f64]) -> BTreeMap<String, Vec<f64>> {
        let mut by: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
        for (a, us) in self.answers.iter().zip(&self.latencies_us) {
            let key = match a {
                Answer::Accepted(_) => "accepted",
                Answer::Refused(code) => code.as_str(),
            };
            let h = by.entry(key.to_owned()).or_insert_with(new_histogram);
            let _ = h.record((*us).max(1));
        }
        by.into_iter()
            .map(|(k, h)| {
                let qs = quantiles
                    .iter()
                    .map(|q| h.value_at_quantile(*q) as f64 / 1000.0)
                    .collect();
                (k, qs)
            })
            .collect()
    }
}

/// Runs `plan` through `callers` (one task each), paced at `rate` requests/s
/// if given, showing progress under `label` if given.
pub async fn drive<C: Caller>(
    plan: Arc<Vec<Planned>>,
    callers: Vec<C>,
    rate: Option<f64>,
    label: Option<&str>,
) -> LoadRun {
    drive_until(plan, callers, rate, None, label).await
}

/// [`drive`], sending no request after `until` (the run's answers are then
/// those of the requests sent: a prefix of the plan).
pub async fn drive_until<C: Caller>(
    plan: Arc<Vec<Planned>>,
    callers: Vec<C>,
    rate: Option<f64>,
    until: Option<Instant>,
    label: Option<&str>,
) -> LoadRun {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let progress = label
        .map(|label| tokio::spawn(progress(label.to_owned(), plan.len() as u64, done.clone())));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut caller in callers {
        let (plan, next, done) = (plan.clone(), next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut latency = new_histogram();
            let mut answers = Vec::new();
            loop {
                if until.is_some_and(|u| Instant::now() >= u) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = plan.get(i) else { break };
                if let Some(rate) = rate {
                    let due = started + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let t = Instant::now();
                let answer = caller.call(i, p).await;
                let us = t.elapsed().as_micros().max(1) as u64;
                let _ = latency.record(us);
                answers.push((i, answer, us));
                done.fetch_add(1, Ordering::Relaxed);
            }
            (latency, answers)
        }));
    }
    let mut latency = new_histogram();
    let mut answers = vec![Answer::Refused("not_sent".into()); plan.len()];
    let mut latencies_us = vec![0; plan.len()];
    for t in tasks {
        if let Ok((h, part)) = t.await {
            let _ = latency.add(&h);
            for (i, a, us) in part {
                answers[i] = a;
                latencies_us[i] = us;
            }
        }
    }
    let elapsed = started.elapsed();
    let sent = next.load(Ordering::Relaxed).min(plan.len());
    answers.truncate(sent);
    latencies_us.truncate(sent);
    if let Some(progress) = progress {
        progress.abort();
        if std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
    LoadRun {
        elapsed,
        latency,
        answers,
        latencies_us,
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("valid bounds"))
}

/// A bar on a terminal, a plain line a second otherwise.
async fn progress(label: String, total: u64, done: Arc<AtomicU64>) {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let tick = if tty { 200 } else { 1000 };
    loop {
        tokio::time::sleep(Duration::from_millis(tick)).await;
        let n = done.load(Ordering::Relaxed);
        let rate = n as f64 / started.elapsed().as_secs_f64();
        if tty {
            let filled = (n * 30 / total.max(1)) as usize;
            eprint!(
                "\r{label:<8} [{:<30}] {n}/{total} {rate:.0} req/s",
                "=".repeat(filled)
            );
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{label}: {n}/{total} requests, {rate:.0} req/s");
        }
    }
}

/// One HTTP/1.1 keep-alive connection (hyper's bare client: no pool).
pub struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    host: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("connect: {0}")]
    Io(#[from] std::io::Error),
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
}

impl Conn {
    pub async fn open(authority: &str) -> Result<Self, HttpError> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Self {
            sender,
            host: authority.to_owned(),
        })
    }

    /// Sends one request; returns the status and the body.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

#[derive(Deserialize)]
struct Reply {
    order_id: Option<String>,
    error: Option<String>,
}

/// Orders over HTTP, reconnecting after a transport error.
pub struct HttpCaller {
    pub authority: String,
    /// The rehearsal's sales, by `Planned::sale`.
    pub products: Arc<Vec<ProductId>>,
    pub key_prefix: String,
    pub conn: Option<Conn>,
    /// Each buyer's bearer token, when the service verifies buyers (else the
    /// body's `user_id` speaks for them, as with `AUTH=none`).
    pub tokens: Option<Arc<Tokens>>,
}

/// The product id a planned request names: its sale's, or a made-up one.
fn product_of(products: &[ProductId], i: usize, p: &Planned) -> String {
    if p.unknown {
        format!("nosuch-{i}")
    } else {
        products[p.sale].to_string()
    }
}

impl Caller for HttpCaller {
    async fn call(&mut self, i: usize, p: &Planned) -> Answer {
        if self.conn.is_none() {
            self.conn = Conn::open(&self.authority).await.ok();
        }
        let Some(conn) = self.conn.as_mut() else {
            return Answer::Refused("transport".into());
        };
        let body = format!(
            r#"{{"user_id":{},"product_id":"{}","quantity":1}}"#,
            p.user,
            product_of(&self.products, i, p)
        );
        let key = p.key.map(|k| format!("{}{k}", self.key_prefix));
        // Minted before the burst (`Tokens::mint_all`): a lookup here.
        let bearer = match self.tokens.as_ref().map(|t| t.bearer(p.user)).transpose() {
            Ok(bearer) => bearer,
            Err(_) => return Answer::Refused("token_not_minted".into()),
        };
        let headers: Vec<(&str, &str)> = key
            .iter()
            .map(|k| ("idempotency-key", k.as_str()))
            .chain(bearer.iter().map(|b| ("authorization", &**b)))
            .collect();
        match conn
            .send(Method::POST, "/api/orders", &headers, Some(body))
            .await
        {
            Ok((status, body)) => {
                let reply: Option<Reply> = serde_json::from_slice(&body).ok();
                match (status, reply) {
                    (
                        StatusCode::ACCEPTED,
                        Some(Reply {
                            order_id: Some(id), ..
                        }),
                    ) => Answer::Accepted(id),
                    (
                        _,
                        Some(Reply {
                            error: Some(code), ..
                        }),
                    ) => Answer::Refused(code),
                    (status, _) => Answer::Refused(format!("http_{}", status.as_u16())),
                }
            }
            Err(_) => {
                self.conn = None;
                Answer::Refused("transport".into())
            }
        }
    }
}

/// Orders straight through the order script (the Redis limit).
pub struct DirectCaller {
    pub sales: Sales,
    pub products: Arc<Vec<ProductId>>,
    pub key_prefix: String,
}

impl Caller for DirectCaller {
    async fn call(&mut self, i: usize, p: &Planned) -> Answer {
        let key = p.key.map(|k| format!("{}{k}", self.key_prefix));
        let Ok(product) = ProductId::parse(&product_of(&self.products, i, p)) else {
            return Answer::Refused("invalid_request".into());
        };
        match super::place(&self.sales, &product, p.user, key.as_deref()).await {
            Ok(Decision::Placed(placed)) => Answer::Accepted(placed.order.order_id.to_string()),
            Ok(Decision::Refused { why, .. }) => Answer::Refused(ApiError::from(why).code().into()),
            Err(_) => Answer::Refused("unavailable".into()),
        }
    }
}
