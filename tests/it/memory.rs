//! Orders that cannot change the books are answered from memory (the sale
//! window by Redis's clock, buyers at their limit, unknown products): no
//! Redis call for them, and never a refusal Redis would not give.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    Backend, TestApp, eventually, metric, now_ms, product_body, spawn_app_on, spawn_app_with,
    status_code, unique, until,
};

/// `POST /api/orders` to the instance at `base`.
async fn order_at(app: &TestApp, base: &str, user: u64, sku: &str, key: Option<&str>) -> Response {
    let mut req = app
        .client
        .post(format!("{base}/api/orders"))
        .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}));
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    req.send().await.expect("request sent")
}

/// The order script's calls an instance has made.
fn order_calls(sales: &flashsale::sale::Sales) -> u64 {
    sales.counts().get(flashsale::sale::Counter::OrderCalls)
}

fn answered(outcome: &str, by: &str) -> String {
    format!("flashsale_order_requests_total{{answered_by=\"{by}\",outcome=\"{outcome}\"}}")
}

/// A sale with the window `[start, end)` (epoch ms), opened through `app`.
async fn sale_between(app: &TestApp, stock: u64, limit: u64, start: i64, end: i64) -> String {
    let id = unique("sku-");
    let mut body = product_body(&id, stock, limit);
    body["start_time"] = start.into();
    body["end_time"] = end.into();
    app.sale_from(body).await
}

async fn a_pre_start_storm_is_answered_from_memory_and_the_sale_opens_on_time(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let start = now_ms() + 2_500;
    let sku = sale_between(&app, 100, 1, start, start + 600_000).await;
    let calls = order_calls(&app.sales);
    let mut user = 0;
    while now_ms() < start - 300 {
        user += 1;
        // Every other one with an Idempotency-Key: before the start no
        // order can exist for it, so memory answers those too.
        let key = (user % 2 == 0).then(|| format!("k{user}"));
        let resp = order_at(&app, &app.base, user, &sku, key.as_deref()).await;
        let left_ms = start - now_ms();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let retry_after: i64 = resp.headers()["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["error"], "sale_not_started");
        assert_eq!(body["starts_at"], start, "{body}");
        let secs_left = (left_ms + 999) / 1000;
        assert!(
            (retry_after - secs_left).abs() <= 1 && retry_after >= 1,
            "Retry-After {retry_after} with {left_ms} ms to the start"
        );
    }
    let made = order_calls(&app.sales) - calls;
    assert!(user >= 50, "only {user} requests before the start");
    assert!(
        made <= 2,
        "{made} script calls for {user} requests before the start"
    );
    assert!(
        metric(&app, &app.base, &answered("sale_not_started", "memory")).await >= (user - 2) as f64
    );
    // Right after the start (by this machine's clock, which is Redis's
    // here), orders are accepted: memory does not hold them back.
    tokio::time::sleep(until(start + 5)).await;
    assert_eq!(
        order_at(&app, &app.base, 10_000, &sku, None).await.status(),
        StatusCode::ACCEPTED
    );
}

/// What one order got, and when it was sent and answered (epoch ms).
struct Sent {
    sent: i64,
    answered: i64,
    status: StatusCode,
    code: String,
    instance: usize,
}

#[tokio::test]
async fn instances_with_skewed_clocks_neither_refuse_valid_orders_nor_accept_outside_the_window() {
    // Two instances: this machine's clock (Redis's too) is the truth; one
    // instance runs 5 s ahead of it, the other 5 s behind.
    let app = spawn_app_with(|s| s.http.memory.clock_skew_ms = 5_000).await;
    let start = now_ms() + 2_000;
    let end = start + 2_000;
    let sku = sale_between(&app, 100_000, 1, start, end).await;
    let behind = app
        .serve_beside(|s| s.http.memory.clock_skew_ms = -5_000)
        .await;
    let bases = [app.base.clone(), behind.base.clone()];
    let mut log = Vec::new();
    let mut user = 0;
    while now_ms() < end + 600 {
        user += 1;
        let instance = (user % 2) as usize;
        let sent = now_ms();
        let resp = order_at(&app, &bases[instance], user, &sku, None).await;
        let answered = now_ms();
        let (status, code) = status_code(resp).await;
        log.push(Sent {
            sent,
            answered,
            status,
            code,
            instance,
        });
    }
    let mut accepted = [0; 2];
    for s in &log {
        let what = format!(
            "instance {} (skew {}): sent {} ms, answered {} ms after the start: {} {}",
            s.instance,
            if s.instance == 0 { "+5 s" } else { "-5 s" },
            s.sent - start,
            s.answered - start,
            s.status,
            s.code
        );
        if s.answered < start {
            assert_eq!(s.code, "sale_not_started", "{what}");
        } else if s.sent >= start + 5 && s.answered <= end - 5 {
            assert_eq!(s.status, StatusCode::ACCEPTED, "{what}");
            accepted[s.instance] += 1;
        } else if s.sent >= end + 5 {
            assert_eq!(s.code, "sale_ended", "{what}");
        }
    }
    assert!(accepted.iter().all(|&n| n >= 20), "accepted {accepted:?}");
    // Both answered most of the crowd outside the window from memory.
    outside_the_window_from_memory(&app, &bases, &log, start, end).await;
}

/// Most of what each instance in `bases` answered before `start` and after
/// `end` came from its memory (its metrics say so).
async fn outside_the_window_from_memory(
    app: &TestApp,
    bases: &[String],
    log: &[Sent],
    start: i64,
    end: i64,
) {
    for (i, base) in bases.iter().enumerate() {
        let early = log
            .iter()
            .filter(|s| s.instance == i && s.answered < start)
            .count() as f64;
        let late = log
            .iter()
            .filter(|s| s.instance == i && s.sent >= end + 5)
            .count() as f64;
        let from_memory = metric(app, base, &answered("sale_not_started", "memory")).await;
        assert!(
            from_memory >= early * 0.8,
            "instance {i}: {from_memory} of {early} early orders from memory"
        );
        let ended = metric(app, base, &answered("sale_ended", "memory")).await;
        assert!(
            ended >= late * 0.5,
            "instance {i}: {ended} of {late} late orders from memory"
        );
    }
}

#[tokio::test]
async fn a_buyer_at_the_limit_is_answered_from_memory_and_can_buy_again_after_a_cancel() {
    let ttl = Duration::from_millis(1_500);
    let app = spawn_app_with(|s| s.http.memory.limit_ttl = ttl).await;
    let sku = app.new_sale(10, 1).await;
    let other = app.serve_beside(|_| {}).await;
    let (here, there) = (app.base.clone(), other.base.clone());

    // User 1 buys here; asking again is answered from memory.
    let order: Value = order_at(&app, &here, 1, &sku, None)
        .await
        .json()
        .await
        .expect("order");
    let calls = order_calls(&app.sales);
    for _ in 0..5 {
        let (status, code) = status_code(order_at(&app, &here, 1, &sku, None).await).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::CONFLICT, "limit_exceeded")
        );
    }
    assert_eq!(order_calls(&app.sales), calls, "answered from memory");
    // A keyed retry still reaches Redis and gets its order back.
    let keyed = order_at(&app, &here, 2, &sku, Some("k2")).await;
    assert_eq!(keyed.status(), StatusCode::ACCEPTED);
    let again = order_at(&app, &here, 2, &sku, Some("k2")).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");

    // The other instance learns it once, then answers from memory too.
    let calls = order_calls(&other.sales);
    for _ in 0..5 {
        let (_, code) = status_code(order_at(&app, &there, 1, &sku, None).await).await;
        assert_eq!(code, "limit_exceeded");
    }
    assert_eq!(order_calls(&other.sales), calls + 1);

    // Cancelled here (persisted first, so its units come back at once):
    // here the buyer may buy again at once ...
    app.drained(&sku, 2).await;
    let order_id = order["order_id"].as_str().expect("id");
    assert_eq!(app.cancel(order_id, 1).await.status(), StatusCode::OK);
    // ... and on the other instance within the mark's lifetime.
    eventually(
        "accepted again within the mark's lifetime",
        ttl + Duration::from_millis(500),
        || async {
            let (status, code) = status_code(order_at(&app, &there, 1, &sku, None).await).await;
            if status != StatusCode::ACCEPTED {
                assert_eq!(code, "limit_exceeded");
            }
            status == StatusCode::ACCEPTED
        },
    )
    .await;
    assert_eq!(app.bought(&sku, 1).await, 1);
}

