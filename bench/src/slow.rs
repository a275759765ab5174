//! `flashsale-bench slow-clients`: what a crowd of slow and idle
//! connections does to well-behaved clients. For each `flashsale` binary
//! given (side by side in one run), a real `serve` process is started with
//! a small open-file limit (`prlimit`), on a Redis server of the bench's
//! own, and measured twice: alone, then beside `--slow` connections that
//! connect from many loopback addresses and send half a header block (a
//! line a second, reconnecting `--reconnect-ms` after the service closes
//! them). Each
//! phase reports the orders/s and latency of keep-alive buyers, health
//! checks on fresh connections, and the service's CPU. Then the cost of
//! polls and joins for made-up sale ids: Redis scripts per request, from
//! the private Redis's `INFO commandstats`.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hyper::{Method, StatusCode};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::load::{self, Conn, HttpCaller};
use super::plan::Planned;
use flashsale::domain::ProductId;

#[derive(Debug, Clone, Args)]
pub struct BenchSlowArgs {
    /// `flashsale` binaries to compare (e.g. the build before and after a change).
    #[arg(long = "binary", required = true)]
    pub binaries: Vec<String>,
    /// Slow connections held against the service in the second phase.
    #[arg(long, default_value_t = 3000)]
    pub slow: usize,
    /// How long a slow client waits to reconnect after the service closed
    /// it (slowloris re-opens its sockets every cycle of 15 s; 100 ms makes
    /// a flood of connections).
    #[arg(long, default_value_t = 1000)]
    pub reconnect_ms: u64,
    /// The service's open-file limit (soft and hard).
    #[arg(long, default_value_t = 1024)]
    pub nofile: u64,
    /// Seconds each phase's load runs.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Keep-alive buyers placing orders, each one request at a time.
    #[arg(long, default_value_t = 16)]
    pub callers: usize,
    /// The bench's own Redis server's port (started and stopped here).
    #[arg(long, default_value_t = 6391)]
    pub redis_port: u16,
    /// MySQL server (a database per binary is created and dropped).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql: String,
    /// Polls and joins of made-up sale ids sent to measure their cost.
    #[arg(long, default_value_t = 400)]
    pub unknown: usize,
    #[arg(long)]
    pub json: bool,
}

/// One phase's figures.
#[derive(Debug, Serialize)]
struct Phase {
    binary: String,
    slow: usize,
    orders_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Orders that got no answer (a transport error).
    orders_unanswered: u64,
    healthz_ok: u64,
    healthz_failed: u64,
    healthz_p99_ms: f64,
    /// Times the slow crowd had to reconnect (the service closed them).
    slow_reconnects: u64,
    /// The service's CPU over the phase, in % of one core.
    serve_cpu_pct: f64,
}

/// What polls and joins of unknown ids cost Redis.
#[derive(Debug, Serialize)]
struct Unknown {
    binary: String,
    polls: usize,
    joins: usize,
    /// Redis scripts run (`EVALSHA`/`EVAL`) per request.
    scripts_per_request: f64,
    /// Redis commands of any kind per request.
    commands_per_request: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    phases: Vec<Phase>,
    unknown: Vec<Unknown>,
}

pub async fn run_slow_bench(args: BenchSlowArgs) -> anyhow::Result<()> {
    let redis = PrivateRedis::start(args.redis_port)?;
    let mut report = Report {
        phases: Vec::new(),
        unknown: Vec::new(),
    };
    for binary in &args.binaries {
        let serve = Serve::start(binary, &args, &redis)?;
        let outcome = measure(binary, &args, &serve, &redis, &mut report).await;
        drop(serve);
        outcome?;
    }
    drop(redis);
    super::show(args.json, &report, print)
}

