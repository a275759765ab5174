//! The system under test, all private to this test: a Redis with an fsync'd
//! append-only file, a MariaDB on a fresh data directory, and the `flashsale`
//! processes (API-only `serve`s and `worker`s) pointed at them. Everything
//! listens on free loopback ports and lives in one scratch directory; the
//! shared Redis (6379) and MariaDB (3306) are never touched.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sqlx::Connection;
use tokio::time::Instant;

use crate::payments::PAYMENT_SECRET;
use crate::procs::{Proc, ScratchDir, Spec, free_port};
use crate::receiver::EVENT_SECRET;

/// Entries pending this long are reclaimed by another worker (`CLAIM_IDLE_MS`).
pub const CLAIM_IDLE_MS: u64 = 2000;
/// Bound on a restarted API's first `/healthz` 200.
pub const API_START_LIMIT: Duration = Duration::from_secs(10);
/// How long a restarted worker must stay alive to count as started (it has
/// no port: it would have exited by then if it refused to start).
pub const WORKER_START_GRACE: Duration = Duration::from_millis(1500);

/// This tree's binary.
pub const FLASHSALE: &str = env!("CARGO_BIN_EXE_flashsale");
/// How long a process replaced by an upgrade has to exit after its SIGTERM
/// (it answers what it holds, a worker finishes its batch).
pub const STOP_LIMIT: Duration = Duration::from_secs(30);

/// Every sale's price (a payment is price × quantity).
pub const PRICE: &str = "4999.00";

pub struct World {
    // Fields drop in order: the flashsale processes, then the stores, then
    // the directory they all write into.
    pub apis: Vec<Proc>,
    pub workers: Vec<Proc>,
    pub redis: Proc,
    pub mysql: Proc,
    pub redis_url: String,
    /// `mysql://root@127.0.0.1:<port>` (no database).
    pub mysql_server: String,
    /// The service's database on it.
    pub database_url: String,
    pub api_urls: Vec<String>,
    pub admin_token: String,
    http: reqwest::Client,
    consumer_generation: u32,
    pub dir: ScratchDir,
}

impl World {
    /// Starts the stores, then `apis` API processes (hearing payment
    /// notifications) and `workers` workers (cancelling orders unpaid for
    /// `payment_timeout`, pushing the events to `events_url`), and waits
    /// until every API is ready (Redis and MySQL answering).
    pub async fn start(
        program: &std::ffi::OsStr,
        apis: usize,
        workers: usize,
        payment_timeout: Duration,
        events_url: &str,
    ) -> Self {
        let dir = ScratchDir::new("flashsale-chaos");
        let (redis, redis_url) = start_redis(&dir.path).await;
        let (mysql, mysql_server) = start_mariadb(&dir.path).await;
        let database_url = format!("{mysql_server}/flashsale");
        // Long and random (a UUIDv7 ends in 74 random bits): `serve`
        // refuses weak admin tokens.
        let admin_token = format!(
            "{}{}",
            uuid::Uuid::now_v7().simple(),
            uuid::Uuid::now_v7().simple()
        );
        let env = flashsale_env(&redis_url, &database_url, &admin_token);

        let mut api_urls = Vec::new();
        let api_procs = (0..apis)
            .map(|i| {
                let addr = format!("127.0.0.1:{}", free_port());
                api_urls.push(format!("http://{addr}"));
                let mut spec = Spec::new(program).arg("serve");
                spec.env = env.clone();
                spec.set_env("LISTEN_ADDR", addr);
                spec.set_env("WORKERS", "false");
                spec.set_env("PAYMENT_WEBHOOK_SECRETS", PAYMENT_SECRET);
                Proc::new(&format!("api-{i}"), spec, &dir.path)
            })
            .collect();
        let worker_procs = (0..workers)
            .map(|i| {
                let mut spec = Spec::new(program).arg("worker");
                spec.env = env.clone();
                spec.set_env("CONSUMER_NAME", format!("worker-{i}-g0"));
                spec.set_env(
                    "PAYMENT_TIMEOUT_SECS",
                    payment_timeout.as_secs().to_string(),
                );
                spec.set_env("EVENT_WEBHOOK_URL", events_url);
                spec.set_env("EVENT_WEBHOOK_SECRET", EVENT_SECRET);
                // A lease of 10 s (4 × this, at least 10 s): a worker killed
                // while it delivers holds the others back that long.
                spec.set_env("EVENT_WEBHOOK_TIMEOUT_MS", "2000");
                Proc::new(&format!("worker-{i}"), spec, &dir.path)
            })
            .collect();
        let mut world = Self {
            apis: api_procs,
            workers: worker_procs,
            redis,
            mysql,
            redis_url,
            mysql_server,
            database_url,
            api_urls,
            admin_token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .expect("http client"),
            consumer_generation: 0,
            dir,
        };
        for p in world.apis.iter_mut().chain(world.workers.iter_mut()) {
            p.start();
        }
        for i in 0..apis {
            let url = format!("{}/readyz", world.api_urls[i]);
            let http = world.http.clone();
            let ready = poll(Duration::from_secs(60), || answers_200(&http, &url)).await;
            assert!(
                ready,
                "{} not ready within 60 s:\n{}",
                world.apis[i].name,
                world.apis[i].log_tail(30)
            );
        }
        world
    }

