//! A failing dependency gets a 503 in bounded time, never a hang or a panic.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use flashsale::store::Db;

use crate::helpers::{
    ADMIN_TOKEN, Beside, TestApp, assert_refused, eventually, fast_workers, product_body,
    spawn_app, spawn_app_with,
};
use crate::proxy::{Mode, Proxy};

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test]
async fn redis_unreachable_gives_503_not_a_hang() {
    let port = closed_port();
    let app = spawn_app_with(|s| {
        s.redis.target =
            flashsale::config::RedisTarget::Single(format!("redis://127.0.0.1:{port}"));
        s.redis.timeout = Duration::from_millis(500);
    })
    .await;
    // A hang would fail the request at the client's timeout instead.
    let order = json!({"user_id": 1, "product_id": "sku-1", "quantity": 1});
    assert_refused(
        app.post_order(&order, None).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    )
    .await;
    let resp = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    // The process is alive and says so.
    let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn ready_when_both_dependencies_answer() {
    let app = spawn_app().await;
    let resp = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// Several processes creating one fresh database at once all get it ready
/// (the migration lock holds on MariaDB, which answers sqlx's own at once).
#[tokio::test]
async fn processes_starting_together_on_a_fresh_database_all_get_it_ready() {
    let app = spawn_app().await;
    let db = crate::helpers::unique("fs_test_");
    let url = format!("{}/{db}", crate::helpers::MYSQL_SERVER);
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let store = Db::connect_lazy(&url, Duration::from_secs(5), 2)?;
                store.create_and_migrate().await
            })
        })
        .collect();
    for start in starts {
        let started = start.await.expect("task");
        assert!(started.is_ok(), "{started:?}");
    }
    sqlx::query(&format!("DROP DATABASE `{db}`"))
        .execute(&app.mysql)
        .await
        .unwrap();
}

/// `settings` with MySQL reached through `proxy`.
fn through(proxy: &Proxy, url: &str) -> String {
    url.replace("127.0.0.1:3306", &format!("127.0.0.1:{}", proxy.port))
}

/// A second `serve` over the sales and database of `app`, with workers,
/// reaching MySQL through `proxy` (started while it is out).
async fn serve_beside(app: &TestApp, proxy: &Proxy) -> Beside {
    app.serve_beside(|s| {
        s.db.url = through(proxy, &s.db.url);
        s.db.timeout = Duration::from_millis(500);
        s.workers = Some(fast_workers("late"));
    })
    .await
}

/// `serve` started while MySQL is down: alive at once, not ready, takes
/// orders; ready and persisting them as soon as MySQL answers, no restart.
#[tokio::test]
async fn serve_starts_while_mysql_is_down_and_gets_ready_when_it_returns() {
    // The sale is set up by a healthy instance without workers.
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    let proxy = Proxy::start("127.0.0.1:3306").await;
    proxy.set_on(false);
    let Beside { base, db, .. } = &serve_beside(&app, &proxy).await;
    let get = |path: &str| app.client.get(format!("{base}{path}")).send();
    assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        get("/readyz").await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    for user in 1..=3 {
        let resp = app
            .client
            .post(format!("{base}/api/orders"))
            .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::ACCEPTED,
            "orders never wait for MySQL"
        );
    }
    // What needs MySQL answers 503 meanwhile, not 500.
    let created = app
        .client
        .post(format!("{base}/api/admin/products"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&product_body(&crate::helpers::unique("sku-"), 5, 1))
        .send()
        .await
        .unwrap();
    assert_refused(created, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!db.is_ready());
    assert_eq!(app.persisted(&sku).await.0, 0);

    proxy.set_on(true);
    eventually(
        "ready without a restart",
        Duration::from_secs(20),
        || async {
            get("/readyz")
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        },
    )
    .await;
    app.drained(&sku, 3).await;
}

