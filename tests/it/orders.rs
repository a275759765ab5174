//! The order path: concurrency, per-user limits, idempotency, the sale window.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{
    Backend, assert_refused, now_ms, product_body, spawn_app, spawn_app_on, status_code, unique,
};

async fn two_thousand_buyers_for_one_hundred_units_never_oversell(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(100, 1).await;
    let mut set = JoinSet::new();
    for user in 1..=2000u64 {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
        set.spawn(async move {
            let resp = client
                .post(url)
                .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
                .send()
                .await
                .expect("answered");
            status_code(resp).await
        });
    }
    let (mut accepted, mut sold_out) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.expect("task") {
            (StatusCode::ACCEPTED, _) => accepted += 1,
            (StatusCode::CONFLICT, code) if code == "sold_out" => sold_out += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(accepted, 100);
    assert_eq!(sold_out, 1900);
    assert_eq!(app.stock(&sku).await, Some(0));
    assert_eq!(app.stream_len(&sku).await, 100);
}

async fn one_user_firing_fifty_orders_gets_exactly_the_limit(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(100, 2).await;
    let mut set = JoinSet::new();
    for _ in 0..50 {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
        set.spawn(async move {
            let resp = client
                .post(url)
                .json(&json!({"user_id": 7, "product_id": sku, "quantity": 1}))
                .send()
                .await
                .expect("answered");
            status_code(resp).await
        });
    }
    let mut accepted = 0;
    while let Some(r) = set.join_next().await {
        match r.expect("task") {
            (StatusCode::ACCEPTED, _) => accepted += 1,
            (StatusCode::CONFLICT, code) => assert_eq!(code, "limit_exceeded"),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(accepted, 2);
    assert_eq!(app.bought(&sku, 7).await, 2);
    assert_eq!(app.stock(&sku).await, Some(98));
    assert_eq!(app.stream_len(&sku).await, 2);
}

async fn a_quantity_over_the_allowance_or_the_stock_is_refused_whole(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(5, 4).await;
    assert_eq!(
        status_code(app.place_order(1, &sku, 5).await).await.1,
        "limit_exceeded"
    );
    assert_eq!(
        app.place_order(1, &sku, 3).await.status(),
        StatusCode::ACCEPTED
    );
    // Refused by the script (a keyed order always reaches it), the buyer's
    // units are as they were: the script counts an order's units in, and
    // takes them back when it refuses.
    let keyed = json!({"user_id": 1, "product_id": sku, "quantity": 2});
    let resp = app.post_order(&keyed, Some(&unique("k-"))).await;
    assert_eq!(status_code(resp).await.1, "limit_exceeded");
    assert_eq!(app.bought(&sku, 1).await, 3);
    let resp = app.place_order(2, &sku, 3).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "insufficient_stock");
    assert!(body["message"].as_str().unwrap().contains('2'), "{body}");
    assert_eq!(app.stock(&sku).await, Some(2));
    assert_eq!(app.bought(&sku, 2).await, 0);
    assert_eq!(
        app.place_order(2, &sku, 2).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        status_code(app.place_order(3, &sku, 1).await).await.1,
        "sold_out"
    );
    assert_eq!(app.stream_len(&sku).await, 2);
}

async fn an_accepted_order_reads_back_pending_with_its_fields(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 3).await;
    let resp = app.place_order(42, &sku, 2).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let placed: Value = resp.json().await.unwrap();
    assert_eq!(placed["status"], "pending");
    assert_eq!(placed["price"], "4999");
    let id = placed["order_id"].as_str().unwrap();
    let got = app.get_json(&format!("/api/orders/{id}")).await;
    assert_eq!(got, (StatusCode::OK, placed.clone()));

    // The stream entry is plain text an operator can read with XRANGE.
    let mut r = app.redis.clone();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(app.key(&sku, "orders"))
        .arg("-")
        .arg("+")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    // One field, `order`: the order as JSON (no Idempotency-Key here, so
    // no `idempotency_key` field).
    assert_eq!(entries[0].1.len(), 1, "{entries:?}");
    let (name, json) = &entries[0].1[0];
    assert_eq!(name, "order");
    let order: Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        order,
        serde_json::json!({
            "order_id": id,
            "user_id": 42,
            "quantity": 2,
            "price": "4999",
            "created_ms": placed["created"],
        })
    );

    for missing in [
        format!("{sku}:0123456789abcdef0123456789abcdef"),
        "nonsense".into(),
    ] {
        let resp = app
            .client
            .get(app.url(&format!("/api/orders/{missing}")))
            .send()
            .await
            .unwrap();
        assert_eq!(
            status_code(resp).await,
            (StatusCode::NOT_FOUND, "order_not_found".into())
        );
    }
}

