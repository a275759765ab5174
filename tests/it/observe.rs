//! Operability: the metrics, the stream inspection, the persistence check.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, eventually, eventually_some, now_ms, product_body, spawn_app, spawn_app_with, unique,
};

/// The value of the sample `series` (name and labels, as exposed).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{series} is not a number"))
}

#[tokio::test]
async fn metrics_after_a_small_sale_count_what_happened() {
    let app = spawn_app_with(|s| {
        s.http.limits = flashsale::config::Limits {
            user_rate: flashsale::config::RateLimit::new(100, 100),
            ..flashsale::config::Limits::default()
        };
    })
    .await;
    let sku = app.new_sale(3, 1).await;
    for user in 1..=4 {
        app.place_order(user, &sku, 1).await;
    }
    let resp = app
        .post_order(
            &json!({"user_id": 9, "product_id": sku, "quantity": 0}),
            None,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // The rate limits' tables, before the first sweep (10 s after start) may
    // evict idle clients: users 1-4 (the invalid order was refused before its
    // user was counted) and one address.
    let early = app.client.get(app.url("/metrics")).send().await.unwrap();
    let early = early.text().await.unwrap();
    assert_eq!(
        sample(&early, "flashsale_rate_limit_keys{limit=\"user\"}"),
        4.0
    );
    assert_eq!(
        sample(&early, "flashsale_rate_limit_keys{limit=\"ip\"}"),
        1.0
    );
    eventually("3 orders persisted", Duration::from_secs(10), || async {
        app.persisted(&sku).await.0 == 3
    })
    .await;

    let resp = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    small_sale_counted(&resp.text().await.unwrap(), &sku);
}

/// What `/metrics` (`text`) counts once the sale `sku` of 3 units took 4
/// orders and an invalid one and persisted 3.
fn small_sale_counted(text: &str, sku: &str) {
    let outcome = |o: &str, by: &str| {
        sample(
            text,
            &format!("flashsale_order_requests_total{{answered_by=\"{by}\",outcome=\"{o}\"}}"),
        )
    };
    assert_eq!(outcome("accepted", "redis"), 3.0);
    assert_eq!(outcome("sold_out", "redis"), 1.0);
    assert_eq!(outcome("invalid_request", "service"), 1.0);
    for (series, value) in [
        (
            r#"flashsale_order_path_redis_calls_total{call="place_order"}"#,
            4.0,
        ),
        (
            r#"flashsale_order_latency_seconds_count{class="accepted"}"#,
            3.0,
        ),
        ("flashsale_rows_persisted_total", 3.0),
        ("flashsale_batch_size_sum", 3.0),
        ("flashsale_accept_to_persist_seconds_count", 3.0),
        ("flashsale_dead_letters_total", 0.0),
    ] {
        assert_eq!(sample(text, series), value, "{series}");
    }
    let sale = |name: &str| sample(text, &format!("flashsale_{name}{{product_id=\"{sku}\"}}"));
    assert_eq!(sale("sale_stock"), 0.0);
    assert_eq!(sale("stream_length"), 3.0);
    assert_eq!(sale("group_pending"), 0.0);
    assert_eq!(sale("group_lag"), 0.0);
    assert_eq!(sale("sale_dead_letters"), 0.0);
    assert!(!text.contains("user_id"), "no user ids in labels");
    assert_eq!(sample(text, "flashsale_orders_in_flight"), 0.0);
}

/// Reads `count` entries of `stream` as `consumer` of the workers' group,
/// and never acks them.
async fn read_as(app: &TestApp, stream: &str, consumer: &str, count: usize) {
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("persist")
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
}

/// `flashsale streams --product <sku>` (with `--json` when `json`): its output.
fn flashsale_streams(app: &TestApp, sku: &str, json: bool) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"));
    cmd.args(["streams", "--product", sku])
        .env("REDIS_URL", crate::helpers::REDIS_URL)
        .env("REDIS_KEY_PREFIX", &app.prefix);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("flashsale streams runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn streams_reports_pending_entries_as_xpending_does() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    // A consumer that reads two entries and never acks them.
    let stream = app.key(&sku, "orders");
    let mut r = app.redis.clone();
    read_as(&app, &stream, "ghost", 2).await;
    let (count, _, _, per_consumer): (u64, String, String, Vec<(String, String)>) =
        redis::cmd("XPENDING")
            .arg(&stream)
            .arg("persist")
            .query_async(&mut r)
            .await
            .unwrap();
    assert_eq!(count, 2);

    let run = |json: bool| flashsale_streams(&app, &sku, json);
    let reports: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let report = &reports[0];
    assert_eq!(report["product_id"], sku.as_str());
    assert_eq!(report["stream_length"], 3);
    assert_eq!(report["stock"], 7);
    assert_eq!(report["pending"], count);
    assert_eq!(report["lag"], 1);
    let consumers = report["consumers"].as_array().unwrap();
    for (name, pending) in &per_consumer {
        let c = consumers
            .iter()
            .find(|c| c["name"] == name.as_str())
            .unwrap();
        assert_eq!(c["pending"].to_string(), *pending);
    }
    let pending = report["pending_entries"].as_array().unwrap();
    assert_eq!(pending.len() as u64, count);
    assert!(
        pending
            .iter()
            .all(|p| p["consumer"] == "ghost" && p["deliveries"] == 1)
    );
    assert_eq!(report["dead_letters"], 0);

    let table = run(false);
    assert!(table.contains(&format!("sale {sku}")), "{table}");
    assert!(table.contains("ghost"), "{table}");
    assert!(table.contains("pending 2"), "{table}");
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A `flashsale` process with JSON logs on a piped stderr and a database of
/// its own, which `stop` drops.
struct Flashsale {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    db: String,
}

impl Flashsale {
    fn spawn(command: &str, env: &[(&str, &str)]) -> Self {
        let db = crate::helpers::unique("fs_test_");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .arg(command)
            .env(
                "DATABASE_URL",
                format!("{}/{db}", crate::helpers::MYSQL_SERVER),
            )
            .env("LOG_FORMAT", "json")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("flashsale starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
        Self { child, lines, db }
    }

    /// The JSON log lines written within `window` from now.
    async fn lines_within(&mut self, window: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(window, async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                if let Ok(json) = serde_json::from_str::<Value>(&line) {
                    out.push(json);
                }
            }
        })
        .await;
        out
    }

    /// The first JSON log line that `wanted` accepts (within 30 s).
    async fn log_line(&mut self, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        let lines = &mut self.lines;
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(json) = serde_json::from_str::<Value>(&line)
                    && wanted(&json)
                {
                    return Some(json);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no log line: {what}"))
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let pool = sqlx::MySqlPool::connect(crate::helpers::MYSQL_SERVER)
            .await
            .unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS `{}`", self.db))
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// A Redis of the test's own on a free loopback port, stopped when dropped.
struct OwnRedis {
    port: u16,
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl OwnRedis {
    async fn start(args: &[&str]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(crate::helpers::unique("fs-redis-"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = std::process::Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let url = format!("redis://127.0.0.1:{port}");
        eventually("the test's redis answers", Duration::from_secs(10), || {
            let url = url.clone();
            async move {
                let Ok(client) = redis::Client::open(url) else {
                    return false;
                };
                match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        Self { port, child, dir }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn risks_of(port: u16) -> Vec<String> {
    let redis = flashsale::sale::Redis::new(
        &flashsale::config::RedisTarget::Single(format!("redis://127.0.0.1:{port}")),
        Duration::from_secs(2),
        1,
    )
    .unwrap();
    flashsale::sale::durability::persistence_risks(&redis)
        .await
        .unwrap()
}

#[tokio::test]
async fn redis_persistence_is_checked() {
    let volatile = OwnRedis::start(&["--appendonly", "no"]).await;
    let risks = risks_of(volatile.port).await;
    assert_eq!(risks.len(), 1, "{risks:?}");
    assert!(risks[0].contains("appendonly no"), "{risks:?}");

    let lax = OwnRedis::start(&["--appendonly", "yes", "--appendfsync", "no"]).await;
    let risks = risks_of(lax.port).await;
    assert!(
        risks.len() == 1 && risks[0].contains("appendfsync no"),
        "{risks:?}"
    );

    let durable = OwnRedis::start(&["--appendonly", "yes", "--appendfsync", "everysec"]).await;
    assert!(risks_of(durable.port).await.is_empty());
}

#[tokio::test]
async fn a_worker_on_a_redis_without_aof_warns_at_start() {
    let volatile = OwnRedis::start(&["--appendonly", "no"]).await;
    let redis_url = format!("redis://127.0.0.1:{}", volatile.port);
    let mut worker = Flashsale::spawn("worker", &[("REDIS_URL", &redis_url), ("RUST_LOG", "warn")]);
    let json = worker
        .log_line("the warning", |l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("append-only file"))
        })
        .await;
    assert_eq!(json["level"], "WARN");
    worker.stop().await;
}

#[tokio::test]
async fn the_persistence_check_and_streams_work_on_a_cluster() {
    let app =
        crate::helpers::spawn_app_on(crate::helpers::Backend::Cluster, |s| s.workers = None).await;
    // The test cluster runs without AOF, like the local server.
    let risks = flashsale::sale::durability::persistence_risks(&app.redis_below())
        .await
        .expect("CONFIG GET answers on a cluster");
    assert!(
        risks.iter().any(|r| r.contains("appendonly no")),
        "{risks:?}"
    );

    let sku = app.new_sale(5, 1).await;
    app.place_order(1, &sku, 1).await;
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let view = app.sales.watch().view(&product).await.unwrap();
    assert_eq!((view.stream_length, view.stock), (1, Some(4)));
    assert_eq!((view.has_group, view.lag), (true, Some(1)));
}

#[tokio::test]
async fn serve_without_an_identity_configuration_exits_saying_how_to_set_one() {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("serve")
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .env("ADMIN_ROUTES", "false")
        .env("RUST_LOG", "error")
        .env("RUST_BACKTRACE", "0")
        .env_remove("AUTH")
        .env_remove("JWT_SECRET")
        .env_remove("JWT_PUBLIC_KEY_FILE")
        .env_remove("JWT_JWKS_FILE")
        .env_remove("AUTH_USER_HEADER")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("exits at once")
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for says in ["no buyer identity configured", "JWT_SECRET", "AUTH=none"] {
        assert!(stderr.contains(says), "says {says:?}: {stderr}");
    }
}

#[tokio::test]
async fn at_debug_each_request_logs_one_json_line_with_its_span() {
    let port = free_port();
    let (listen, prefix) = (format!("127.0.0.1:{port}"), crate::helpers::unique("t"));
    let mut serve = Flashsale::spawn(
        "serve",
        &[
            ("LISTEN_ADDR", &listen),
            ("REDIS_KEY_PREFIX", &prefix),
            ("ADMIN_ROUTES", "false"),
            ("WORKERS", "false"),
            ("AUTH", "none"),
            ("RUST_LOG", "warn,flashsale::http=debug"),
        ],
    );
    // Running without identity is said loudly, once, at start.
    let warning = serve
        .log_line("the AUTH=none warning", |l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("AUTH=none"))
        })
        .await;
    assert_eq!(warning["level"], "WARN");
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/api/orders/no-such-order");
    eventually("serve answers", Duration::from_secs(30), || {
        let (client, url) = (client.clone(), url.clone());
        async move { client.get(url).send().await.is_ok() }
    })
    .await;
    let line = serve
        .log_line("a request line", |l| l["fields"]["message"] == "request")
        .await;
    assert_eq!(line["level"], "DEBUG");
    assert_eq!(line["fields"]["status"], 404);
    assert!(line["fields"]["latency_us"].is_u64());
    assert_eq!(line["span"]["name"], "request");
    assert_eq!(line["span"]["method"], "GET");
    assert_eq!(line["span"]["path"], "/api/orders/no-such-order");
    serve.stop().await;
}

/// The text at `url`, scraped (with `token` when given).
async fn scrape(app: &TestApp, url: &str, token: Option<&str>) -> reqwest::Result<String> {
    let mut req = app.client.get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await?.text().await
}

/// The API's port is public: its anonymous `/metrics` names a sale once it
/// has started, never before (an upcoming sale's id, stock and start are
/// not told to whoever scrapes); a scrape with the admin token, and the
/// worker's own listener, show it.
#[tokio::test]
async fn the_public_metrics_name_no_sale_before_it_starts() {
    let app = spawn_app().await;
    let live = app.new_sale(5, 1).await;
    let upcoming = unique("sku-");
    let mut body = product_body(&upcoming, 7, 1);
    body["start_time"] = json!(now_ms() + 3_600_000);
    body["end_time"] = json!(now_ms() + 7_200_000);
    app.sale_from(body).await;
    // The workers judge every open sale's books, the upcoming one's too:
    // their gauges must not name it either.
    let judged = format!("flashsale_sale_books_balanced{{product_id=\"{upcoming}\"}}");
    eventually(
        "the workers judged the upcoming sale's books",
        Duration::from_secs(30),
        || async { app.metrics_text().await.contains(&judged) },
    )
    .await;
    let public = scrape(&app, &app.url("/metrics"), None)
        .await
        .expect("scraped");
    assert!(
        public.contains(&format!("flashsale_sale_stock{{product_id=\"{live}\"}} 5")),
        "the live sale is shown"
    );
    assert!(!public.contains(&upcoming), "the upcoming sale is named");
    // With the admin token, the operator's scrape: named.
    assert!(app.metrics_text().await.contains(&format!(
        "flashsale_sale_stock{{product_id=\"{upcoming}\"}} 7"
    )));
    let wrong = scrape(
        &app,
        &app.url("/metrics"),
        Some("not-the-admin-token-0123456789"),
    )
    .await
    .expect("scraped");
    assert!(!wrong.contains(&upcoming), "a wrong token sees it");

    let port = free_port();
    let _worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("worker")
        .env("REDIS_URL", crate::helpers::REDIS_URL)
        .env("REDIS_KEY_PREFIX", &app.prefix)
        .env("DATABASE_URL", &app.settings.db.url)
        .env("CONSUMER_NAME", "private")
        .env("METRICS_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()
        .expect("flashsale worker starts");
    let private = format!("http://127.0.0.1:{port}/metrics");
    eventually(
        "the private listener shows the upcoming sale",
        Duration::from_secs(20),
        || async {
            let text = scrape(&app, &private, None).await;
            text.unwrap_or_default().contains(&format!(
                "flashsale_sale_stock{{product_id=\"{upcoming}\"}} 7"
            ))
        },
    )
    .await;
}

#[tokio::test]
async fn a_worker_process_exports_its_metrics_on_metrics_addr() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(5, 1).await;
    for user in 1..=2 {
        app.place_order(user, &sku, 1).await;
    }
    let port = free_port();
    let _worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("worker")
        .env("REDIS_URL", crate::helpers::REDIS_URL)
        .env("REDIS_KEY_PREFIX", &app.prefix)
        .env("DATABASE_URL", &app.settings.db.url)
        .env("CONSUMER_NAME", "external")
        .env("BLOCK_MS", "200")
        .env("METRICS_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()
        .expect("flashsale worker starts");
    eventually(
        "the worker persisted both orders",
        Duration::from_secs(30),
        || async { app.persisted(&sku).await.0 == 2 },
    )
    .await;
    let scrape = || async {
        app.client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .expect("the worker's metrics listener answers")
            .text()
            .await
            .unwrap()
    };
    // The rows are counted once acked, a moment after their commit.
    eventually("both rows counted", Duration::from_secs(10), || async {
        sample(&scrape().await, "flashsale_rows_persisted_total") == 2.0
    })
    .await;
    let text = scrape().await;
    assert_eq!(
        sample(&text, "flashsale_accept_to_persist_seconds_count"),
        2.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("flashsale_stream_length{{product_id=\"{sku}\"}}")
        ),
        2.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("flashsale_group_pending{{product_id=\"{sku}\"}}")
        ),
        0.0
    );
}

/// A dependency's failure reaches the client as a plain 503 and the log as
/// one line with the whole cause: which store, and what it said.
#[tokio::test]
async fn a_503_is_logged_once_with_its_cause_chain() {
    let (port, dead_redis) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{port}");
    let redis_url = format!("redis://127.0.0.1:{dead_redis}");
    let mut serve = Flashsale::spawn(
        "serve",
        &[
            ("LISTEN_ADDR", &listen),
            ("REDIS_URL", &redis_url),
            ("REDIS_TIMEOUT_MS", "300"),
            ("ADMIN_ROUTES", "false"),
            ("WORKERS", "false"),
            ("AUTH", "none"),
            ("RUST_LOG", "warn"),
        ],
    );
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/api/orders");
    let order = serde_json::json!({"user_id": 1, "product_id": "sku-1", "quantity": 1});
    // Once it listens (it starts whatever Redis does).
    let (status, body) = eventually_some("serve answers", Duration::from_secs(30), || async {
        let resp = client.post(&url).json(&order).send().await.ok()?;
        Some((resp.status(), resp.text().await.unwrap_or_default()))
    })
    .await;
    assert_eq!(status, reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(!body.contains("redis"), "the cause is not shown: {body}");
    // One request, one line, with the whole chain: no conversion on the
    // way logged it too.
    let lines = serve.lines_within(Duration::from_secs(1)).await;
    let failures: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "request failed: a dependency")
        .collect();
    assert_eq!(failures.len(), 1, "{lines:?}");
    let line = failures[0];
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["fields"]["code"], "unavailable");
    let chain = line["fields"]["error"].as_str().expect("an error field");
    let cause = chain
        .strip_prefix("a dependency is unavailable; retry shortly: redis: ")
        .unwrap_or_else(|| panic!("the chain names the store: {chain}"));
    // (The start-up probe of Redis reports its own failures, apart.)
    let mentions = lines
        .iter()
        .filter(|l| l["target"] != "flashsale::sale::durability")
        .filter(|l| l.to_string().contains(cause))
        .count();
    assert_eq!(mentions, 1, "the cause is logged once: {lines:?}");
    serve.stop().await;
}

/// The metric names in `text`: `flashsale_*` and `process_*` words.
fn metric_names(text: &str) -> Vec<String> {
    let mut names: Vec<String> = ["flashsale_", "process_"]
        .iter()
        .flat_map(|prefix| text.match_indices(prefix))
        .filter(|(at, _)| {
            // A word's start, not the middle of one.
            !text[..*at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            rest[..end].to_owned()
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Every metric the shipped alert rules and Grafana dashboard use is one
/// the service exports (`deploy/`; promtool tests the rules' logic).
#[tokio::test]
async fn the_alert_rules_and_the_dashboard_use_only_metrics_the_service_exports() {
    let read = |path: &str| {
        std::fs::read_to_string(format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let rules = metric_names(&read("prometheus/alerts.yml"));
    let dashboard = metric_names(&read("grafana/flashsale.json"));
    assert!(rules.len() >= 5, "the rules name {rules:?}");
    assert!(dashboard.len() >= 10, "the dashboard names {dashboard:?}");
    let mut names = rules;
    names.extend(dashboard);

    // A sale that sold, persisted and had its books checked, then closed
    // with its orders unpaid (it cannot retire), so that every family has a
    // series.
    let app = spawn_app_with(|s| {
        books_checked_every(100)(s);
        if let Some(w) = s.workers.as_mut() {
            w.retire_every = Duration::from_millis(100);
            w.retire.after = Duration::ZERO;
        }
    })
    .await;
    let sku = app.new_sale(2, 1).await;
    // And a sale with a waiting room, for the room's families.
    let mut body = crate::helpers::product_body(&crate::helpers::unique("room-"), 5, 1);
    body["waiting_room"] = serde_json::json!({"ceiling_per_sec": 10});
    app.sale_from(body).await;
    for user in 1..=3 {
        app.place_order(user, &sku, 1).await;
    }
    eventually("2 orders persisted", Duration::from_secs(10), || async {
        app.persisted(&sku).await.0 == 2
    })
    .await;
    app.close_sale(&sku).await;
    eventually("the sale found unpaid", Duration::from_secs(10), || async {
        app.metrics_text()
            .await
            .contains("flashsale_sale_unsettled{")
    })
    .await;
    eventually("the books checked", Duration::from_secs(10), || async {
        books_gauge(&app, &sku).await.is_some()
    })
    .await;
    let text = app.metrics_text().await;
    for name in &names {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "deploy/ uses {name}, which /metrics does not export:\n{text}"
        );
    }
}

/// A sale's books gauge, if exported.
async fn books_gauge(app: &crate::helpers::TestApp, sku: &str) -> Option<(f64, f64)> {
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |name: &str| {
        let series = format!("{name}{{product_id=\"{sku}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some((
        value("flashsale_sale_books_balanced")?,
        value("flashsale_sale_books_difference")?,
    ))
}

fn books_checked_every(ms: u64) -> impl FnOnce(&mut flashsale::config::Settings) {
    move |s| {
        if let Some(w) = s.workers.as_mut() {
            w.books_every = Duration::from_millis(ms);
        }
    }
}

/// The workers' live check: a quiet sale whose stock was changed behind the
/// books' back is unbalanced by exactly that much, and balanced again once
/// repaired.
#[tokio::test]
async fn the_books_gauge_turns_0_when_a_quiet_sale_is_off_and_1_when_repaired() {
    let app = spawn_app_with(books_checked_every(100)).await;
    let sku = app.new_sale(5, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    eventually("3 orders persisted", Duration::from_secs(10), || async {
        app.persisted(&sku).await.0 == 3
    })
    .await;
    eventually("the books balanced", Duration::from_secs(10), || async {
        books_gauge(&app, &sku).await == Some((1.0, 0.0))
    })
    .await;

    let mut r = app.redis.clone();
    let stock = app.key(&sku, "stock");
    let _: i64 = redis::AsyncCommands::incr(&mut r, &stock, 2).await.unwrap();
    eventually("the books off by 2", Duration::from_secs(10), || async {
        books_gauge(&app, &sku).await == Some((0.0, -2.0))
    })
    .await;
    let _: i64 = redis::AsyncCommands::incr(&mut r, &stock, -2)
        .await
        .unwrap();
    eventually(
        "the books balanced again",
        Duration::from_secs(10),
        || async { books_gauge(&app, &sku).await == Some((1.0, 0.0)) },
    )
    .await;
}

/// Samples the sale's books gauge, as often as it can, until `done`: every reading.
fn watch_books_gauge(
    app: std::sync::Arc<TestApp>,
    sku: String,
    done: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<(f64, f64)>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !done.is_cancelled() {
            if let Some(gauge) = books_gauge(&app, &sku).await {
                seen.push(gauge);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seen
    })
}

/// Orders in flight between Redis and MySQL, and cancels between MySQL and
/// Redis, never make the gauge say unbalanced, however often it looks.
#[tokio::test]
async fn the_books_gauge_does_not_flap_during_a_burst() {
    let app = std::sync::Arc::new(spawn_app_with(books_checked_every(10)).await);
    // Stock for every buyer (3 + 300), whenever the cancels' units come
    // back: a cancel of an order still pending returns them only once the
    // sweeper applies it, and a buyer refused sold out fails the test.
    let sku = app.new_sale(310, 1).await;
    // Judged once before the burst, so that the gauge is there to flap.
    app.accept_orders(&sku, 1001..=1003).await;
    eventually("the books balanced", Duration::from_secs(10), || async {
        books_gauge(&app, &sku).await == Some((1.0, 0.0))
    })
    .await;
    let done = tokio_util::sync::CancellationToken::new();
    let watch = watch_books_gauge(app.clone(), sku.clone(), done.clone());
    let mut buyers = tokio::task::JoinSet::new();
    for first in (1..=300u64).step_by(30) {
        let (app, sku) = (app.clone(), sku.clone());
        buyers.spawn(async move {
            for user in first..first + 30 {
                let order = app.order_until_accepted(user, &sku).await;
                // Every third buyer cancels: units go back while others buy.
                if user % 3 == 0 {
                    let id = order["order_id"].as_str().unwrap();
                    let resp = app.cancel(id, user).await;
                    assert!(resp.status().is_success(), "cancel: {}", resp.status());
                }
                // Paced, so that the sale has quiet moments to be judged in.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    while let Some(joined) = buyers.join_next().await {
        joined.unwrap();
    }
    eventually(
        "the books balanced after the burst",
        Duration::from_secs(20),
        || async { books_gauge(&app, &sku).await == Some((1.0, 0.0)) },
    )
    .await;
    done.cancel();
    let seen = watch.await.unwrap();
    assert!(seen.len() >= 20, "{} samples", seen.len());
    assert!(
        seen.iter().all(|(balanced, _)| *balanced == 1.0),
        "the gauge said unbalanced during the burst: {:?}",
        seen.iter().filter(|(b, _)| *b != 1.0).collect::<Vec<_>>()
    );
}

/// The books check's read of a sale's backlog (`Watch::backlog`): entries not
/// yet delivered and entries delivered but not acked are both unsettled (a
/// sale with either is not judged), with the stock and the dead letters.
#[tokio::test]
async fn the_books_checks_read_counts_undelivered_and_unacked_entries_as_unsettled() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(10, 5).await;
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let backlog = || async { app.sales.watch().backlog(&product).await.unwrap() };
    let quiet = backlog().await;
    assert_eq!(
        (quiet.stock, quiet.unsettled, quiet.dead_letters),
        (Some(10), Some(0), 0)
    );
    for user in 1..=3 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }
    let read = backlog().await;
    assert_eq!((read.stock, read.unsettled), (Some(7), Some(3)));
    // A consumer takes two and has not acked them: still unsettled.
    let mut r = app.redis.clone();
    let orders = app.key(&sku, "orders");
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(flashsale::sale::keys::GROUP)
        .arg("a-test")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&orders)
        .arg(">")
        .query_async(&mut r)
        .await
        .unwrap();
    let ids: Vec<String> = read.keys[0].ids.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(backlog().await.unsettled, Some(3));
    let _: u64 = redis::cmd("XACK")
        .arg(&orders)
        .arg(flashsale::sale::keys::GROUP)
        .arg(&ids)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(backlog().await.unsettled, Some(1));
}
