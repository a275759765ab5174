//! `spawn_app()`: a real `flashsale serve` on port 0, against the real Redis and
//! MariaDB, isolated per test: its own database (`fs_test_<uuid>`, migrated by
//! the service's own startup code) and its own Redis key prefix. Both are
//! removed when the `TestApp` is dropped. Logs are silent unless `TEST_LOG` is set.
//!
//! `spawn_app_on(Backend::Cluster, ..)` runs the same service against a
//! 3-master Redis Cluster on ports 7000-7005 (`scripts/redis-cluster.sh`,
//! started here on first use when `.ci/run` has not started it).

use std::sync::{Once, OnceLock};
use std::time::Duration;

use clap::Parser;
use flashsale::app::App;
use flashsale::config::Limits;
use flashsale::config::RedisTarget;
use flashsale::config::WorkerConfig;
use flashsale::config::{Cli, Command, Settings};
use flashsale::sale::{Conn, Sales};
use flashsale::store::Db;
use redis::AsyncCommands;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    /// The library's view of the sales, for checks below the HTTP layer.
    pub sales: Sales,
    pub db: Db,
    /// A direct connection to the test's database (not through any proxy the app uses).
    pub mysql: sqlx::MySqlPool,
    /// The settings the service was started with.
    pub settings: Settings,
    /// A direct Redis connection (cluster-aware on the cluster backend).
    pub redis: Conn,
    pub prefix: String,
    pub backend: Backend,
    db_name: String,
    _shutdown: oneshot::Sender<()>,
}

pub fn unique(tag: &str) -> String {
    // The tail of a UUIDv7 is random (its head is the clock, shared by parallel tests).
    format!("{tag}{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

pub fn now_ms() -> i64 {
    flashsale::domain::now_ms()
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // TEST_LOG=1 logs everything at debug; TEST_LOG=<filter> (e.g. `warn`) what it selects.
        if let Ok(filter) = std::env::var("TEST_LOG") {
            let filter = if filter == "1" {
                "debug".into()
            } else {
                filter
            };
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .init();
        }
    });
}

/// Worker settings for tests: short waits, so drains and reclaims happen quickly.
pub fn fast_workers(consumer: &str) -> WorkerConfig {
    WorkerConfig {
        consumer: consumer.into(),
        block: Duration::from_millis(200),
        registry_refresh: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        ..WorkerConfig::default()
    }
}

/// Polls `check` until it holds; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Which Redis a test's service runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Single,
    /// The shared test cluster on ports 7000-7005.
    Cluster,
    /// A cluster of the test's own, on ports BASE..BASE+5 (for tests that
    /// break it); see `own_cluster`.
    OwnCluster(u16),
}

const SHARED_CLUSTER: u16 = 7000;

fn cluster_script(base: u16, action: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/redis-cluster.sh");
    let ok = std::process::Command::new("bash")
        .arg(script)
        .arg(action)
        .env("FLASHSALE_CLUSTER_BASE_PORT", base.to_string())
        .status()
        .expect("run scripts/redis-cluster.sh")
        .success();
    assert!(
        ok,
        "scripts/redis-cluster.sh {action} failed for port {base}"
    );
}

fn masters(base: u16) -> String {
    (base..base + 3)
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The shared test cluster's masters, starting the cluster on first use.
pub fn cluster_nodes() -> &'static str {
    static NODES: OnceLock<String> = OnceLock::new();
    NODES.get_or_init(|| {
        cluster_script(SHARED_CLUSTER, "start");
        masters(SHARED_CLUSTER)
    })
}

/// A cluster for one test, stopped (and its data removed) when dropped.
pub struct OwnCluster(pub u16);

impl OwnCluster {
    pub fn start(base: u16) -> Self {
        cluster_script(base, "start");
        Self(base)
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        cluster_script(self.0, "stop");
    }
}

impl Backend {
    pub fn target(self) -> RedisTarget {
        match self {
            Self::Single => RedisTarget::Single(REDIS_URL.into()),
            Self::Cluster => RedisTarget::new(REDIS_URL, Some(cluster_nodes())),
            Self::OwnCluster(base) => RedisTarget::new(REDIS_URL, Some(&masters(base))),
        }
    }

