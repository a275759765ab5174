//! Quiet sales cost nothing: a drain that finds its sale's stream empty
//! sleeps on the sale's bell, and the sale's next order rings it
//! (`sale::bells`): no read while quiet, the order persisted at once.

use std::time::Duration;

use flashsale::config::RedisTarget;
use flashsale::domain::{OrderId, ProductId, Quantity, UserId};
use flashsale::sale::{OrderCall, Redis, Vouched};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::helpers::{
    Backend, REDIS_URL, TestApp, eventually, metric, spawn_app_on, spawn_app_with,
};
use crate::proxy::Proxy;

async fn asleep(app: &TestApp) -> f64 {
    metric(app, &app.base, "flashsale_drains_asleep").await
}

async fn reads(app: &TestApp) -> f64 {
    metric(app, &app.base, "flashsale_stream_reads_total").await
}

/// Waits until the sale's drain sleeps (after draining what it had).
async fn until_asleep(app: &TestApp, sku: &str) {
    eventually("the drain sleeps", Duration::from_secs(10), || async {
        asleep(app).await >= 1.0
    })
    .await;
    let mut r = app.redis.clone();
    let mark: Option<String> = r.hget(app.key(sku, "sale"), "awake").await.unwrap();
    assert_eq!(mark, None, "asleep: the sale's next order rings");
}

async fn a_quiet_sales_drain_sleeps_until_its_next_order(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 5).await;
    app.accept_orders(&sku, 1..=1).await;
    app.drained(&sku, 1).await;
    until_asleep(&app, &sku).await;
    let before = reads(&app).await;
    // Ten blocking reads' worth of quiet: an awake drain would read each.
    let block = app.settings.workers.as_ref().expect("workers").block;
    tokio::time::sleep(block * 10).await;
    assert_eq!(reads(&app).await, before, "a sleeping drain reads nothing");

    let ordered = Instant::now();
    app.accept_orders(&sku, 2..=2).await;
    app.drained(&sku, 2).await;
    // The drain's own look comes minutes later: this is the bell.
    assert!(
        ordered.elapsed() < Duration::from_secs(5),
        "persisted {:?} after the order",
        ordered.elapsed()
    );
    let rung = "flashsale_drain_wakeups_total{reason=\"bell\"}";
    assert!(metric(&app, &app.base, rung).await >= 1.0);
    // Once rung, the next orders find the sale awake: no second bell.
    let mut r = app.redis.clone();
    let mark: Option<String> = r.hget(app.key(&sku, "sale"), "awake").await.unwrap();
    assert_eq!(mark.as_deref(), Some("1"));
}

crate::on_both_backends!(a_quiet_sales_drain_sleeps_until_its_next_order);

/// A bell nobody hears (the subscription is down: Redis behind a proxy that
/// goes off) is not needed: when the subscription is lost and again when it
/// is back, every drain looks once, and the order placed meanwhile (on
/// another path to Redis) is persisted in seconds, not at the drain's own
/// look minutes later.
#[tokio::test]
async fn an_order_rung_while_nobody_listens_is_persisted_when_the_subscription_is_back() {
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let app = spawn_app_with(|s| {
        s.redis.target = RedisTarget::Single(format!("redis://127.0.0.1:{}", proxy.port));
        s.redis.timeout = Duration::from_millis(300);
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    app.accept_orders(&sku, 1..=1).await;
    app.drained(&sku, 1).await;
    until_asleep(&app, &sku).await;

    proxy.set_on(false);
    let direct = Redis::new(
        &RedisTarget::Single(REDIS_URL.into()),
        Duration::from_secs(2),
        1,
    )
    .unwrap();
    let product = ProductId::parse(&sku).unwrap();
    let order_id = OrderId::generate(&product);
    let call = OrderCall {
        order_id,
        user_id: UserId::new(2).unwrap(),
        quantity: Quantity::new(1).unwrap(),
        idempotency_key: None,
        vouched: Vouched::No,
        shards: 1,
    };
    let mut conn = direct.shared().await.unwrap();
    let reply = flashsale::sale::place_orders_on(&mut conn, &app.prefix, &product, &[call]).await;
    assert!(format!("{reply:?}").contains("Accepted"), "{reply:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = Instant::now();
    proxy.set_on(true);
    app.drained(&sku, 2).await;
    assert!(
        back.elapsed() < Duration::from_secs(10),
        "persisted {:?} after Redis came back",
        back.elapsed()
    );
}
