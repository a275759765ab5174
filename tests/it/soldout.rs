//! The in-process sold-out marker: no Redis call per request after a sell-out,
//! and no undersell when stock comes back.

use std::time::Duration;

use flashsale::domain::OrderId;
use flashsale::sale::{Redis, Sales};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, assert_refused, eventually, spawn_app_on, status_code};

async fn sell_out(app: &TestApp, stock: u64) -> (String, Vec<String>) {
    let sku = app.new_sale(stock, 1).await;
    let mut ids = Vec::new();
    for user in 1..=stock {
        let v: Value = app.place_order(user, &sku, 1).await.json().await.unwrap();
        ids.push(v["order_id"].as_str().unwrap().to_owned());
    }
    let (_, code) = status_code(app.place_order(999, &sku, 1).await).await;
    assert_eq!(code, "sold_out");
    (sku, ids)
}

/// Another instance (its own Sales) returns one order's units.
async fn release_elsewhere(app: &TestApp, order_id: &str) {
    let other = Sales::new(
        Redis::new(&app.settings.redis.target, Duration::from_secs(2), 2).unwrap(),
        app.prefix.clone(),
        flashsale::config::MemorySettings::default(),
        None,
    );
    let (id, product) = OrderId::parse(order_id).unwrap();
    let order = other.accepted().find(&id, &product).await.unwrap().unwrap();
    assert_eq!(
        other.accepted().release(&order, 1).await.unwrap(),
        (true, 1)
    );
}

async fn after_a_sell_out_orders_are_refused_without_asking_redis(backend: Backend) {
    let app = spawn_app_on(backend, |s| {
        s.http.memory.sold_out_ttl = Duration::from_secs(60)
    })
    .await;
    let (sku, _) = sell_out(&app, 3).await;
    let calls = app.sales.counts().get(flashsale::sale::Counter::OrderCalls);
    for user in 100..150 {
        assert_refused(
            app.place_order(user, &sku, 1).await,
            StatusCode::CONFLICT,
            "sold_out",
        )
        .await;
    }
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::OrderCalls),
        calls,
        "no script call after the sell-out"
    );
    // A keyed request may be a retry of an order accepted earlier: it asks Redis.
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 1});
    let first: Value = app.post_order(&body, Some("k")).await.json().await.unwrap();
    assert_eq!(first["error"], "sold_out");
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::OrderCalls),
        calls + 1
    );
}

async fn while_orders_come_a_sold_out_mark_is_renewed_by_reads_not_by_scripts(backend: Backend) {
    let ttl = Duration::from_millis(300);
    let app = spawn_app_on(backend, |s| s.http.memory.sold_out_ttl = ttl).await;
    let (sku, ids) = sell_out(&app, 2).await;
    // Orders for six times the mark's life: each renewal is one stock read
    // in the background, no order waits for Redis.
    let calls = app.sales.counts().get(flashsale::sale::Counter::OrderCalls);
    let reads = app
        .sales
        .counts()
        .get(flashsale::sale::Counter::MemoryReads);
    let until = std::time::Instant::now() + 6 * ttl;
    let mut user = 1_000;
    while std::time::Instant::now() < until {
        user += 1;
        let (_, code) = status_code(app.place_order(user, &sku, 1).await).await;
        assert_eq!(code, "sold_out");
    }
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::OrderCalls),
        calls,
        "no script after the sell-out"
    );
    assert!(
        app.sales
            .counts()
            .get(flashsale::sale::Counter::MemoryReads)
            > reads,
        "renewed by reads"
    );
    // Units back through another instance: the next renewal finds them, so
    // the sale sells again within the mark's life.
    release_elsewhere(&app, &ids[0]).await;
    let user = std::cell::Cell::new(user);
    eventually(
        "sells again within the mark's life",
        ttl + Duration::from_millis(200),
        || async {
            user.set(user.get() + 1);
            app.place_order(user.get(), &sku, 1).await.status() == StatusCode::ACCEPTED
        },
    )
    .await;
}

async fn stock_released_elsewhere_sells_again_once_the_mark_expires(backend: Backend) {
    let ttl = Duration::from_millis(300);
    let app = spawn_app_on(backend, |s| s.http.memory.sold_out_ttl = ttl).await;
    let (sku, ids) = sell_out(&app, 2).await;
    release_elsewhere(&app, &ids[0]).await;
    // This instance may still say sold out, but for at most the mark's ttl.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert_eq!(
        app.place_order(500, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(app.stock(&sku).await, Some(0));
}

async fn stock_released_by_this_instance_sells_again_at_once(backend: Backend) {
    let app = spawn_app_on(backend, |s| {
        s.http.memory.sold_out_ttl = Duration::from_secs(60)
    })
    .await;
    let (sku, ids) = sell_out(&app, 2).await;
    let (id, product) = OrderId::parse(&ids[1]).unwrap();
    let order = app
        .sales
        .accepted()
        .find(&id, &product)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        app.sales.accepted().release(&order, 1).await.unwrap(),
        (true, 1)
    );
    assert_eq!(
        app.place_order(501, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
}

crate::on_both_backends!(
    after_a_sell_out_orders_are_refused_without_asking_redis,
    while_orders_come_a_sold_out_mark_is_renewed_by_reads_not_by_scripts,
    stock_released_elsewhere_sells_again_once_the_mark_expires,
    stock_released_by_this_instance_sells_again_at_once,
);
