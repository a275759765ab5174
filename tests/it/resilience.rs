//! A failing dependency gets a 503 in bounded time, never a hang or a panic.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_refused, spawn_app, spawn_app_with};

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test]
async fn redis_unreachable_gives_503_not_a_hang() {
    let port = closed_port();
    let app = spawn_app_with(|s| {
        s.redis = flashsale::sale::RedisTarget::Single(format!("redis://127.0.0.1:{port}"));
        s.redis_timeout = Duration::from_millis(500);
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

#[tokio::test]
async fn processes_starting_together_on_a_fresh_database_all_start() {
    let app = spawn_app().await;
    let db = crate::helpers::unique("fs_test_");
    let mut settings = app.settings.clone();
    settings.database_url = format!("{}/{db}", crate::helpers::MYSQL_SERVER);
    settings.workers = None;
    settings.listen_addr = "127.0.0.1:0".parse().unwrap();
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let s = settings.clone();
            tokio::spawn(async move { flashsale::app::App::build(&s).await.map(|_| ()) })
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