    /// Every server (for cleanup).
    fn servers(self) -> Vec<String> {
        let base = match self {
            Self::Single => return vec![REDIS_URL.into()],
            Self::Cluster => SHARED_CLUSTER,
            Self::OwnCluster(base) => base,
        };
        (base..base + 6)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// A direct connection for the test's own checks.
    pub async fn connect(self) -> Conn {
        match self.target() {
            RedisTarget::Single(url) => Conn::Direct(
                redis::Client::open(url)
                    .expect("redis url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("redis answers"),
            ),
            RedisTarget::Cluster(nodes) => Conn::Cluster(
                redis::cluster::ClusterClient::new(nodes)
                    .expect("cluster nodes")
                    .get_async_connection()
                    .await
                    .expect("cluster answers"),
            ),
        }
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Spawns the service after `tweak` adjusted its settings.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_on(Backend::Single, tweak).await
}

/// The settings a test's service starts with: `flashsale serve`'s own, as its
/// command line makes them (`AUTH=none`: identity has tests of its own, the
/// others use the body's user_id), with the test's key prefix and database,
/// no limits (tests of other things send many orders from one user and
/// address) and quick workers.
pub fn settings_for(backend: Backend, prefix: &str, db_name: &str) -> Settings {
    let mut settings = settings_from_cli(backend, prefix, db_name, &["--auth=none"]);
    settings.http.limits = Limits::unlimited();
    settings
}

/// The settings of `flashsale serve` with the test's prefix, database and
/// quick workers, and `args` (flags parsed by its real command line) in
/// place of `--auth=none`; its limits are the command line's.
pub fn settings_from_cli(backend: Backend, prefix: &str, db_name: &str, args: &[&str]) -> Settings {
    let redis = match backend {
        Backend::Single => format!("--redis-url={REDIS_URL}"),
        Backend::Cluster => format!("--redis-cluster-nodes={}", cluster_nodes()),
        Backend::OwnCluster(base) => format!("--redis-cluster-nodes={}", masters(base)),
    };
    let cli = Cli::parse_from(
        [
            "flashsale".to_owned(),
            "serve".to_owned(),
            redis,
            format!("--key-prefix={prefix}"),
            "--redis-timeout-ms=2000".to_owned(),
            "--redis-pool-size=4".to_owned(),
            format!("--database-url={MYSQL_SERVER}/{db_name}"),
            "--db-timeout-ms=5000".to_owned(),
            "--db-max-connections=4".to_owned(),
            "--listen-addr=127.0.0.1:0".to_owned(),
            format!("--admin-token={ADMIN_TOKEN}"),
        ]
        .into_iter()
        .chain(args.iter().map(|a| (*a).to_owned())),
    );
    let Command::Serve(args) = cli.command else {
        unreachable!("parsed as serve")
    };
    let mut settings = Settings::from(*args);
    // Quick workers, with what the command line said of event delivery.
    let events = settings
        .workers
        .take()
        .map(|w| w.events)
        .unwrap_or_default();
    settings.workers = Some(WorkerConfig {
        events,
        ..fast_workers("w")
    });
    settings
}

/// Spawns the service on `backend` after `tweak` adjusted its settings, and
/// waits until its database is ready.
pub async fn spawn_app_on(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let app = spawn_unready(backend, tweak).await;
    // The service creates and migrates its database in the background.
    tokio::time::timeout(Duration::from_secs(30), app.db.wait_ready())
        .await
        .expect("the service's database is ready");
    app
}

/// Spawns the service without waiting for anything but its bound port (as
/// `flashsale serve` starts, whatever Redis and MySQL are doing).
pub async fn spawn_unready(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_unready_cli(backend, &["--auth=none"], tweak).await
}

/// Spawns the service with `args` on its command line (in place of
/// `--auth=none`), after `tweak`, and waits until its database is ready.
pub async fn spawn_app_cli(args: &[&str], tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let app = spawn_unready_cli(Backend::Single, args, tweak).await;
    tokio::time::timeout(Duration::from_secs(30), app.db.wait_ready())
        .await
        .expect("the service's database is ready");
    app
}

async fn spawn_unready_cli(
    backend: Backend,
    args: &[&str],
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    init_logs();
    let prefix = unique("t");
    let db_name = unique("fs_test_");
    let mut settings = if args == ["--auth=none"] {
        settings_for(backend, &prefix, &db_name)
    } else {
        settings_from_cli(backend, &prefix, &db_name, args)
    };
    tweak(&mut settings);
    let app = tokio::time::timeout(Duration::from_secs(5), App::build(&settings))
        .await
        .expect("the service starts without waiting for its dependencies")
        .expect("app builds");
    let mut settings = settings;
    settings.http.listen_addr = app.local_addr().expect("bound");
    let addr = app.local_addr().expect("bound");
    let sales = app.sales().clone();
    let db = app.db().clone();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(app.run(async {
        let _ = rx.await;
    }));
    let redis = backend.connect().await;
    // Lazy: the database may not exist yet.
    let mysql =
        sqlx::MySqlPool::connect_lazy(&format!("{MYSQL_SERVER}/{db_name}")).expect("mysql url");
    TestApp {
        mysql,
        settings,
        base: format!("http://{addr}"),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        sales,
        db,
        redis,
        prefix,
        backend,
        db_name,
        _shutdown: tx,
    }
}

/// Another `serve` over the same sales and database (as a load balancer's
/// other instance); it runs until dropped.
pub struct Beside {
    pub base: String,
    pub db: Db,
    /// Its own view of the sales (its own memory, its own call counts).
    pub sales: Sales,
    _stop: oneshot::Sender<()>,
}

impl TestApp {
    /// Starts another `serve` with this one's settings (no workers) after
    /// `tweak`, waiting for nothing but its port, as `flashsale serve` starts.
    pub async fn serve_beside(&self, tweak: impl FnOnce(&mut Settings)) -> Beside {
        let mut settings = Settings {
            workers: None,
            ..self.settings.clone()
        };
        settings.http.listen_addr = "127.0.0.1:0".parse().expect("literal address");
        tweak(&mut settings);
        let app = tokio::time::timeout(Duration::from_secs(2), App::build(&settings))
            .await
            .expect("start-up waits for no dependency")
            .expect("builds");
        let base = format!("http://{}", app.local_addr().expect("bound"));
        let db = app.db().clone();
        let sales = app.sales().clone();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run(async {
            let _ = rx.await;
        }));
        Beside {
            base,
            db,
            sales,
            _stop: tx,
        }
    }
}

impl TestApp {
    /// Another instance with workers of its own (consumer `consumer`),
    /// after `tweak`; once its database is ready.
    pub async fn workers_beside(
        &self,
        consumer: impl Into<String>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Beside {
        let mut w = self.settings.workers.clone().expect("workers");
        w.consumer = consumer.into();
        self.serve_beside(|s| {
            s.workers = Some(w);
            tweak(s);
        })
        .await
        .ready()
        .await
    }

    /// Posts `body` to `base`'s `/api/payments/notifications` as a payment
    /// side does: signed with `secret` (Standard Webhooks) under
    /// `webhook_id`, dated now.
    pub async fn send_signed(
        &self,
        base: &str,
        secret: &str,
        webhook_id: &str,
        body: &str,
    ) -> reqwest::Result<Response> {
        let secret = flashsale::domain::webhook::Secret::parse(secret).expect("a secret");
        let ts = now_ms() / 1000;
        self.client
            .post(format!("{base}/api/payments/notifications"))
            .header("content-type", "application/json")
            .header("webhook-id", webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                secret.sign(webhook_id, ts, body.as_bytes()),
            )
            .body(body.to_owned())
            .send()
            .await
    }
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

impl Beside {
    /// Once its database is ready.
    pub async fn ready(self) -> Self {
        tokio::time::timeout(Duration::from_secs(30), self.db.wait_ready())
            .await
            .expect("its database is ready");
        self
    }
}

impl Drop for TestApp {
    /// Removes the test's database and Redis keys, on a thread of its own
    /// since Drop cannot await, and never for long: a lock held by a
    /// connection of this (now blocked) runtime must not hang the test. A
    /// failed test keeps its data for inspection; `.ci/run` sweeps leftovers.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kept for inspection: database {}, redis keys {}:*",
                self.db_name, self.prefix
            );
            return;
        }
        let (db, prefix) = (self.db_name.clone(), self.prefix.clone());
        let servers = self.backend.servers();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Key by key: on a cluster each key is deleted on its own master
            // (replicas refuse, harmlessly).
            for server in servers {
                if let Ok(client) = redis::Client::open(server)
                    && let Ok(mut conn) = client.get_connection()
                {
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(format!("{prefix}:*"))
                        .query(&mut conn)
                        .unwrap_or_default();
                    for key in keys {
                        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut conn);
                    }
                }
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    use sqlx::Connection;
                    if let Ok(mut c) = sqlx::MySqlConnection::connect(MYSQL_SERVER).await {
                        let _ = sqlx::query("SET SESSION lock_wait_timeout = 5")
                            .execute(&mut c)
                            .await;
                        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
                            .execute(&mut c)
                            .await;
                    }
                });
            }
            let _ = done.send(());
        });
        let _ = finished.recv_timeout(Duration::from_secs(10));
    }
}

