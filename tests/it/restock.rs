//! Restocking an open sale: units added (or taken away, never more than
//! are left) atomically with the orders, once per Idempotency-Key, in
//! Redis and in the books alike; under a burst on two instances no unit
//! is lost or made; on a single Redis and on a cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_error, eventually, spawn_app_on};

async fn restock(app: &TestApp, sku: &str, units: i64, key: Option<&str>) -> (StatusCode, Value) {
    let mut req = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"units": units}));
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.expect("answered");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn units_added_sell_and_a_retry_adds_nothing(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(3, 10).await;
    app.accept_orders(&sku, 1..=3).await;
    assert_eq!(
        app.place_order(4, &sku, 1).await.status(),
        StatusCode::CONFLICT,
        "sold out"
    );

    let (status, done) = restock(&app, &sku, 5, Some("pallet-2")).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["applied"], true);
    assert_eq!(done["product"]["stock"], 5);
    assert_eq!(done["product"]["initial_qty"], 8);
    // The same restock again (a retry): nothing more.
    let (status, again) = restock(&app, &sku, 5, Some("pallet-2")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["applied"], false);
    assert_eq!(again["product"]["stock"], 5);
    assert_eq!(again["product"]["initial_qty"], 8);
    // The new units sell, and no more.
    app.accept_orders(&sku, 4..=8).await;
    let resp = app.place_order(9, &sku, 1).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "sold_out");
    // Taking away more than are left: refused, nothing changed.
    let (status, body) = restock(&app, &sku, -1, None).await;
    assert_error(status, &body, StatusCode::CONFLICT, "insufficient_stock");
    assert_eq!(app.stock(&sku).await, Some(0));
    let (status, _) = restock(&app, &sku, 4, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, done) = restock(&app, &sku, -3, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["product"]["stock"], 1);
    assert_eq!(done["product"]["initial_qty"], 9);
    let (status, body) = restock(&app, &sku, 0, None).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");

    app.drained(&sku, 8).await;
    let audit = app.audit(&sku).await;
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(audit["audit"]["restocked"], 6);
    assert_eq!(audit["audit"]["initial"], 9);
    // Listed once settled (the feed's rule): one event per restock.
    eventually("the restocks' events", Duration::from_secs(10), || async {
        let events = app.events(200).await;
        events
            .iter()
            .filter(|e| e["type"] == "sale.restocked")
            .count()
            == 3
    })
    .await;
}