    /// Every log of a flashsale process.
    pub fn flashsale_logs(&self) -> Vec<&Path> {
        self.apis
            .iter()
            .chain(&self.workers)
            .map(|p| p.log.as_path())
            .collect()
    }

    /// Every process's log, for the failure message.
    pub fn all_logs(&self) -> Vec<&Path> {
        let mut logs = self.flashsale_logs();
        logs.push(&self.redis.log);
        logs.push(&self.mysql.log);
        logs
    }

    /// An admin API's JSON answer to a GET, or why there is none.
    pub async fn admin_get(&self, url: &str) -> Result<serde_json::Value, String> {
        let resp = self
            .http
            .get(url)
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
    }

    /// Creates and opens a sale through the admin API. With `room`, a waiting room whose pace outruns the crowd (500
    /// buyers a second) and whose admissions outlast the run.
    pub async fn open_sale(
        &self,
        product_id: &str,
        stock: u64,
        limit_per_user: u64,
        (shards, room): (u16, bool),
    ) {
        let now = flashsale::domain::now_ms();
        let mut body = json!({
            "product_id": product_id,
            "title": "Chaos phone",
            "price": PRICE,
            "available_qty": stock,
            "start_time": now - 60_000,
            "end_time": now + 3_600_000,
            "limit_per_user": limit_per_user,
            "stock_shards": shards,
        });
        if room {
            body["waiting_room"] = json!({"ceiling_per_sec": 500, "admission_secs": 1800});
        }
        let base = &self.api_urls[0];
        let created = self
            .http
            .post(format!("{base}/api/admin/products"))
            .bearer_auth(&self.admin_token)
            .json(&body)
            .send()
            .await
            .expect("create the product");
        assert_eq!(created.status(), 201, "create {product_id}");
        let opened = self
            .http
            .post(format!("{base}/api/admin/products/{product_id}/open"))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .expect("open the sale");
        assert_eq!(opened.status(), 200, "open {product_id}");
        // The other APIs find a sale opened through this one within their
        // registry read's lifetime (UNKNOWN_PRODUCT_CACHE_MS, 1 s): until
        // then they answer `product_not_found`, which this test counts as a
        // wrong answer. Operators open sales before their start for the same reason.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }

    /// kill -9 an API and start it again on the same port; Ok(how long until
    /// its `/healthz` answered), Err(why it did not start).
    pub async fn restart_api(&mut self, i: usize) -> Result<Duration, String> {
        self.apis[i].restart();
        self.await_api(i, API_START_LIMIT).await
    }

    /// Waits for an API's `/healthz` (liveness, not readiness: a dependency
    /// may be down on purpose).
    pub async fn await_api(&mut self, i: usize, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        let url = format!("{}/healthz", self.api_urls[i]);
        while started.elapsed() < limit {
            if let Some(status) = self.apis[i].reap() {
                return Err(exited_at_start(&self.apis[i], status));
            }
            if answers_200(&self.http, &url).await {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "{} gave no /healthz 200 within {limit:?}; log tail:\n{}",
            self.apis[i].name,
            self.apis[i].log_tail(20)
        ))
    }

    /// Replaces a process by one of `program`, as a rolling upgrade does: an
    /// API is taken out of service first (`apis`: no new request reaches
    /// it), then each gets SIGTERM and must exit within [`STOP_LIMIT`]
    /// (exit 0), and its replacement starts with the same settings; an API
    /// goes back into service once its `/readyz` answers 200. Ok(what
    /// happened), Err(why it went wrong).
    pub async fn replace(
        &mut self,
        role: Role,
        i: usize,
        program: &std::ffi::OsStr,
        apis: &crate::load::Apis,
    ) -> Result<String, String> {
        let started = Instant::now();
        if role == Role::Api {
            apis.set_serving(i, false);
            // What was sent before it left the rotation is answered by it.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let proc = match role {
            Role::Api => &mut self.apis[i],
            Role::Worker => &mut self.workers[i],
        };
        let name = proc.name.clone();
        proc.signal("TERM");
        let mut status = None;
        while started.elapsed() < STOP_LIMIT {
            status = proc.reap();
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Some(status) = status else {
            proc.kill9();
            return Err(format!(
                "{name} still running {STOP_LIMIT:?} after its SIGTERM"
            ));
        };
        let stopped = started.elapsed();
        if !status.success() {
            return Err(format!(
                "{name} exited {status} after its SIGTERM; log tail:\n{}",
                proc.log_tail(20)
            ));
        }
        let from = proc.spec.program.clone();
        proc.spec.program = program.to_owned();
        proc.start();
        let ready = match role {
            Role::Api => {
                let url = format!("{}/readyz", self.api_urls[i]);
                let http = self.http.clone();
                let ready = poll(Duration::from_secs(60), || answers_200(&http, &url)).await;
                if !ready {
                    return Err(format!(
                        "{name} not ready within 60 s of its start; log tail:\n{}",
                        self.apis[i].log_tail(20)
                    ));
                }
                apis.set_serving(i, true);
                started.elapsed()
            }
            Role::Worker => {
                self.await_worker(i).await?;
                started.elapsed()
            }
        };
        Ok(format!(
            "{name}: {} -> {}, exited {stopped:.1?} after its SIGTERM, {} {ready:.1?} after",
            release_of(&from),
            release_of(program),
            if role == Role::Api {
                "ready"
            } else {
                "running"
            }
        ))
    }

    /// kill -9 a worker and start it again, under a new consumer name when
    /// `new_name` (its pending entries then wait for a reclaim). Returns the
    /// consumer name it runs under.
    pub fn restart_worker(&mut self, i: usize, new_name: bool) -> String {
        if new_name {
            self.consumer_generation += 1;
            let name = format!("worker-{i}-g{}", self.consumer_generation);
            self.workers[i].spec.set_env("CONSUMER_NAME", name);
        }
        self.workers[i].restart();
        self.consumer_name(i)
    }

    pub fn consumer_name(&self, i: usize) -> String {
        let env = &self.workers[i].spec.env;
        env.iter()
            .find(|(k, _)| k == "CONSUMER_NAME")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// Err(why) if a worker started less than a moment ago has exited.
    pub async fn await_worker(&mut self, i: usize) -> Result<(), String> {
        tokio::time::sleep(WORKER_START_GRACE).await;
        match self.workers[i].reap() {
            Some(status) => Err(exited_at_start(&self.workers[i], status)),
            None => Ok(()),
        }
    }

    /// Once the faults stop, every API must find its way back to both stores
    /// (its database migrated, `/readyz` 200) within `limit`; one failure
    /// per API that does not.
    pub async fn await_ready(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut failures = Vec::new();
        for (i, base) in self.api_urls.iter().enumerate() {
            let url = format!("{base}/readyz");
            let left = deadline.saturating_duration_since(Instant::now());
            if !poll(left, || answers_200(&self.http, &url)).await {
                failures.push(format!(
                    "{} not ready (/readyz) {limit:?} after the faults stopped; log tail:\n{}",
                    self.apis[i].name,
                    self.apis[i].log_tail(20)
                ));
            }
        }
        failures
    }

    pub async fn redis_up(&self, limit: Duration) -> bool {
        poll(limit, || redis_answers(&self.redis_url)).await
    }

    pub async fn mysql_up(&self, limit: Duration) -> bool {
        poll(limit, || mysql_answers(&self.mysql_server)).await
    }

    /// Restarts any process that died on its own (each one a failure: only
    /// the faults kill, and they restart what they kill), then makes sure
    /// both stores answer and every API is alive. Returns the failures.
    pub async fn ensure_up(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        if let Some(status) = self.redis.reap() {
            failures.push(format!("redis died on its own ({status})"));
            self.redis.start();
        }
        if let Some(status) = self.mysql.reap() {
            failures.push(format!("mariadb died on its own ({status})"));
            self.mysql.start();
        }
        if !self.redis_up(Duration::from_secs(10)).await {
            failures.push("redis does not answer".into());
        }
        if !self.mysql_up(Duration::from_secs(30)).await {
            failures.push("mariadb does not answer".into());
        }
        for p in self.apis.iter_mut().chain(self.workers.iter_mut()) {
            if let Some(status) = p.reap() {
                failures.push(format!(
                    "{} exited on its own ({status}); log tail:\n{}",
                    p.name,
                    p.log_tail(20)
                ));
            }
            // Also those a fault found dead at start (and reported).
            if !p.running() {
                p.start();
            }
        }
        for i in 0..self.apis.len() {
            if let Err(e) = self.await_api(i, API_START_LIMIT).await {
                failures.push(e);
            }
        }
        failures
    }
}

/// The buyers' tokens are signed with this (the load mints them).
pub const JWT_SECRET: &str = "chaos-jwt-secret-0123456789abcdef0123456789";

/// The environment every flashsale process gets: the private stores, short
/// timeouts (a fault gives a fast 503, not a hang), fast reclaims, small
/// batches (more commits, so more of them are cut by a kill), no rate limits
/// (all load comes from one address), JSON logs, and no backtraces (an
/// error exit then ends its log with its one-line cause).
fn flashsale_env(redis_url: &str, database_url: &str, token: &str) -> Vec<(String, String)> {
    [
        ("REDIS_URL", redis_url),
        ("DATABASE_URL", database_url),
        ("ADMIN_TOKEN", token),
        ("JWT_SECRET", JWT_SECRET),
        ("RATE_LIMITS", "false"),
        ("REDIS_TIMEOUT_MS", "500"),
        ("DB_TIMEOUT_MS", "1000"),
        ("DB_MAX_CONNECTIONS", "4"),
        ("REQUEST_TIMEOUT_MS", "2000"),
        ("CLAIM_IDLE_MS", &CLAIM_IDLE_MS.to_string()),
        ("BLOCK_MS", "200"),
        ("BATCH_SIZE", "20"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "info"),
        ("RUST_BACKTRACE", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// A Redis that fsyncs every write to its append-only file before answering,
/// so a restart reloads every order that was ever acknowledged.
async fn start_redis(dir: &Path) -> (Proc, String) {
    let port = free_port();
    let data = dir.join("redis");
    std::fs::create_dir_all(&data).expect("redis dir");
    let spec = Spec::new("redis-server")
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--dir")
        .arg(&data)
        .arg("--appendonly")
        .arg("yes")
        .arg("--appendfsync")
        .arg("always")
        .arg("--save")
        .arg("");
    let mut redis = Proc::new("redis", spec, dir);
    redis.start();
    let url = format!("redis://127.0.0.1:{port}");
    assert!(
        poll(Duration::from_secs(10), || redis_answers(&url)).await,
        "the test's redis does not answer:\n{}",
        redis.log_tail(20)
    );
    (redis, url)
}

/// A MariaDB on a fresh data directory. `--no-defaults` everywhere: the
/// machine's my.cnf sets a user and log paths of the system server. Small
/// buffers so it starts (and recovers after a kill) in well under a second;
/// `innodb_flush_log_at_trx_commit` stays 1: a commit the workers saw must
/// survive a kill -9.
async fn start_mariadb(dir: &Path) -> (Proc, String) {
    let data = dir.join("mariadb");
    let small = ["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"];
    let install = tokio::process::Command::new("mariadb-install-db")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args([
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .args(small)
        .output()
        .await
        .expect("mariadb-install-db runs");
    assert!(
        install.status.success(),
        "mariadb-install-db failed:\n{}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    let port = free_port();
    let mut spec = Spec::new("/usr/sbin/mariadbd")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .arg("--user=root")
        .arg("--skip-name-resolve")
        .arg("--max-connections=200");
    for s in small {
        spec = spec.arg(s);
    }
    let mut mysql = Proc::new("mariadb", spec, dir);
    mysql.start();
    let server = format!("mysql://root@127.0.0.1:{port}");
    assert!(
        poll(Duration::from_secs(30), || mysql_answers(&server)).await,
        "the test's mariadb does not answer:\n{}",
        mysql.log_tail(30)
    );
    (mysql, server)
}

fn exited_at_start(p: &Proc, status: std::process::ExitStatus) -> String {
    format!(
        "{} exited at start ({status}); log tail:\n{}",
        p.name,
        p.log_tail(20)
    )
}

/// Polls `check` every 100 ms until it holds (true) or `limit` passes (false).
pub async fn poll<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn answers_200(http: &reqwest::Client, url: &str) -> bool {
    http.get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().as_u16() == 200)
}

async fn redis_answers(url: &str) -> bool {
    let ping = async {
        let client = redis::Client::open(url).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ping).await,
        Ok(Some(_))
    )
}

async fn mysql_answers(server: &str) -> bool {
    let select = async {
        let mut conn = sqlx::MySqlConnection::connect(server).await.ok()?;
        sqlx::query("SELECT 1").execute(&mut conn).await.ok()?;
        let _ = conn.close().await;
        Some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), select).await,
        Ok(Some(()))
    )
}

/// An API or a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Api,
    Worker,
}

/// What `<program> --version` says, after the name.
pub fn release_of(program: &std::ffi::OsStr) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .and_then(|v| v.strip_prefix("flashsale ").map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