async fn a_repeated_idempotency_key_returns_the_first_order_and_deducts_once(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 5).await;
    let body = json!({"user_id": 9, "product_id": sku, "quantity": 2});
    let first = app.post_order(&body, Some("key-1")).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();
    let again = app.post_order(&body, Some("key-1")).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(app.stock(&sku).await, Some(8));

    // The same key for a different order is a client bug, not a replay.
    let other = json!({"user_id": 9, "product_id": sku, "quantity": 1});
    assert_refused(
        app.post_order(&other, Some("key-1")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    // Keys are per user: another user's "key-1" is a new order.
    let user2 = json!({"user_id": 10, "product_id": sku, "quantity": 1});
    let resp: Value = app
        .post_order(&user2, Some("key-1"))
        .await
        .json()
        .await
        .unwrap();
    assert_ne!(resp["order_id"], first["order_id"]);
    assert_eq!(app.stock(&sku).await, Some(7));
    assert_eq!(app.stream_len(&sku).await, 2);
}

/// The longest Idempotency-Key the API takes is kept in the books too:
/// the order is persisted with it (a shorter column once sent such orders
/// to the dead letters), and its retry answers the first order.
#[tokio::test]
async fn an_order_with_the_longest_idempotency_key_is_persisted_with_it() {
    let app = spawn_app().await;
    let sku = app.new_sale(10, 5).await;
    let key = "k".repeat(flashsale::domain::MAX_IDEMPOTENCY_KEY_LEN);
    let body = json!({"user_id": 9, "product_id": sku, "quantity": 1});
    let first: Value = app
        .post_order(&body, Some(&key))
        .await
        .json()
        .await
        .unwrap();
    app.drained(&sku, 1).await;
    let kept: Option<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM tb_order WHERE order_id = ?")
            .bind(first["order_id"].as_str().unwrap())
            .fetch_one(&app.mysql)
            .await
            .unwrap();
    assert_eq!(kept.as_deref(), Some(key.as_str()));
    assert!(app.dead_letters(&sku).await.is_empty());
    let again: Value = app
        .post_order(&body, Some(&key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["order_id"], first["order_id"]);
}

async fn concurrent_repeats_of_one_idempotency_key_deduct_once(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(100, 10).await;
    let mut set = JoinSet::new();
    for _ in 0..40 {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
        set.spawn(async move {
            let resp = client
                .post(url)
                .header("Idempotency-Key", "retry-me")
                .json(&json!({"user_id": 5, "product_id": sku, "quantity": 3}))
                .send()
                .await
                .expect("answered");
            assert_eq!(resp.status(), StatusCode::ACCEPTED);
            let v: Value = resp.json().await.unwrap();
            v["order_id"].as_str().unwrap().to_owned()
        });
    }
    let mut ids = std::collections::HashSet::new();
    while let Some(id) = set.join_next().await {
        ids.insert(id.expect("task"));
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(app.stock(&sku).await, Some(97));
    assert_eq!(app.bought(&sku, 5).await, 3);
    assert_eq!(app.stream_len(&sku).await, 1);
}

async fn orders_outside_the_window_are_refused_and_take_nothing(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let now = now_ms();
    let mut early = product_body(&unique("early-"), 10, 1);
    early["start_time"] = json!(now + 3_600_000);
    early["end_time"] = json!(now + 7_200_000);
    let early = app.sale_from(early).await;
    let mut late = product_body(&unique("late-"), 10, 1);
    late["start_time"] = json!(now - 7_200_000);
    late["end_time"] = json!(now - 1);
    let late = app.sale_from(late).await;

    for (sku, code) in [(&early, "sale_not_started"), (&late, "sale_ended")] {
        let (status, got) = status_code(app.place_order(1, sku, 1).await).await;
        assert_eq!((status, got.as_str()), (StatusCode::CONFLICT, code));
        assert_eq!(app.stock(sku).await, Some(10));
        assert_eq!(app.stream_len(sku).await, 0);
        assert_eq!(app.bought(sku, 1).await, 0);
    }
}

async fn orders_for_unknown_or_unopened_products_are_not_found(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let unopened = unique("sku-");
    assert_eq!(
        app.create_product(&product_body(&unopened, 10, 1))
            .await
            .status(),
        StatusCode::CREATED
    );
    for sku in [unopened.as_str(), "never-created"] {
        assert_refused(
            app.place_order(1, sku, 1).await,
            StatusCode::NOT_FOUND,
            "product_not_found",
        )
        .await;
        assert_eq!(app.stream_len(sku).await, 0);
    }
}

async fn released_units_return_once_even_when_released_twice(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(3, 2).await;
    let placed: Value = app.place_order(4, &sku, 2).await.json().await.unwrap();
    let (id, product) =
        flashsale::domain::OrderId::parse(placed["order_id"].as_str().unwrap()).unwrap();
    let order = app
        .sales
        .accepted()
        .find(&id, &product)
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(app.stock(&sku).await, Some(1));
    assert_eq!(
        app.sales.accepted().release(&order, 1).await.unwrap(),
        (true, 3)
    );
    assert_eq!(
        app.sales.accepted().release(&order, 1).await.unwrap(),
        (false, 3)
    );
    assert_eq!(app.bought(&sku, 4).await, 0);
    // The user's allowance is back too.
    assert_eq!(
        app.place_order(4, &sku, 2).await.status(),
        StatusCode::ACCEPTED
    );
}

async fn orders_keep_working_after_redis_forgets_the_scripts(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(5, 1).await;
    let mut r = app.redis.clone();
    // As after a Redis restart: EVALSHA answers NOSCRIPT, and the script is sent again.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(app.stock(&sku).await, Some(4));
}

/// Many buyers, each sending two orders at once with an allowance of one:
/// each gets one 202 and one 409 (`limit_exceeded`), whether Redis or the
/// memory answers the second, and the stock falls by one per buyer.
async fn buyers_sending_two_orders_at_once_get_one_each(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(400, 1).await;
    let buyers = 150u64;
    let mut set = JoinSet::new();
    for user in 1..=buyers {
        for _ in 0..2 {
            let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
            set.spawn(async move {
                let resp = client
                    .post(url)
                    .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
                    .send()
                    .await
                    .expect("answered");
                (user, status_code(resp).await)
            });
        }
    }
    let mut answers = std::collections::HashMap::<u64, (u32, u32)>::new();
    while let Some(r) = set.join_next().await {
        let (user, answer) = r.expect("task");
        let counts = answers.entry(user).or_default();
        match answer {
            (StatusCode::ACCEPTED, _) => counts.0 += 1,
            (StatusCode::CONFLICT, code) if code == "limit_exceeded" => counts.1 += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    for user in 1..=buyers {
        assert_eq!(answers[&user], (1, 1), "buyer {user}: (202s, 409s)");
    }
    assert_eq!(app.stock(&sku).await, Some(400 - buyers as i64));
    assert_eq!(app.stream_len(&sku).await, buyers);
}

crate::on_both_backends!(
    buyers_sending_two_orders_at_once_get_one_each,
    two_thousand_buyers_for_one_hundred_units_never_oversell,
    one_user_firing_fifty_orders_gets_exactly_the_limit,
    a_quantity_over_the_allowance_or_the_stock_is_refused_whole,
    an_accepted_order_reads_back_pending_with_its_fields,
    a_repeated_idempotency_key_returns_the_first_order_and_deducts_once,
    concurrent_repeats_of_one_idempotency_key_deduct_once,
    orders_outside_the_window_are_refused_and_take_nothing,
    orders_for_unknown_or_unopened_products_are_not_found,
    released_units_return_once_even_when_released_twice,
    orders_keep_working_after_redis_forgets_the_scripts,
);