/// Two instances taking a burst while restocks add and take away units:
/// every 202 is in the stream, and the stock is what the sale started
/// with plus what the restocks applied minus what was sold.
async fn restocks_racing_a_burst_lose_and_make_no_unit(backend: Backend) {
    let app = Arc::new(spawn_app_on(backend, |_| {}).await);
    let other = app.serve_beside(|_| {}).await;
    let bases = [app.base.clone(), other.base.clone()];
    let sku = app.new_sale(60, 1_000).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..8u64 {
        let (app, sku, base) = (app.clone(), sku.clone(), bases[(c % 2) as usize].clone());
        let (accepted, stop) = (accepted.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let resp = app
                    .client
                    .post(format!("{base}/api/orders"))
                    .json(&json!({"user_id": 1 + c, "product_id": sku, "quantity": 1}))
                    .send()
                    .await
                    .expect("answered");
                match resp.status() {
                    StatusCode::ACCEPTED => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                    }
                    StatusCode::CONFLICT => {}
                    other => panic!("{other}"),
                }
            }
        }));
    }
    let mut applied: i64 = 0;
    for round in 0..30 {
        let units = if round % 3 == 2 { -7 } else { 10 };
        let (status, body) = restock(&app, &sku, units, None).await;
        match status {
            StatusCode::OK => applied += units,
            StatusCode::CONFLICT => assert_eq!(body["error"], "insufficient_stock", "{body}"),
            other => panic!("{other} {body}"),
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    let total = accepted.load(Ordering::SeqCst);
    let stock = app.stock(&sku).await.expect("the sale");
    assert_eq!(stock, 60 + applied - total as i64, "no unit lost or made");
    assert_eq!(app.stream_len(&sku).await, total, "every 202 in the stream");
    app.drained(&sku, total as i64).await;
    let audit = app.audit(&sku).await;
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(audit["audit"]["initial"], 60 + applied);
}

crate::on_both_backends!(
    units_added_sell_and_a_retry_adds_nothing,
    restocks_racing_a_burst_lose_and_make_no_unit,
);

/// The reconciler after a Redis failover: a reconciler that has not seen
/// the sale's master yet (as after one).
fn fresh_reconciler(app: &TestApp) -> flashsale::worker::reconciler::Reconciler {
    flashsale::worker::reconciler::Reconciler::new(
        (app.sales.lifecycle().clone(), app.sales.ledger().clone()),
        (app.db.orders(), app.db.products()),
    )
}

/// Restocks the Redis master lost (a failover after them, before their
/// replication) are made again from the books by the reconciler, once,
/// counted as repaired; a sale rebuilt by `flashsale recover` counts them
/// in its stock once, and neither the reconciler nor an operator's retry
/// adds them again.
#[tokio::test]
async fn restocks_redis_lost_are_made_again_from_the_books_once() {
    let app = crate::helpers::spawn_app().await;
    let sku = app.new_sale(3, 1).await;
    assert_eq!(
        restock(&app, &sku, 5, Some("pallet-2")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        restock(&app, &sku, -2, Some("damaged")).await.0,
        StatusCode::OK
    );
    // The new master never got them: the stock and `initial` as before
    // them, and no record of either.
    let mut r = app.redis.clone();
    let _: () = redis::pipe()
        .cmd("DECRBY")
        .arg(app.key(&sku, "stock"))
        .arg(3)
        .ignore()
        .cmd("HINCRBY")
        .arg(app.key(&sku, "sale"))
        .arg("initial")
        .arg(-3)
        .ignore()
        .cmd("DEL")
        .arg(app.key(&sku, "restocks"))
        .ignore()
        .query_async(&mut r)
        .await
        .unwrap();
    for user in 1..=3 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }
    assert_eq!(
        app.place_order(4, &sku, 1).await.status(),
        StatusCode::CONFLICT
    );

    assert!(fresh_reconciler(&app).check().await.unwrap() >= 1);
    assert_eq!(app.stock(&sku).await, Some(3), "3 + 5 - 2 - 3 sold");
    // Once: another reconciler, and the operator's retry, add nothing.
    assert!(fresh_reconciler(&app).check().await.unwrap() >= 1);
    assert_eq!(app.stock(&sku).await, Some(3));
    let (status, again) = restock(&app, &sku, 5, Some("pallet-2")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["applied"], false, "{again}");
    for user in 4..=6 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }
    assert_eq!(
        app.place_order(7, &sku, 1).await.status(),
        StatusCode::CONFLICT
    );
    app.drained(&sku, 6).await;
    let audit = app.audit(&sku).await;
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(audit["audit"]["repaired"]["restocks"], 2, "{audit}");
    assert_eq!(audit["audit"]["repaired"]["restock_units"], 3, "{audit}");

    // Redis loses the sale; rebuilt from the books, whose initial counts
    // the restocks: sold out, and it stays so.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{sku}}}:*", app.prefix))
        .query_async(&mut r)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut r)
        .await
        .unwrap();
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let done = app
        .recovery()
        .recover(&product, flashsale::bookkeeping::recover::Overwrite::Refuse)
        .await
        .unwrap();
    assert_eq!(done.stock, 0, "{done:?}");
    assert!(fresh_reconciler(&app).check().await.unwrap() >= 1);
    assert_eq!(app.stock(&sku).await, Some(0), "restocks made twice");
    let (status, again) = restock(&app, &sku, 5, Some("pallet-2")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["applied"], false, "{again}");
    assert_eq!(
        app.place_order(7, &sku, 1).await.status(),
        StatusCode::CONFLICT
    );
}