async fn measure(
    binary: &str,
    args: &BenchSlowArgs,
    serve: &Serve,
    redis: &PrivateRedis,
    report: &mut Report,
) -> anyhow::Result<()> {
    serve.wait_healthy().await?;
    let product = serve.open_sale().await?;
    for slow in [0, args.slow] {
        let crowd = Crowd::hold(
            &serve.authority,
            slow,
            Duration::from_millis(args.reconnect_ms),
        );
        // Let the crowd build up (and the service face it) first.
        tokio::time::sleep(Duration::from_secs(if slow > 0 { 3 } else { 0 })).await;
        let phase = phase(binary, args, serve, &product, slow, &crowd).await;
        crowd.stop();
        report.phases.push(phase);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let before = redis.commandstats()?;
    let (mut polls, mut joins) = (0, 0);
    let mut conn = Conn::open(&serve.authority).await?;
    for n in 0..args.unknown {
        let path = format!("/api/sales/made-up-{n}/queue/1.e1.00");
        conn.send(Method::GET, &path, &[], None).await?;
        polls += 1;
        if n % 4 == 0 {
            let path = format!("/api/sales/made-up-{n}/queue");
            let body = Some(r#"{"user_id":1}"#.to_owned());
            conn.send(Method::POST, &path, &[], body).await?;
            joins += 1;
        }
    }
    let after = redis.commandstats()?;
    let requests = (polls + joins) as f64;
    report.unknown.push(Unknown {
        binary: binary.to_owned(),
        polls,
        joins,
        scripts_per_request: (after.0 - before.0) as f64 / requests,
        commands_per_request: (after.1 - before.1) as f64 / requests,
    });
    Ok(())
}

async fn phase(
    binary: &str,
    args: &BenchSlowArgs,
    serve: &Serve,
    product: &ProductId,
    slow: usize,
    crowd: &Crowd,
) -> Phase {
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let reconnects_before = crowd.reconnects.load(Ordering::Relaxed);
    let cpu_before = super::cpu::of(&serve.pid());
    let health = tokio::spawn(health_checks(serve.authority.clone(), until));
    let plan: Vec<Planned> = (0..10_000_000u64)
        .map(|i| Planned {
            sale: 0,
            user: i + 1,
            key: None,
            retry_of: None,
            unknown: false,
        })
        .collect();
    let callers = (0..args.callers)
        .map(|_| HttpCaller {
            authority: serve.authority.clone(),
            products: Arc::new(vec![product.clone()]),
            key_prefix: String::new(),
            conn: None,
            tokens: None,
        })
        .collect();
    let run = load::drive_until(Arc::new(plan), callers, None, Some(until), None).await;
    let cpu_after = super::cpu::of(&serve.pid());
    let (ok, failed, health_p99) = health.await.unwrap_or((0, 0, 0.0));
    let unanswered = run
        .answers
        .iter()
        .filter(|a| matches!(a, load::Answer::Refused(c) if c == "transport"))
        .count() as u64;
    let ms = |q: f64| run.latency.value_at_quantile(q) as f64 / 1000.0;
    Phase {
        binary: binary.to_owned(),
        slow,
        orders_per_sec: run.per_second(),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        orders_unanswered: unanswered,
        healthz_ok: ok,
        healthz_failed: failed,
        healthz_p99_ms: health_p99,
        slow_reconnects: crowd.reconnects.load(Ordering::Relaxed) - reconnects_before,
        serve_cpu_pct: match (cpu_before, cpu_after) {
            (Some(a), Some(b)) => {
                (b.saturating_sub(a)).as_secs_f64() / run.elapsed.as_secs_f64() * 100.0
            }
            _ => f64::NAN,
        },
    }
}

/// A health check on a fresh connection every 100 ms until `until`, each
/// bounded by 2 s: (answered 200, failed, p99 ms).
async fn health_checks(authority: String, until: Instant) -> (u64, u64, f64) {
    let (mut ok, mut failed) = (0, 0);
    let mut took = Vec::new();
    while Instant::now() < until {
        let started = Instant::now();
        let answered = tokio::time::timeout(Duration::from_secs(2), async {
            let mut conn = Conn::open(&authority).await.map_err(|e| e.to_string())?;
            let connected = started.elapsed();
            conn.send(Method::GET, "/healthz", &[], None)
                .await
                .map(|r| (r.0, connected))
                .map_err(|e| format!("after connecting in {connected:?}: {e}"))
        })
        .await;
        match answered {
            Ok(Ok((StatusCode::OK, connected))) => {
                ok += 1;
                took.push(started.elapsed().as_secs_f64() * 1000.0);
                tracing::debug!(?connected, took = ?started.elapsed(), "health check answered");
            }
            other => {
                tracing::debug!(?other, "health check failed");
                failed += 1
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    took.sort_by(f64::total_cmp);
    let p99 = took
        .get((took.len() as f64 * 0.99) as usize)
        .or(took.last())
        .copied()
        .unwrap_or(f64::NAN);
    (ok, failed, p99)
}

/// The slow crowd: `n` tasks, each holding a connection from its own
/// loopback address that sends half a header block and then a line a
/// second, reconnecting when closed.
struct Crowd {
    stop: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
}

impl Crowd {
    fn hold(authority: &str, n: usize, pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let reconnects = Arc::new(AtomicU64::new(0));
        let target: std::net::SocketAddr = authority
            .parse()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 8080)));
        for i in 0..n {
            let from = std::net::Ipv4Addr::new(127, 0, 2 + (i / 250) as u8, 1 + (i % 250) as u8);
            let (stop, reconnects) = (stop.clone(), reconnects.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    hold_one(from, target, &stop).await;
                    reconnects.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(pause).await;
                }
            });
        }
        Self { stop, reconnects }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One slow connection, until the service closes it (or the crowd stops).
async fn hold_one(from: std::net::Ipv4Addr, to: std::net::SocketAddr, stop: &AtomicBool) {
    let Ok(socket) = TcpSocket::new_v4() else {
        return;
    };
    if socket.bind((from, 0).into()).is_err() {
        return;
    }
    let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(2), socket.connect(to)).await
    else {
        return;
    };
    if conn
        .write_all(b"POST /api/orders HTTP/1.1\r\nHost: x\r\n")
        .await
        .is_err()
    {
        return;
    }
    let mut buf = [0u8; 512];
    let mut line = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => return, // an answer (a refusal): the service is done with it
            Err(_) => {}
        }
        line += 1;
        if conn
            .write_all(format!("X-Slow-{line}: 1\r\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A `flashsale serve` child process, killed when dropped.
struct Serve {
    child: Child,
    authority: String,
    token: String,
    db: String,
    mysql: String,
}

impl Serve {
    fn start(binary: &str, args: &BenchSlowArgs, redis: &PrivateRedis) -> anyhow::Result<Self> {
        let port = free_port()?;
        let authority = format!("127.0.0.1:{port}");
        let db = format!(
            "fs_bench_slow_{}",
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        let token = uuid::Uuid::now_v7().simple().to_string();
        let nofile = format!("--nofile={}:{}", args.nofile, args.nofile);
        let child = Command::new("prlimit")
            .args([nofile.as_str(), "--", binary, "serve"])
            .env_clear()
            .env("LISTEN_ADDR", &authority)
            .env("REDIS_URL", format!("redis://127.0.0.1:{}", redis.port))
            .env("DATABASE_URL", format!("{}/{db}", args.mysql))
            .env("ADMIN_TOKEN", &token)
            .env("AUTH", "none")
            .env("RATE_LIMITS", "false")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("SLOW_BENCH_SERVE_LOG") {
                Some(path) => Stdio::from(std::fs::File::create(path)?),
                None => Stdio::null(),
            })
            .spawn()?;
        Ok(Self {
            child,
            authority,
            token,
            db,
            mysql: args.mysql.clone(),
        })
    }

    fn pid(&self) -> String {
        // prlimit execs the binary: the same process.
        self.child.id().to_string()
    }

    async fn wait_healthy(&self) -> anyhow::Result<()> {
        for _ in 0..200 {
            if let Ok(mut conn) = Conn::open(&self.authority).await
                && let Ok((StatusCode::OK, _)) = conn.send(Method::GET, "/readyz", &[], None).await
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("{} never became ready", self.authority)
    }

    /// A sale that cannot sell out during the bench, opened through the admin API.
    async fn open_sale(&self) -> anyhow::Result<ProductId> {
        let id = format!("slow-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
        let now = flashsale::domain::now_ms();
        let body = serde_json::json!({
            "product_id": id, "title": "bench", "price": "1.00",
            "available_qty": 100_000_000u64, "limit_per_user": 1,
            "start_time": now - 1000, "end_time": now + 3_600_000,
        });
        let bearer = format!("Bearer {}", self.token);
        let auth = [("authorization", bearer.as_str())];
        let mut conn = Conn::open(&self.authority).await?;
        let (status, _) = conn
            .send(
                Method::POST,
                "/api/admin/products",
                &auth,
                Some(body.to_string()),
            )
            .await?;
        anyhow::ensure!(status == StatusCode::CREATED, "create: {status}");
        let open = format!("/api/admin/products/{id}/open");
        let (status, _) = conn.send(Method::POST, &open, &auth, None).await?;
        anyhow::ensure!(status.is_success(), "open: {status}");
        Ok(ProductId::parse(&id)?)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("mariadb")
            .args(["-h", "127.0.0.1", "-uroot", "-e"])
            .arg(format!("DROP DATABASE IF EXISTS `{}`", self.db))
            .status();
        let _ = &self.mysql;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A Redis server of the bench's own (nothing else's commands in its stats).
struct PrivateRedis {
    child: Child,
    port: u16,
}

impl PrivateRedis {
    fn start(port: u16) -> anyhow::Result<Self> {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()?;
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Self { child, port });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("redis-server on {port} did not start")
    }

    /// (scripts run, commands run) so far.
    fn commandstats(&self) -> anyhow::Result<(u64, u64)> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?;
        let mut conn = client.get_connection()?;
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn)?;
        let (mut scripts, mut all) = (0, 0);
        for line in info.lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let calls: u64 = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            // The INFO calls themselves are not the requests'.
            if name == "cmdstat_info" {
                continue;
            }
            if name.starts_with("cmdstat_eval") {
                scripts += calls;
            }
            all += calls;
        }
        Ok((scripts, all))
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn print(r: &Report) {
    println!(
        "{:<28} {:>6} {:>9} {:>8} {:>8} {:>10} {:>12} {:>10} {:>10} {:>8}",
        "binary",
        "slow",
        "orders/s",
        "p50 ms",
        "p99 ms",
        "unanswered",
        "healthz ok",
        "hz p99 ms",
        "reconnects",
        "cpu %"
    );
    for p in &r.phases {
        println!(
            "{:<28} {:>6} {:>9.0} {:>8.2} {:>8.2} {:>10} {:>5}/{:<6} {:>10.2} {:>10} {:>8.1}",
            short(&p.binary),
            p.slow,
            p.orders_per_sec,
            p.p50_ms,
            p.p99_ms,
            p.orders_unanswered,
            p.healthz_ok,
            p.healthz_ok + p.healthz_failed,
            p.healthz_p99_ms,
            p.slow_reconnects,
            p.serve_cpu_pct
        );
    }
    println!();
    println!(
        "{:<28} {:>6} {:>6} {:>16} {:>17}",
        "binary", "polls", "joins", "scripts/request", "commands/request"
    );
    for u in &r.unknown {
        println!(
            "{:<28} {:>6} {:>6} {:>16.3} {:>17.3}",
            short(&u.binary),
            u.polls,
            u.joins,
            u.scripts_per_request,
            u.commands_per_request
        );
    }
}

fn short(path: &str) -> String {
    let n = path.chars().count();
    if n <= 28 {
        return path.to_owned();
    }
    path.chars().skip(n - 28).collect()
}