/// A product body with an open window around now; override fields with `extra`.
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

impl TestApp {
    /// A handle to the service's Redis itself (its nodes, its slots).
    pub fn redis_below(&self) -> flashsale::sale::Redis {
        flashsale::sale::Redis::from_settings(&self.settings.redis).expect("redis handle")
    }

    /// The test's database (on the shared server, unless re-pointed).
    pub fn db_name(&self) -> &str {
        &self.db_name
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn create_product(&self, body: &Value) -> Response {
        self.client
            .post(self.url("/api/admin/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn open_sale(&self, product_id: &str) -> Response {
        self.client
            .post(self.url(&format!("/api/admin/products/{product_id}/open")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("request sent")
    }

    /// Closes the sale now, as an operator does (the admin API).
    pub async fn close_sale(&self, product_id: &str) {
        let resp = self
            .client
            .post(self.url(&format!("/api/admin/products/{product_id}/close")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("request sent");
        assert_eq!(resp.status(), StatusCode::OK, "closing {product_id}");
    }

    /// Workers (named `consumer`) that retire an ended sale as soon as it
    /// settled, and delete its keys `grace` after.
    pub fn retiring_workers(&self, consumer: &str, grace: Duration) -> flashsale::worker::Workers {
        let mut cfg = fast_workers(consumer);
        cfg.retire = flashsale::config::RetireSettings {
            after: Duration::ZERO,
            grace,
            batch: 500,
            pace: Duration::ZERO,
        };
        flashsale::worker::Workers::new(&self.sales, &self.db, cfg)
    }

    /// Creates and opens a sale with a window around now; returns its id.
    pub async fn new_sale(&self, stock: u64, limit: u64) -> String {
        let id = unique("sku-");
        self.sale_from(product_body(&id, stock, limit)).await
    }

    /// Creates and opens a sale from a full product body; returns its id.
    pub async fn sale_from(&self, body: Value) -> String {
        let id = body["product_id"].as_str().expect("product_id").to_owned();
        assert_eq!(
            self.create_product(&body).await.status(),
            StatusCode::CREATED
        );
        assert_eq!(self.open_sale(&id).await.status(), StatusCode::OK);
        id
    }

    pub async fn place_order(&self, user_id: u64, product_id: &str, quantity: u64) -> Response {
        self.post_order(
            &json!({"user_id": user_id, "product_id": product_id, "quantity": quantity}),
            None,
        )
        .await
    }

    pub async fn post_order(&self, body: &Value, idempotency_key: Option<&str>) -> Response {
        let mut req = self.client.post(self.url("/api/orders")).json(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.expect("request sent")
    }

    /// One order of one unit from each of `users`, each answered 202.
    pub async fn accept_orders(&self, product_id: &str, users: std::ops::RangeInclusive<u64>) {
        for user in users {
            assert_eq!(
                self.place_order(user, product_id, 1).await.status(),
                StatusCode::ACCEPTED
            );
        }
    }

    /// One unit for `user_id`, under an Idempotency-Key, retried while the
    /// answer is a 503 (as clients do: with WAIT on, a busy replica may not
    /// confirm in time); panics unless it ends in a 202. The order's JSON.
    pub async fn order_until_accepted(&self, user_id: u64, product_id: &str) -> Value {
        let body = json!({"user_id": user_id, "product_id": product_id, "quantity": 1});
        let key = format!("until-accepted-{user_id}");
        for _ in 0..50 {
            let resp = self.post_order(&body, Some(&key)).await;
            match resp.status() {
                StatusCode::ACCEPTED => return resp.json().await.expect("an order"),
                StatusCode::SERVICE_UNAVAILABLE => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!(
                    "order of user {user_id} answered {other}: {}",
                    resp.text().await.unwrap_or_default()
                ),
            }
        }
        panic!("order of user {user_id} never accepted")
    }

    /// `POST /api/orders/{order_id}/cancel` as `user_id`.
    pub async fn cancel(&self, order_id: &str, user_id: u64) -> Response {
        self.client
            .post(self.url(&format!("/api/orders/{order_id}/cancel")))
            .json(&json!({"user_id": user_id}))
            .send()
            .await
            .expect("request sent")
    }

    pub fn key(&self, product_id: &str, name: &str) -> String {
        format!("{}:{{{product_id}}}:{name}", self.prefix)
    }

    /// The sale's stock as Redis holds it.
    pub async fn stock(&self, product_id: &str) -> Option<i64> {
        let mut r = self.redis.clone();
        r.get(self.key(product_id, "stock"))
            .await
            .expect("redis GET")
    }

    /// Entries in the sale's stream.
    pub async fn stream_len(&self, product_id: &str) -> u64 {
        let mut r = self.redis.clone();
        r.xlen(self.key(product_id, "orders"))
            .await
            .expect("redis XLEN")
    }

    /// Units Redis has recorded for one user.
    pub async fn bought(&self, product_id: &str, user_id: u64) -> i64 {
        let mut r = self.redis.clone();
        let v: Option<i64> = r
            .hget(self.key(product_id, "bought"), user_id)
            .await
            .expect("redis HGET");
        v.unwrap_or(0)
    }
}

/// Status and `error` code of an answer, consuming it.
/// Asserts a refusal: its status and the `error` code of its body.
pub async fn assert_refused(resp: Response, status: StatusCode, code: &str) {
    let (got, got_code) = status_code(resp).await;
    assert_eq!((got, got_code.as_str()), (status, code));
}

pub async fn status_code(resp: Response) -> (StatusCode, String) {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (status, body["error"].as_str().unwrap_or("").to_owned())
}

/// What MySQL holds for one sale.
impl TestApp {
    /// (rows, distinct order ids, units) in `tb_order` for a product.
    pub async fn persisted(&self, product_id: &str) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT COUNT(*), COUNT(DISTINCT order_id), CAST(COALESCE(SUM(quantity), 0) AS SIGNED) \
             FROM tb_order WHERE product_id = ?",
        )
        .bind(product_id)
        .fetch_one(&self.mysql)
        .await
        .expect("count orders")
    }

    /// (order id, user id, quantity) of each row of a product in `tb_order`.
    pub async fn order_rows(&self, product_id: &str) -> Vec<(String, i64, i64)> {
        sqlx::query_as("SELECT order_id, user_id, quantity FROM tb_order WHERE product_id = ?")
            .bind(product_id)
            .fetch_all(&self.mysql)
            .await
            .expect("rows of tb_order")
    }

    pub async fn available_qty(&self, product_id: &str) -> i64 {
        sqlx::query_scalar("SELECT available_qty FROM tb_product WHERE product_id = ?")
            .bind(product_id)
            .fetch_one(&self.mysql)
            .await
            .expect("product row")
    }

    /// Entries pending in the sale's consumer group.
    pub async fn pending(&self, product_id: &str) -> u64 {
        let mut r = self.redis.clone();
        let reply: redis::streams::StreamPendingReply = r
            .xpending(self.key(product_id, "orders"), flashsale::sale::keys::GROUP)
            .await
            .expect("XPENDING");
        reply.count() as u64
    }

    /// Waits until `units` units of the sale are in `tb_order` and nothing is pending.
    pub async fn drained(&self, product_id: &str, units: i64) {
        eventually(
            "the stream drained into MySQL",
            Duration::from_secs(30),
            || async {
                self.persisted(product_id).await.2 == units && self.pending(product_id).await == 0
            },
        )
        .await;
    }

    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `GET /metrics`, as text.
    /// `/metrics` as the operator scrapes it (with the admin token: every
    /// open sale, upcoming ones too).
    pub async fn metrics_text(&self) -> String {
        let resp = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        resp.expect("answered").text().await.expect("a text body")
    }

    /// `POST /api/orders/{id}/{action}` (`pay`, `cancel`) as `user`.
    pub async fn act(&self, id: &str, action: &str, user: u64) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(self.url(&format!("/api/orders/{id}/{action}")))
            .json(&json!({"user_id": user}))
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// The entries of the sale's dead letters: (id, fields).
    pub async fn dead_letters(&self, product_id: &str) -> Vec<(String, Vec<(String, String)>)> {
        redis::cmd("XRANGE")
            .arg(self.key(product_id, "dead"))
            .arg("-")
            .arg("+")
            .query_async(&mut self.redis.clone())
            .await
            .expect("XRANGE")
    }

    /// Appends to the sale's stream, by hand, an entry no worker can
    /// persist (its quantity is not a number); returns its id.
    pub async fn add_poison_entry(&self, product_id: &str) -> String {
        let order_id = format!("{product_id}:0123456789abcdef0123456789abcdef");
        self.add_entry_of_fields(product_id, &order_id, 2, "lots")
            .await
    }

    /// Appends to the sale's stream, by hand, an order in the entries' shape
    /// before one JSON field (`order_id`, `user_id`, `product_id`, ... each a
    /// field, as a deployment's streams hold them when it upgrades); returns
    /// the entry's id.
    pub async fn add_entry_of_fields(
        &self,
        product_id: &str,
        order_id: &str,
        user_id: u64,
        quantity: &str,
    ) -> String {
        let mut r = self.redis.clone();
        r.xadd(
            self.key(product_id, "orders"),
            "*",
            &[
                ("order_id", order_id.to_owned()),
                ("user_id", user_id.to_string()),
                ("product_id", product_id.to_owned()),
                ("quantity", quantity.to_owned()),
                ("price", "1".into()),
                ("created_ms", "1".into()),
                ("idempotency_key", "old-key".into()),
            ],
        )
        .await
        .expect("XADD")
    }

    /// A sale's audit, as admins get it (`{"ok", "audit"}`).
    /// `GET /api/admin/log<query>` as the operator: a page of the admin
    /// log (`entries`, newest first, and `next`).
    pub async fn admin_log_page(&self, query: &str) -> Value {
        let resp = self
            .client
            .get(self.url(&format!("/api/admin/log{query}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("a JSON page")
    }

    /// The admin log's newest page.
    pub async fn admin_log(&self) -> Value {
        self.admin_log_page("").await
    }

    pub async fn audit(&self, product_id: &str) -> Value {
        self.client
            .get(self.url(&format!("/api/admin/products/{product_id}/audit")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answered")
            .json()
            .await
            .expect("a JSON audit")
    }
}

impl TestApp {
    /// The workers' sweeper with the payment timeout at zero: every
    /// confirmed order is overdue at its next sweep.
    pub fn overdue_sweeper(&self) -> flashsale::bookkeeping::Sweeper {
        flashsale::bookkeeping::Sweeper::new(
            self.books(),
            self.sales.lifecycle().clone(),
            Duration::ZERO,
            Duration::from_secs(5),
        )
    }

    /// The books over this app's stores, as the service builds them.
    pub fn books(&self) -> flashsale::bookkeeping::OrderLife {
        flashsale::bookkeeping::OrderLife::new(
            (self.sales.accepted().clone(), self.sales.ledger().clone()),
            (self.db.orders(), self.db.payments()),
        )
    }

    /// The recovery of a sale from the books, as `flashsale recover` runs it.
    pub fn recovery(&self) -> flashsale::bookkeeping::Recovery {
        flashsale::bookkeeping::Recovery::new(
            (self.sales.ledger().clone(), self.sales.lifecycle().clone()),
            (self.db.products(), self.db.orders()),
        )
    }

    /// The audit over this app's stores, as `flashsale audit` runs it.
    pub fn audit_of(&self) -> flashsale::bookkeeping::Audit {
        flashsale::bookkeeping::Audit::new(
            self.sales.ledger().clone(),
            (self.db.products(), self.db.orders(), self.db.audits()),
        )
    }

    /// Every opened sale's state, as `flashsale sales` lists them.
    pub fn settlement(&self) -> flashsale::bookkeeping::Settlement {
        flashsale::bookkeeping::Settlement::new(
            (self.sales.lifecycle().clone(), self.sales.watch().clone()),
            (self.db.products(), self.db.orders()),
            self.audit_of(),
        )
    }

    /// Waits (10 s at most) until the audit finds `sku`'s books balanced.
    pub async fn books_balance(&self, sku: &str) {
        eventually("the books balance", Duration::from_secs(10), || async {
            self.audit(sku).await["ok"] == true
        })
        .await;
    }
}

/// The value of a series on the instance's `/metrics` (0 when absent).
pub async fn metric(app: &TestApp, base: &str, series: &str) -> f64 {
    let text = app
        .client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}
