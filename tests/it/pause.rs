//! Pausing a sale and resuming it: every instance refuses orders from the
//! pause's answer on (`sale_paused`, `Retry-After`), nothing is written,
//! a keyed retry of an earlier order still gets its answer; the room's
//! line stands still; events and the admin log say so; on a single Redis
//! and on a cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, TestApp, assert_error, eventually, now_ms, product_body, spawn_app_on, unique,
};

async fn order_at(
    app: &TestApp,
    base: &str,
    user: u64,
    sku: &str,
    key: Option<&str>,
) -> reqwest::Response {
    let mut req = app
        .client
        .post(format!("{base}/api/orders"))
        .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}));
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    req.send().await.expect("answered")
}

/// The events list one pause and one resume; the admin log's newest
/// entries are the resume and the two pause requests.
async fn one_pause_one_resume_recorded(app: &TestApp) {
    eventually("the events listed", Duration::from_secs(10), || async {
        let types: Vec<String> = app
            .events(100)
            .await
            .iter()
            .filter_map(|e| e["type"].as_str().map(str::to_owned))
            .filter(|t| t.starts_with("sale.p") || t.starts_with("sale.r"))
            .collect();
        types == ["sale.paused", "sale.resumed"]
    })
    .await;
    let log = app.admin_log().await;
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(&actions[..3], ["sale.resume", "sale.pause", "sale.pause"]);
}

async fn a_paused_sale_refuses_orders_everywhere_and_writes_nothing(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let other = app.serve_beside(|_| {}).await;
    let bases = [app.base.clone(), other.base.clone()];
    let sku = app.new_sale(100, 5).await;
    let first = order_at(&app, &bases[0], 1, &sku, Some("k-1")).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();

    let (status, paused) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert!(paused["paused"].as_i64().is_some(), "{paused}");
    // Again: the same, one pause.
    let (status, again) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["paused"], paused["paused"]);

    let (stock, stream) = (app.stock(&sku).await, app.stream_len(&sku).await);
    for (i, base) in bases.iter().enumerate() {
        for user in 10..15u64 {
            let resp = order_at(&app, base, user + 10 * i as u64, &sku, None).await;
            assert_eq!(resp.status(), StatusCode::CONFLICT);
            assert_eq!(resp.headers()["retry-after"], "5");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"], "sale_paused", "{body}");
        }
    }
    // A keyed retry of the order accepted before: its answer, again.
    let retry = order_at(&app, &bases[1], 1, &sku, Some("k-1")).await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry["order_id"], first["order_id"]);
    assert_eq!(app.stock(&sku).await, stock, "nothing taken");
    assert_eq!(
        app.stream_len(&sku).await,
        stream,
        "nothing appended to the stream"
    );
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(product["paused"], paused["paused"]);

    let (status, live) = app
        .admin_post(&format!("/api/admin/products/{sku}/resume"))
        .await;
    assert_eq!(status, StatusCode::OK, "{live}");
    assert_eq!(live["paused"], Value::Null);
    for base in &bases {
        let resp = order_at(&app, base, 2, &sku, None).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }
    // The events: one pause, one resume; the admin log has both.
    one_pause_one_resume_recorded(&app).await;
    app.drained(&sku, 3).await;
    app.books_balance(&sku).await;
}

/// A client ordering for `user` from the instance at `base` until `stop`,
/// counting its 202s in `accepted`: how many it got for orders sent while
/// `paused` held from before the send until the answer.
async fn ordering_client(
    app: Arc<TestApp>,
    base: String,
    sku: String,
    user: u64,
    (paused, accepted, stop): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicBool>),
) -> u64 {
    let mut wrong = 0;
    while !stop.load(Ordering::SeqCst) {
        // Read before sending: an order sent while paused.
        let was_paused = paused.load(Ordering::SeqCst);
        let resp = order_at(&app, &base, user, &sku, None).await;
        match resp.status() {
            StatusCode::ACCEPTED => {
                accepted.fetch_add(1, Ordering::SeqCst);
                // Accepted though it was sent after the pause's answer.
                wrong += u64::from(was_paused && paused.load(Ordering::SeqCst));
            }
            StatusCode::CONFLICT => {}
            other => panic!("{other}"),
        }
    }
    wrong
}