#[tokio::test]
async fn a_release_through_this_instance_clears_the_buyers_mark_at_once() {
    let app = spawn_app_with(|s| s.http.memory.limit_ttl = Duration::from_secs(60)).await;
    let sku = app.new_sale(10, 1).await;
    let order: Value = app
        .place_order(1, &sku, 1)
        .await
        .json()
        .await
        .expect("order");
    let (_, code) = status_code(app.place_order(1, &sku, 1).await).await;
    assert_eq!(code, "limit_exceeded");
    app.drained(&sku, 1).await;
    let order_id = order["order_id"].as_str().expect("id");
    assert_eq!(app.cancel(order_id, 1).await.status(), StatusCode::OK);
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
}

#[tokio::test]
async fn unknown_products_are_answered_from_memory_and_a_sale_opened_elsewhere_is_found_in_time() {
    let app = spawn_app_with(|_| {}).await;
    // The instance the sale is opened through, once its books answer (it
    // starts without waiting for them; this test is about `app`'s memory).
    let other = app.serve_beside(|_| {}).await.ready().await;
    let calls = order_calls(&app.sales);
    for n in 0..300 {
        let sku = unique(&format!("made-up-{n}-"));
        let (status, code) = status_code(order_at(&app, &app.base, 1, &sku, None).await).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::NOT_FOUND, "product_not_found")
        );
    }
    let made = order_calls(&app.sales) - calls;
    assert!(made <= 3, "{made} script calls for 300 made-up ids");

    // Opened through the other instance: found here within the registry
    // read's lifetime (1 s by default).
    let id = unique("sku-");
    let body = product_body(&id, 5, 1);
    let created = app
        .client
        .post(format!("{}/api/admin/products", other.base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), StatusCode::CREATED);
    let opened = app
        .client
        .post(format!("{}/api/admin/products/{id}/open", other.base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(opened.status(), StatusCode::OK);
    eventually(
        "found within 1.5 s of its opening",
        Duration::from_millis(1_500),
        || async {
            let (status, code) = status_code(order_at(&app, &app.base, 1, &id, None).await).await;
            if status != StatusCode::ACCEPTED {
                assert_eq!(code, "product_not_found");
            }
            status == StatusCode::ACCEPTED
        },
    )
    .await;
}

crate::on_both_backends!(a_pre_start_storm_is_answered_from_memory_and_the_sale_opens_on_time);
