//! Orders that share a call (`sale::orders::sharing`): the orders of one sale that
//! reach an API process while its call for the sale is in flight go in the
//! next call together, and the script decides each of them by the sale's
//! rules, in their order of arrival, as if it had been called once per order.

use std::time::Duration;

use flashsale::config::RedisTarget;
use flashsale::domain::{OrderId, ProductId, Quantity, UserId};
use flashsale::sale::{OrderCall, PlaceReply, Rejection, Vouched};
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::json;
use tokio::task::JoinSet;

use crate::helpers::{Backend, TestApp, metric, spawn_app_on, spawn_app_with};
use crate::proxy::{Mode, Proxy};

/// What the call of `orders` (the first, third and sixth accepted, five
/// units) left: the stock gone, each buyer's units, three entries and
/// records, the key's order, and the three in the books once each.
async fn the_accepted_three_kept_once(app: &TestApp, sku: &str, orders: &[OrderCall]) {
    assert_eq!(app.stock(sku).await, Some(0));
    for (user, units) in [(1, 2), (2, 1), (3, 2), (4, 0)] {
        assert_eq!(app.bought(sku, user).await, units, "buyer {user}");
    }
    assert_eq!(app.stream_len(sku).await, 3);
    let mut r = app.redis.clone();
    let records: usize = r.hlen(app.key(sku, "accepted")).await.unwrap();
    assert_eq!(records, 3);
    let keyed: Option<String> = r.hget(app.key(sku, "idem"), "2:k-1").await.unwrap();
    assert_eq!(keyed.as_deref(), Some(orders[2].order_id.as_str()));
    app.drained(sku, 5).await;
    let rows = app.order_rows(sku).await;
    let mut ids: Vec<&str> = rows.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort_unstable();
    let mut placed = [0, 2, 5].map(|i| orders[i].order_id.as_str());
    placed.sort_unstable();
    assert_eq!(ids, placed);
}

/// One call of seven orders on a sale of 5 units, 3 a buyer: the buyer's
/// allowance, the stock and an Idempotency-Key are each applied order by
/// order inside the call (a second order of the same buyer sees the first's
/// units, a repeat of a key answers the order placed earlier in the same
/// call, the stock falls order by order), and the orders accepted reach the
/// books once each.
async fn one_call_decides_each_of_its_orders_in_turn(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(5, 3).await;
    let product = ProductId::parse(&sku).unwrap();
    let order = |user, quantity, key: Option<&str>| OrderCall {
        order_id: OrderId::generate(&product),
        user_id: UserId::new(user).unwrap(),
        quantity: Quantity::new(quantity).unwrap(),
        idempotency_key: key.map(str::to_owned),
        vouched: Vouched::No,
        shards: 1,
    };
    let orders = [
        order(1, 2, None),
        order(1, 2, None),
        order(2, 1, Some("k-1")),
        order(2, 1, Some("k-1")),
        order(3, 3, None),
        order(3, 2, None),
        order(4, 1, None),
    ];
    let mut conn = app.redis_below().shared().await.unwrap();
    let replies = flashsale::sale::place_orders_on(&mut conn, &app.prefix, &product, &orders)
        .await
        .unwrap();
    assert_eq!(replies.len(), orders.len());
    let accepted = |r: &PlaceReply| match r {
        PlaceReply::Accepted {
            allowance_left,
            created_ms,
            price,
        } => Some((*allowance_left, *created_ms, price.to_string())),
        _ => None,
    };
    let (left, created_ms, price) = accepted(&replies[0]).expect("first order accepted");
    assert_eq!((left, price.as_str()), (1, "4999"));
    assert!(matches!(
        replies[1],
        PlaceReply::Rejected(Rejection::LimitExceeded { allowance: 1 })
    ));
    assert_eq!(accepted(&replies[2]).map(|a| a.0), Some(2));
    let PlaceReply::Replayed { order_id, record } = &replies[3] else {
        panic!("the key's second order is a repeat: {:?}", replies[3]);
    };
    assert_eq!(order_id, &orders[2].order_id);
    assert!(record.contains("\"user_id\":2"), "{record}");
    assert!(matches!(
        replies[4],
        PlaceReply::Rejected(Rejection::InsufficientStock { left: 2 })
    ));
    // The call's orders share its price and Redis's time.
    assert_eq!(accepted(&replies[5]), Some((1, created_ms, price.clone())));
    assert!(matches!(
        replies[6],
        PlaceReply::Rejected(Rejection::SoldOut)
    ));
    the_accepted_three_kept_once(&app, &sku, &orders).await;
}

