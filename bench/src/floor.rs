//! The HTTP floors: bare hyper HTTP/1.1 servers (no router, no guards, no
//! metrics, no logging) driven by the same generator at the same concurrency
//! as the real service. They show what this machine allows any HTTP service:
//!
//! - [`Kind::Constant`] reads each request and answers the sold-out refusal
//!   at once: what HTTP alone costs, the most any service could answer here.
//! - [`Kind::Script`] parses the order body and calls the order script
//!   (through [`Sales`], no sold-out marker) and answers its outcome: the
//!   least any HTTP front for the script must do.
//!
//! They run in the bench process on a runtime of their own (one worker thread
//! per core, as `serve`'s), so they compete for the cores as `serve` does.

use std::convert::Infallible;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::cpu::ThreadGroup;
use flashsale::config::{MemorySettings, RedisTarget};
use flashsale::domain::ProductId;
use flashsale::http::error::ApiError;
use flashsale::sale::{Decision, NewOrder, Redis, Sales, Vouched};

/// The body `serve` answers a sold-out order with.
const SOLD_OUT: &[u8] = br#"{"error":"sold_out","message":"sold out"}"#;

/// What a floor answers.
pub enum Kind {
    /// The sold-out refusal, at once.
    Constant,
    /// The order script's outcome, on the sales under `prefix`.
    Script { redis: RedisTarget, prefix: String },
}

/// `flashsale-bench floor`: the constant floor, alone.
#[derive(Debug, Clone, clap::Args)]
pub struct FloorArgs {
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
}

/// Serves the constant floor for `secs` seconds, printing its address.
pub async fn serve_alone(args: FloorArgs) -> anyhow::Result<()> {
    let floor = Floor::start(Kind::Constant)?;
    println!("http://{}", floor.authority());
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    if let Some(cpu) = floor.cpu() {
        println!("CPU {} ms", cpu.as_millis());
    }
    Ok(())
}

/// A running floor server; stopped when dropped.
pub struct Floor {
    authority: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Its threads, for its CPU time apart from the load generator's.
    threads: ThreadGroup,
}

impl Floor {
    /// Starts it on a free loopback port.
    pub fn start(kind: Kind) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let authority = listener.local_addr()?.to_string();
        let threads = ThreadGroup::default();
        let on_start = threads.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("http-floor")
            .thread_keep_alive(Duration::from_secs(3600))
            .on_thread_start(move || on_start.register_current())
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let group = threads.clone();
        let thread = std::thread::Builder::new()
            .name("http-floor".into())
            .spawn(move || {
                group.register_current();
                runtime.block_on(serve(listener, kind, stopped))
            })?;
        Ok(Self {
            authority,
            stop: Some(stop),
            thread: Some(thread),
            threads,
        })
    }

    /// CPU time its threads have spent so far (`None`: not Linux).
    pub fn cpu(&self) -> Option<Duration> {
        self.threads.cpu()
    }

    /// `host:port` to send requests to.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, kind: Kind, mut stopped: oneshot::Receiver<()>) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    // Made on this runtime, so the connection's I/O runs here too.
    let sales = match kind {
        Kind::Constant => None,
        Kind::Script { redis, prefix } => match Redis::new(&redis, Duration::from_secs(5), 4) {
            Ok(redis) => Some(Arc::new(Sales::new(
                redis,
                prefix,
                MemorySettings::off(),
                None,
            ))),
            Err(e) => {
                tracing::error!(error = %e, "the floor cannot reach Redis");
                return;
            }
        },
    };
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let sales = sales.clone();
                let service = service_fn(move |req| answer(req, sales.clone()));
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        }
    }
}

#[derive(Deserialize)]
struct Order {
    user_id: flashsale::domain::UserId,
    product_id: String,
    quantity: flashsale::domain::Quantity,
}

async fn answer(
    req: Request<Incoming>,
    sales: Option<Arc<Sales>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read the body as the service does: the request is only whole then.
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let Some(sales) = sales else {
        return Ok(json(StatusCode::CONFLICT, Bytes::from_static(SOLD_OUT)));
    };
    let order = body
        .ok()
        .and_then(|b| serde_json::from_slice::<Order>(&b).ok())
        .and_then(|o| Some((ProductId::parse(&o.product_id).ok()?, o)));
    let Some((product, order)) = order else {
        return Ok(refusal(StatusCode::BAD_REQUEST, "invalid_request"));
    };
    Ok(
        match sales
            .orders()
            .place(NewOrder {
                product: &product,
                user_id: order.user_id,
                quantity: order.quantity,
                idempotency_key: key.as_deref(),
                vouched: Vouched::No,
            })
            .await
        {
            Ok(Decision::Placed(placed)) => {
                let body = format!(r#"{{"order_id":"{}"}}"#, placed.order.order_id);
                json(StatusCode::ACCEPTED, Bytes::from(body))
            }
            Ok(Decision::Refused { why, .. }) => {
                refusal(StatusCode::CONFLICT, ApiError::from(why).code())
            }
            Err(_) => refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        },
    )
}

fn refusal(status: StatusCode, code: &str) -> Response<Full<Bytes>> {
    json(status, Bytes::from(format!(r#"{{"error":"{code}"}}"#)))
}

fn json(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