/// `/readyz?for=orders` (the readiness the Kubernetes manifests route on):
/// not ready until the books were reached once (a process with a wrong
/// `DATABASE_URL` never takes traffic), then ready through an outage of the
/// books, which the plain `/readyz` reports, since the order path needs
/// only Redis; an unknown scope is a 400 with the usual body.
#[tokio::test]
async fn ready_for_orders_once_the_books_were_reached_and_through_their_outage() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    let proxy = Proxy::start("127.0.0.1:3306").await;
    proxy.set_on(false);
    let Beside { base, .. } = &serve_beside(&app, &proxy).await;
    let status = |path: &'static str| {
        let req = app.client.get(format!("{base}{path}")).send();
        async move { req.await.map(|r| r.status()).ok() }
    };
    // Never reached: not ready, either way.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        status("/readyz?for=orders").await,
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        status("/readyz").await,
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    let bad = app
        .client
        .get(format!("{base}/readyz?for=everything"))
        .send()
        .await
        .unwrap();
    assert_refused(bad, StatusCode::BAD_REQUEST, "invalid_request").await;

    proxy.set_on(true);
    eventually(
        "ready once the books answer",
        Duration::from_secs(20),
        || async {
            status("/readyz").await == Some(StatusCode::OK)
                && status("/readyz?for=orders").await == Some(StatusCode::OK)
        },
    )
    .await;

    // The books go away: unready for everything, still ready for orders,
    // and orders are taken.
    proxy.set_on(false);
    eventually(
        "/readyz reports the outage",
        Duration::from_secs(10),
        || async { status("/readyz").await == Some(StatusCode::SERVICE_UNAVAILABLE) },
    )
    .await;
    let ready = app
        .client
        .get(format!("{base}/readyz?for=orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(
        (&body["for"], &body["redis"]),
        (&json!("orders"), &json!("ok"))
    );
    assert!(
        body["mysql"]
            .as_str()
            .is_some_and(|m| m.starts_with("unavailable")),
        "{body}"
    );
    let resp = app
        .client
        .post(format!("{base}/api/orders"))
        .json(&json!({"user_id": 1, "product_id": sku, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    proxy.set_on(true);
    app.drained(&sku, 1).await;
}

/// A frozen MySQL (accepts, never answers) holds nothing up at start.
#[tokio::test]
async fn serve_starts_while_mysql_is_frozen() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let proxy = Proxy::start("127.0.0.1:3306").await;
    proxy.set_mode(Mode::Stall);
    let Beside { base, db, .. } = &serve_beside(&app, &proxy).await;
    let get = |path: &str| app.client.get(format!("{base}{path}")).send();
    assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
    let ready = tokio::time::timeout(Duration::from_secs(3), get("/readyz")).await;
    assert_eq!(
        ready
            .expect("readyz answers while MySQL is frozen")
            .unwrap()
            .status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    proxy.set_mode(Mode::Forward);
    tokio::time::timeout(Duration::from_secs(20), db.wait_ready())
        .await
        .expect("ready once MySQL answers again");
}

/// `flashsale worker` started while both Redis and MySQL are down stays up
/// and persists the waiting orders once they return.
#[tokio::test]
async fn a_worker_started_while_redis_and_mysql_are_down_waits_then_persists() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    let mysql = Proxy::start("127.0.0.1:3306").await;
    let redis = Proxy::start("127.0.0.1:6379").await;
    mysql.set_on(false);
    redis.set_on(false);
    let timeout = Duration::from_millis(300);
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("worker")
        .env("REDIS_URL", format!("redis://127.0.0.1:{}", redis.port))
        .env("DATABASE_URL", through(&mysql, &app.settings.db.url))
        .env("REDIS_KEY_PREFIX", &app.prefix)
        .env("CONSUMER_NAME", "started-in-the-dark")
        .env("BLOCK_MS", "200")
        .env("REDIS_TIMEOUT_MS", timeout.as_millis().to_string())
        .env("DB_TIMEOUT_MS", timeout.as_millis().to_string())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("flashsale worker starts");
    // Five of its calls' timeouts, every one failing.
    tokio::time::sleep(timeout * 5).await;
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker exited while its dependencies were down"
    );
    assert_eq!(app.persisted(&sku).await.0, 0);
    redis.set_on(true);
    mysql.set_on(true);
    app.drained(&sku, 3).await;
    let _ = worker.kill().await;
}

/// While MySQL is down, an order Redis holds is answered from Redis, marked
/// `provisional`, with the last state Redis knows, instead of a 503.
#[tokio::test]
async fn an_order_is_answered_from_redis_while_mysql_is_down() {
    let proxy = Proxy::start("127.0.0.1:3306").await;
    let app = spawn_app_with(|s| {
        s.db.url = through(&proxy, &s.db.url);
        s.db.timeout = Duration::from_millis(500);
    })
    .await;
    let sku = app.new_sale(10, 1).await;
    let place = |user: u64| {
        let (app, sku) = (&app, &sku);
        async move {
            let resp = app.place_order(user, sku, 1).await;
            assert_eq!(resp.status(), StatusCode::ACCEPTED);
            let order: serde_json::Value = resp.json().await.unwrap();
            order["order_id"].as_str().unwrap().to_owned()
        }
    };
    let confirmed = place(1).await;
    let cancelled = place(2).await;
    app.drained(&sku, 2).await;
    assert_eq!(app.cancel(&cancelled, 2).await.status(), StatusCode::OK);
    let lookup = |id: String| {
        let app = &app;
        async move { app.get_json(&format!("/api/orders/{id}")).await }
    };
    let (_, books) = lookup(confirmed.clone()).await;
    assert!(books.get("provisional").is_none(), "{books}");

    proxy.set_on(false);
    let pending = place(3).await;
    for (id, status) in [
        (&confirmed, "confirmed"),
        (&cancelled, "cancelled"),
        (&pending, "pending"),
    ] {
        let (code, order) = lookup(id.clone()).await;
        assert_eq!(code, StatusCode::OK, "{order}");
        assert_eq!(
            (order["status"].as_str(), order["provisional"].as_bool()),
            (Some(status), Some(true)),
            "{order}"
        );
        assert_eq!(order["order_id"], id.as_str());
    }
    // An id Redis does not hold: only MySQL could tell.
    let flipped = if confirmed.ends_with('0') { '1' } else { '0' };
    let unknown = format!("{}{flipped}", &confirmed[..confirmed.len() - 1]);
    assert_eq!(lookup(unknown).await.0, StatusCode::SERVICE_UNAVAILABLE);

    proxy.set_on(true);
    app.drained(&sku, 3).await;
    let (_, order) = lookup(pending).await;
    assert_eq!(order["status"], "confirmed");
    assert!(order.get("provisional").is_none(), "{order}");
}

/// A migration given up while it waits for the lock (its bound fired, or
/// the process stopped) leaves nothing holding the lock: once its holder
/// lets go, the next attempt gets it.
#[tokio::test]
async fn a_migration_given_up_while_waiting_for_the_lock_leaves_it_free() {
    use sqlx::Connection;
    let db = crate::helpers::unique("fs_test_");
    let url = format!("{}/{db}", crate::helpers::MYSQL_SERVER);
    let lock = flashsale::store::migration_lock(&db);
    let lock_state = |sql: &'static str| {
        let lock = lock.clone();
        async move {
            let mut c = sqlx::MySqlConnection::connect(crate::helpers::MYSQL_SERVER)
                .await
                .unwrap();
            let v: Option<i64> = sqlx::query_scalar(sql)
                .bind(&lock)
                .fetch_one(&mut c)
                .await
                .unwrap();
            v
        }
    };
    // Another process holds the lock (say, a migration on a frozen MySQL).
    let mut holder = sqlx::MySqlConnection::connect(crate::helpers::MYSQL_SERVER)
        .await
        .unwrap();
    let held: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&lock)
        .fetch_one(&mut holder)
        .await
        .unwrap();
    assert_eq!(held, Some(1));
    let store = Db::connect_lazy(&url, Duration::from_secs(5), 2).unwrap();
    let gave_up = tokio::time::timeout(Duration::from_secs(1), store.create_and_migrate()).await;
    assert!(gave_up.is_err(), "the attempt waited for the lock");
    sqlx::query("DO RELEASE_LOCK(?)")
        .bind(&lock)
        .execute(&mut holder)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lock_state("SELECT IS_USED_LOCK(?)").await,
        None,
        "the given-up attempt's session took the lock and kept it"
    );
    tokio::time::timeout(Duration::from_secs(10), store.create_and_migrate())
        .await
        .expect("a new attempt gets the lock")
        .expect("migrates");
    assert_eq!(lock_state("SELECT IS_USED_LOCK(?)").await, None);
    sqlx::query(&format!("DROP DATABASE `{db}`"))
        .execute(&mut holder)
        .await
        .unwrap();
}
