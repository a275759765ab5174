//! `flashsale-bench rehearse` end to end: a small rehearsal against a live
//! service, started here on the local Redis and MariaDB with a database and
//! key prefix of its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use flashsale::config::{Cli, Command, DbArgs, RedisArgs, Settings};
use flashsale_bench::BenchArgs;
use flashsale_bench::tokens::Tokens;
use tokio::sync::oneshot;

const REDIS_URL: &str = "redis://127.0.0.1:6379";
const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";
const ADMIN_TOKEN: &str = "bench-test-admin-token-0123456789";

fn unique(tag: &str) -> String {
    format!("{tag}{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// A `flashsale serve` of the test's own (`AUTH=none`, no limits), as the
/// command line configures it, running until dropped.
struct TestApp {
    base: String,
    prefix: String,
    db_name: String,
    settings: Settings,
    _stop: oneshot::Sender<()>,
}

async fn spawn_app() -> TestApp {
    let (prefix, db_name) = (unique("tb"), unique("fs_test_"));
    let database_url = format!("{MYSQL_SERVER}/{db_name}");
    let cli = Cli::parse_from([
        "flashsale",
        "serve",
        "--listen-addr=127.0.0.1:0",
        "--redis-url",
        REDIS_URL,
        "--key-prefix",
        &prefix,
        "--database-url",
        &database_url,
        "--admin-token",
        ADMIN_TOKEN,
        "--auth=none",
        "--rate-limits=false",
        "--max-in-flight=0",
    ]);
    let Command::Serve(args) = cli.command else {
        unreachable!("parsed as serve")
    };
    let settings = Settings::from(*args);
    let app = flashsale::app::App::build(&settings).await.expect("starts");
    let base = format!("http://{}", app.local_addr().expect("bound"));
    let db = app.db().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(app.run(async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(Duration::from_secs(30), db.wait_ready())
        .await
        .expect("its database is ready");
    TestApp {
        base,
        prefix,
        db_name,
        settings,
        _stop: stop,
    }
}

impl TestApp {
    /// Removes the test's database and Redis keys (a failed test keeps
    /// them for inspection; `.ci/run` sweeps leftover databases).
    async fn remove(self) {
        use sqlx::Connection;
        let mut mysql = sqlx::MySqlConnection::connect(MYSQL_SERVER)
            .await
            .expect("mysql");
        sqlx::query(&format!("DROP DATABASE IF EXISTS `{}`", self.db_name))
            .execute(&mut mysql)
            .await
            .expect("drop the test's database");
        let mut redis = redis::Client::open(REDIS_URL)
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query_async(&mut redis)
            .await
            .expect("KEYS");
        for key in keys {
            let _: () = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut redis)
                .await
                .expect("DEL");
        }
    }
}

/// A small rehearsal against `app`, its stores and its admin token.
fn small_rehearsal(app: &TestApp) -> BenchArgs {
    BenchArgs {
        redis: RedisArgs {
            redis_url: REDIS_URL.into(),
            redis_cluster_nodes: None,
            key_prefix: app.prefix.clone(),
            redis_timeout_ms: 2000,
            redis_pool_size: 4,
            redis_wait_replicas: 0,
            redis_wait_timeout_ms: 100,
        },
        db: DbArgs {
            database_url: app.settings.db.url.clone(),
            db_timeout_ms: 5000,
            db_max_connections: 4,
        },
        url: vec![app.base.clone()],
        local: false,
        instances: 1,
        memory: flashsale_bench::rehearsal::MemoryMode::All,
        pre_start_secs: 0,
        limit_share: 0.0,
        unknown_share: 0.0,
        cancel_mid_sale: 0,
        admin_token: Some(ADMIN_TOKEN.into()),
        stock: 200,
        sales: 1,
        users: 1500,
        requests: 3000,
        concurrency: 16,
        limit_per_user: 2,
        shards: 1,
        repeat_share: 0.2,
        retry_share: 0.05,
        seed: 1,
        rate: None,
        then_at: None,
        no_direct: false,
        floor: true,
        limits: None,
        drain_timeout_secs: 60,
        keep: true,
        json: false,
        quiet: true,
        jwt_secret: None,
        jwt_private_key: None,
        jwt_algorithm: None,
        jwt_public_key: None,
        token_cache: 100_000,
        tokens: None,
        plan: Default::default(),
    }
}

/// `--shards 3`: the rehearsed sale is opened with three stock shards;
/// exactly its stock is sold, the books balance, and the plan's Redis
/// ceiling counts three cores.
#[tokio::test]
async fn a_rehearsal_of_a_sale_of_three_stock_shards_balances_the_books() {
    let app = spawn_app().await;
    let args = BenchArgs {
        shards: 3,
        floor: false,
        no_direct: true,
        ..small_rehearsal(&app)
    };
    let report = flashsale_bench::rehearsal::run(args)
        .await
        .expect("bench runs");
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(report.units_accepted, 200, "demand is far above the stock");
    assert_eq!(report.capacity.shards, 3);
    app.remove().await;
}

#[tokio::test]
async fn a_small_rehearsal_balances_the_books() {
    let app = spawn_app().await;
    let args = small_rehearsal(&app);
    let report = flashsale_bench::rehearsal::run(args)
        .await
        .expect("bench runs");
    assert!(!report.checks.is_empty());
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(report.units_accepted, 200, "demand is far above the stock");
    assert!(report.direct.is_some());
    // The constant floor answered every request of the plan; the script
    // floor sold exactly the stock through the real script; the ratios are there.
    let floor = report.floor.as_ref().expect("--floor ran");
    assert_eq!(
        floor.outcomes,
        BTreeMap::from([("sold_out".to_owned(), 3000)])
    );
    let script = report.floor_script.as_ref().expect("--floor ran");
    assert_eq!(
        script.outcomes.get("accepted"),
        Some(&200),
        "{:?}",
        script.outcomes
    );
    assert_eq!(script.outcomes.values().sum::<u64>(), 3000);
    assert!(!script.outcomes.contains_key("unavailable"));
    for r in [
        report.http_over_floor,
        report.http_over_floor_script,
        report.floor_over_direct,
        report.floor_script_over_direct,
    ] {
        assert!(r.is_some_and(|r| r > 0.0));
    }
    assert!(report.persisted_after_burst_ms.is_some());
    // CPU per request: the floors' threads measured apart, the service's
    // from its /metrics; a bare refusal costs less than the service.
    let constant = floor.server_cpu_us_per_request.expect("measured");
    let service = report
        .cpu
        .api_us_per_request
        .expect("process_cpu_seconds_total");
    assert!(constant > 0.0 && script.server_cpu_us_per_request.is_some_and(|us| us > 0.0));
    assert!(
        constant < service,
        "floor {constant} µs, service {service} µs"
    );
    app.remove().await;
}

#[tokio::test]
async fn a_local_rehearsal_with_bearer_tokens_balances_the_books() {
    const SECRET: &str = "bench-test-secret-0123456789abcdef0123";
    let app = spawn_app().await;
    // A server of the bench's own (`--local`) verifying HS256 tokens, on the
    // test's stores; the bench mints each buyer's token with the same secret.
    let args = BenchArgs {
        local: true,
        admin_token: None,
        stock: 50,
        users: 200,
        requests: 400,
        limit_per_user: 1,
        no_direct: true,
        floor: false,
        keep: false,
        jwt_secret: Some(SECRET.into()),
        token_cache: 1000,
        ..small_rehearsal(&app)
    };
    let report = flashsale_bench::rehearsal::run(args.clone())
        .await
        .expect("bench runs");
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(
        report.units_accepted, 50,
        "the tokens were accepted: {:?}",
        report.http.outcomes
    );
    assert!(!report.http.outcomes.contains_key("unauthorized"));
    assert!(report.http_cpu_us_per_request.is_some_and(|us| us > 0.0));

    // Tokens from another key: the server refuses every order.
    let other = Tokens::hmac("another-secret-0123456789abcdef01234567", None).unwrap();
    let report = flashsale_bench::rehearsal::run(BenchArgs {
        tokens: Some(Arc::new(other)),
        ..args
    })
    .await
    .expect("bench runs");
    assert_eq!(
        report.http.outcomes,
        BTreeMap::from([("unauthorized".to_owned(), 400)])
    );
    assert!(!report.ok(), "nothing sold: the books' checks fail");
    app.remove().await;
}

#[tokio::test]
async fn a_rehearsal_with_its_crowd_over_instances_answers_it_from_memory_and_balances() {
    let app = spawn_app().await;
    // Three instances of the bench's own: a storm before the start, buyers
    // past their limit, made-up ids, and units cancelled mid-sale through
    // the last instance (sold again through the others).
    let args = BenchArgs {
        local: true,
        instances: 3,
        admin_token: None,
        stock: 100,
        users: 2_000,
        requests: 4_000,
        limit_per_user: 1,
        pre_start_secs: 2,
        limit_share: 0.2,
        unknown_share: 0.05,
        cancel_mid_sale: 10,
        no_direct: true,
        floor: false,
        keep: false,
        ..small_rehearsal(&app)
    };
    let report = flashsale_bench::rehearsal::run(args)
        .await
        .expect("bench runs");
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(report.instances, 3);
    assert_eq!(report.cancelled_mid_sale, 10);
    assert_eq!(report.units_accepted, 110, "the cancelled units sold again");
    let pre = report.pre_start.as_ref().expect("a pre-start storm");
    assert!(
        pre.requests > 100,
        "{} requests before the start",
        pre.requests
    );
    assert!(report.sold_out_phase.is_some());
    let calls = report
        .redis_calls
        .as_ref()
        .expect("every instance's metrics");
    let pre_calls = calls.pre_start.expect("counted");
    // Each instance asks Redis until its first answer comes back: at most
    // one request per connection, once.
    assert!(
        pre_calls.scripts <= 16 + 3,
        "{} script calls for {} requests before the start",
        pre_calls.scripts,
        pre.requests
    );
    assert!(
        calls.per_request < 0.2,
        "{} Redis calls per request",
        calls.per_request
    );
    // Each part's CPU time was measured apart (the servers on runtimes of
    // their own, Redis by INFO, the local MariaDB by its process).
    let cpu = report.cpu;
    for (part, v) in [
        ("api", cpu.api_us_per_request),
        ("redis", cpu.redis_us_per_request),
        ("generator", cpu.generator_us_per_request),
        ("workers", cpu.workers_us_per_order),
        ("mysql", cpu.mysql_us_per_order),
    ] {
        assert!(v.is_some_and(|us| us > 0.0), "{part}: {v:?}");
    }
    // The capacity plan is sized from them, every part of it.
    let plan = report.capacity;
    for (part, cores) in [
        ("api", plan.api_cores),
        ("redis", plan.redis_cores),
        ("workers", plan.workers_cores),
        ("mysql", plan.mysql_cores),
    ] {
        assert!(cores.is_some_and(|c| c > 0.0), "{part}: {cores:?}");
    }
    for v in [
        report.pre_start_api_cpu_us_per_request,
        report.sold_out_api_cpu_us_per_request,
    ] {
        assert!(v.is_some_and(|us| us > 0.0), "{v:?}");
    }
    app.remove().await;
}