/// Two instances taking a burst from eight clients; the sale paused and
/// resumed in the middle of it: no order sent after the pause's answer
/// and before the resume's request is accepted, and every 202 is in the
/// stream, its unit off the stock (none lost, none made).
async fn a_pause_in_the_middle_of_a_burst_takes_effect_at_once(backend: Backend) {
    let app = Arc::new(spawn_app_on(backend, |_| {}).await);
    let other = app.serve_beside(|_| {}).await;
    let bases = [app.base.clone(), other.base.clone()];
    let sku = app.new_sale(5_000, 1_000).await;
    let paused = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8u64)
        .map(|c| {
            let flags = (paused.clone(), accepted.clone(), stop.clone());
            let base = bases[(c % 2) as usize].clone();
            let client = ordering_client(app.clone(), base, sku.clone(), 1 + c, flags);
            tokio::spawn(client)
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    paused.store(true, Ordering::SeqCst);
    let at_pause = accepted.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Cleared before the resume is asked: an order accepted from here on
    // may be the resume's.
    paused.store(false, Ordering::SeqCst);
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/resume"))
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut wrong = 0;
    for c in clients {
        wrong += c.await.unwrap();
    }
    let total = accepted.load(Ordering::SeqCst);
    assert_eq!(wrong, 0, "orders accepted while paused");
    assert!(
        at_pause > 0 && total > at_pause,
        "orders before and after: {at_pause}, {total}"
    );
    assert_eq!(
        app.stream_len(&sku).await,
        total,
        "every 202 in the stream, nothing else"
    );
    assert_eq!(
        app.stock(&sku).await,
        Some(5_000 - total as i64),
        "no unit lost or made"
    );
    app.drained(&sku, total as i64).await;
    app.books_balance(&sku).await;
}

crate::on_both_backends!(
    a_paused_sale_refuses_orders_everywhere_and_writes_nothing,
    a_pause_in_the_middle_of_a_burst_takes_effect_at_once,
);

/// The waiting room's line stands still while the sale is paused and
/// moves on from where it stood after the resume.
#[tokio::test]
async fn the_line_stands_still_while_paused() {
    let app = crate::helpers::spawn_app().await;
    let sku = unique("room-");
    let mut body = product_body(&sku, 1_000, 1);
    body["start_time"] = json!(now_ms() - 1_000);
    body["waiting_room"] =
        json!({"ceiling_per_sec": 20, "admission_secs": 60, "join_early_secs": 600});
    app.sale_from(body).await;
    for user in 1..=200u64 {
        let resp = app
            .client
            .post(app.url(&format!("/api/sales/{sku}/queue")))
            .json(&json!({"user_id": user}))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    let admitted = || async {
        let text = app.metrics_text().await;
        let series = format!("flashsale_room_admitted{{product_id=\"{sku}\"}} ");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&series)
                    .map(|v| v.trim().parse::<u64>().unwrap())
            })
            .unwrap_or(0)
    };
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    // Past the instances' readings of the room (a second each).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before = admitted().await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(admitted().await, before, "the line moved while paused");
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/resume"))
        .await;
    assert_eq!(status, StatusCode::OK);
    eventually("the line moves again", Duration::from_secs(10), || async {
        admitted().await > before
    })
    .await;
}

/// Refused for a sale that is not open, or closed.
#[tokio::test]
async fn only_an_open_sale_can_be_paused() {
    let app = crate::helpers::spawn_app().await;
    let sku = unique("sku-");
    assert_eq!(
        app.create_product(&product_body(&sku, 5, 1)).await.status(),
        StatusCode::CREATED
    );
    let (status, body) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_error(status, &body, StatusCode::CONFLICT, "invalid_transition");
    assert_eq!(app.open_sale(&sku).await.status(), StatusCode::OK);
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/close"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_error(status, &body, StatusCode::CONFLICT, "sale_closed");
    let (status, body) = app.admin_post("/api/admin/products/nope/pause").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "product_not_found");
}

/// Past its end a sale is not paused (a pause would hold nothing back, and
/// the shop would hear `sale.paused` of it): `409 sale_ended`, no event;
/// one paused before its end is still resumed.
#[tokio::test]
async fn an_ended_sale_is_not_paused() {
    let app = crate::helpers::spawn_app().await;
    let end = crate::helpers::now_ms() + 1_500;
    let mut body = product_body(&unique("sku-"), 5, 1);
    body["end_time"] = serde_json::json!(end);
    let sku = app.sale_from(body.clone()).await;
    let mut paused_body = product_body(&unique("sku-"), 5, 1);
    paused_body["end_time"] = serde_json::json!(end);
    let paused = app.sale_from(paused_body).await;
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{paused}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(crate::helpers::until(end + 100)).await;
    let (status, body) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_error(status, &body, StatusCode::CONFLICT, "sale_ended");
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert!(product["paused"].is_null(), "{product}");
    let (events,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM tb_event WHERE product_id = ? AND type = 'sale.paused'",
    )
    .bind(&sku)
    .fetch_one(&app.mysql)
    .await
    .unwrap();
    assert_eq!(events, 0, "no sale.paused told");
    let (status, body) = app
        .admin_post(&format!("/api/admin/products/{paused}/resume"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["paused"].is_null(), "{body}");
}

/// A pause the Redis master lost (a failover without WAIT, after the
/// pause and before its replication): the reconciler pauses the sale
/// again, as the books have it.
#[tokio::test]
async fn a_pause_redis_lost_is_restored_from_the_books() {
    let app = crate::helpers::spawn_app().await;
    let sku = app.new_sale(10, 1).await;
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut r = app.redis.clone();
    let _: () = redis::cmd("HDEL")
        .arg(app.key(&sku, "sale"))
        .arg("paused_ms")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED,
        "the lost pause"
    );
    // A reconciler that has not seen the sale's master yet (as after a
    // failover): the pause is back.
    let mut reconciler = flashsale::worker::reconciler::Reconciler::new(
        (app.sales.lifecycle().clone(), app.sales.ledger().clone()),
        (app.db.orders(), app.db.products()),
    );
    assert!(reconciler.check().await.unwrap() >= 1);
    let resp = app.place_order(2, &sku, 1).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "sale_paused");
}

/// A paused sale Redis lost, rebuilt from the books by `flashsale
/// recover`: it opens paused, in the same step (no order gets in between).
#[tokio::test]
async fn a_paused_sale_recovered_from_the_books_opens_paused() {
    let app = crate::helpers::spawn_app().await;
    let sku = app.new_sale(10, 1).await;
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/pause"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut r = app.redis.clone();
    for name in ["sale", "stock", "bought", "idem", "orders", "accepted"] {
        let _: () = redis::cmd("DEL")
            .arg(app.key(&sku, name))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let done = app
        .recovery()
        .recover(&product, flashsale::bookkeeping::recover::Overwrite::Refuse)
        .await
        .unwrap();
    assert_eq!(done.stock, 10, "{done:?}");
    assert_eq!(app.stock(&sku).await, Some(10), "the stock rebuilt");
    let resp = app.place_order(1, &sku, 1).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "sale_paused");
    let (status, _) = app
        .admin_post(&format!("/api/admin/products/{sku}/resume"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let resp = app.place_order(1, &sku, 1).await;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}