crate::on_both_backends!(one_call_decides_each_of_its_orders_in_turn);

/// Posts an order of buyer 1, then, 60 ms later (while its call is in
/// flight on a slow Redis), `more` orders of buyers 2.. at once: their
/// answers' statuses, and the order-script calls they took.
async fn one_then_more(app: &TestApp, sku: &str, more: u64) -> (Vec<StatusCode>, u64) {
    let post = |user: u64| {
        let (client, url) = (app.client.clone(), app.url("/api/orders"));
        let body = json!({"user_id": user, "product_id": sku, "quantity": 1});
        async move {
            let resp = client.post(url).json(&body).send().await.expect("answered");
            resp.status()
        }
    };
    let calls = app.sales.counts().get(flashsale::sale::Counter::OrderCalls);
    let mut set = JoinSet::new();
    set.spawn(post(1));
    tokio::time::sleep(Duration::from_millis(60)).await;
    for user in 2..=more + 1 {
        set.spawn(post(user));
    }
    let mut statuses = Vec::new();
    while let Some(status) = set.join_next().await {
        statuses.push(status.expect("a task"));
    }
    assert_eq!(statuses.len() as u64, more + 1);
    (
        statuses,
        app.sales.counts().get(flashsale::sale::Counter::OrderCalls) - calls,
    )
}

/// With Redis slow to answer (behind a proxy that holds each chunk), the
/// orders posted while the first order's call is in flight are decided in
/// one more call, not one each; every one is accepted and persisted.
#[tokio::test]
async fn orders_arriving_during_a_call_share_the_next_one() {
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let app = spawn_app_with(|s| {
        s.redis.target = RedisTarget::Single(format!("redis://127.0.0.1:{}", proxy.port));
    })
    .await;
    let sku = app.new_sale(100, 1).await;
    proxy.set_mode(Mode::Slow(Duration::from_millis(150)));
    let (statuses, made) = one_then_more(&app, &sku, 20).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::ACCEPTED),
        "{statuses:?}"
    );
    assert!(
        (2..=3).contains(&made),
        "21 orders, 20 of them at once during the first's call, took {made} calls"
    );
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::OrdersSent),
        21
    );
    proxy.set_mode(Mode::Forward);
    app.drained(&sku, 21).await;
    let carried = metric(&app, &app.base, "flashsale_order_script_orders_total").await;
    assert_eq!(carried, 21.0);
}

/// With `REDIS_WAIT_REPLICAS=1` and no replica to confirm anything (the
/// shared test Redis has none: each WAIT runs out), the orders that shared
/// a call are each taken back: every one answered 503, none of their units
/// sold (`void_order.lua`, once per order), none in the books.
#[tokio::test]
async fn orders_of_a_call_the_replicas_did_not_confirm_are_each_taken_back() {
    let app = spawn_app_with(|s| {
        s.redis.wait = Some(flashsale::config::ReplicaWait {
            replicas: 1,
            timeout: Duration::from_millis(300),
        });
    })
    .await;
    let sku = app.new_sale(100, 1).await;
    let (statuses, made) = one_then_more(&app, &sku, 10).await;
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert!(made <= 3, "11 orders took {made} calls");
    assert_eq!(app.stock(&sku).await, Some(100));
    for user in 1..=11 {
        assert_eq!(app.bought(&sku, user).await, 0, "buyer {user}");
    }
    let mut r = app.redis.clone();
    let void: std::collections::HashMap<String, String> =
        r.hgetall(app.key(&sku, "void")).await.unwrap();
    assert_eq!(void.values().filter(|v| *v == "void").count(), 11);
    // Their entries stay in the stream (the workers, unable to confirm a
    // batch on a replica either, persist none of it; they would ack void
    // entries without a row).
    assert_eq!(app.stream_len(&sku).await, 11);
    assert!(app.order_rows(&sku).await.is_empty());
}
