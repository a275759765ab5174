//! Pay, cancel, the payment timeout, interrupted cancels, the audit and
//! recovery: the books balance through all of them.

use std::time::Duration;

use flashsale::bookkeeping::audit;
use flashsale::bookkeeping::recover::Overwrite;
use flashsale::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId};
use flashsale::sale::{Booked, BookedState, Restore};
use flashsale::worker::Workers;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{
    ADMIN_TOKEN, Backend, TestApp, assert_error, fast_workers, spawn_app_on, status_code,
};

fn pid(sku: &str) -> ProductId {
    ProductId::parse(sku).unwrap()
}

/// Places an order and waits until a worker confirmed it; returns its id.
async fn buy(app: &TestApp, user: u64, sku: &str, quantity: u64) -> String {
    buy_keyed(app, user, sku, quantity, None).await
}

/// `buy`, under an Idempotency-Key when given.
async fn buy_keyed(
    app: &TestApp,
    user: u64,
    sku: &str,
    quantity: u64,
    key: Option<&str>,
) -> String {
    let body = json!({"user_id": user, "product_id": sku, "quantity": quantity});
    let resp = app.post_order(&body, key).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let v: Value = resp.json().await.unwrap();
    let id = v["order_id"].as_str().unwrap().to_owned();
    crate::helpers::eventually("order confirmed", Duration::from_secs(20), || async {
        app.get_json(&format!("/api/orders/{id}")).await.1["status"] == "confirmed"
    })
    .await;
    id
}

async fn books_balance(app: &TestApp, sku: &str) -> audit::SaleAudit {
    let product = app.db.products().product(&pid(sku)).await.unwrap().unwrap();
    let a = app.audit_of().sale(&product).await.unwrap();
    assert!(a.ok(), "books do not balance: {a:#?}");
    a
}

async fn buy_pay_cancel_move_the_status_and_the_stock(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(5, 2).await;
    let paid = buy(&app, 1, &sku, 1).await;
    let (status, order) = app.act(&paid, "pay", 1).await;
    assert_eq!(
        (status, order["status"].as_str()),
        (StatusCode::OK, Some("paid"))
    );
    assert_eq!(
        app.act(&paid, "pay", 1).await.0,
        StatusCode::OK,
        "paying twice is harmless"
    );
    let (status, err) = app.act(&paid, "cancel", 1).await;
    assert_error(status, &err, StatusCode::CONFLICT, "invalid_transition");

    let cancelled = buy(&app, 2, &sku, 2).await;
    assert_eq!(app.stock(&sku).await, Some(2));
    let (status, err) = app.act(&cancelled, "cancel", 1).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "forbidden");
    let (status, order) = app.act(&cancelled, "cancel", 2).await;
    assert_eq!(
        (status, order["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    assert_eq!(app.stock(&sku).await, Some(4), "the units are back on sale");
    assert_eq!(app.available_qty(&sku).await, 4);
    assert_eq!(
        app.bought(&sku, 2).await,
        0,
        "and back in the buyer's allowance"
    );
    assert_eq!(
        app.act(&cancelled, "cancel", 2).await.0,
        StatusCode::OK,
        "cancelling twice is harmless"
    );
    assert_eq!(app.stock(&sku).await, Some(4), "and returns nothing twice");
    let (status, err) = app.act(&cancelled, "pay", 2).await;
    assert_error(status, &err, StatusCode::CONFLICT, "invalid_transition");
    let unknown = format!("{sku}:0123456789abcdef0123456789abcdef");
    assert_eq!(
        app.act(&unknown, "cancel", 2).await.0,
        StatusCode::NOT_FOUND
    );
    // The buyer may buy again.
    buy(&app, 2, &sku, 2).await;
    books_balance(&app, &sku).await;
}

async fn a_hundred_concurrent_cancels_release_the_units_once(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 3).await;
    let id = buy(&app, 7, &sku, 3).await;
    let mut set = JoinSet::new();
    for _ in 0..100 {
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/api/orders/{id}/cancel")),
        );
        set.spawn(async move {
            client
                .post(url)
                .json(&json!({"user_id": 7}))
                .send()
                .await
                .unwrap()
                .status()
        });
    }
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    assert_eq!(app.stock(&sku).await, Some(10));
    assert_eq!(app.available_qty(&sku).await, 10);
    assert_eq!(app.bought(&sku, 7).await, 0);
    books_balance(&app, &sku).await;
}

/// A crowd that left more orders unpaid than one query takes (200) is
/// cancelled in one pass, not 200 a pass (a sale waits for them to retire).
async fn one_sweep_cancels_a_crowd_of_unpaid_orders(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let mut cfg = fast_workers("w");
    cfg.payment_timeout = Duration::ZERO;
    let workers = Workers::new(&app.sales, &app.db, cfg);
    let sku = app.new_sale(450, 1).await;
    app.accept_orders(&sku, 1..=450).await;
    let mut drain = workers.sale_worker(pid(&sku));
    while app.persisted(&sku).await.0 < 450 {
        drain.step().await.unwrap();
    }
    let swept = workers.sweeper().sweep().await.unwrap();
    assert_eq!(swept.expired, 450);
    assert_eq!(app.stock(&sku).await, Some(450));
    books_balance(&app, &sku).await;
}

async fn cancels_racing_the_payment_timeout_release_once(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let mut cfg = fast_workers("w");
    cfg.payment_timeout = Duration::ZERO;
    let workers = Workers::new(&app.sales, &app.db, cfg);
    let sku = app.new_sale(10, 2).await;
    let run = tokio::spawn(
        workers
            .clone()
            .run(tokio_util::sync::CancellationToken::new()),
    );
    let mut ids = Vec::new();
    for user in 1..=4 {
        ids.push(buy(&app, user, &sku, 2).await);
    }
    run.abort();
    // Every confirmed order is past its (zero) payment timeout: the sweeper
    // and the owners cancel them at the same time.
    let mut set = JoinSet::new();
    for _ in 0..3 {
        let sweeper = workers.sweeper();
        set.spawn(async move {
            sweeper.sweep().await.unwrap();
        });
    }
    for (user, id) in (1..=4u64).zip(&ids) {
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/api/orders/{id}/cancel")),
        );
        set.spawn(async move {
            let status = client
                .post(url)
                .json(&json!({"user_id": user}))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status, StatusCode::OK);
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
    assert_eq!(app.stock(&sku).await, Some(10));
    assert_eq!(app.available_qty(&sku).await, 10);
    for id in &ids {
        assert_eq!(
            app.get_json(&format!("/api/orders/{id}")).await.1["status"],
            "cancelled"
        );
    }
    books_balance(&app, &sku).await;
}

async fn cancelled_units_of_a_sold_out_sale_sell_again_to_others(backend: Backend) {
    let app = spawn_app_on(backend, |s| {
        s.http.memory.sold_out_ttl = Duration::from_secs(60)
    })
    .await;
    let sku = app.new_sale(6, 1).await;
    let mut ids = Vec::new();
    for user in 1..=6 {
        ids.push(buy(&app, user, &sku, 1).await);
    }
    assert_eq!(
        status_code(app.place_order(100, &sku, 1).await).await.1,
        "sold_out"
    );
    for (user, id) in (1..=3u64).zip(&ids) {
        assert_eq!(app.act(id, "cancel", user).await.0, StatusCode::OK);
    }
    for user in 101..=103 {
        buy(&app, user, &sku, 1).await;
    }
    assert_eq!(
        status_code(app.place_order(104, &sku, 1).await).await.1,
        "sold_out"
    );
    let a = books_balance(&app, &sku).await;
    assert_eq!((a.confirmed, a.cancelled, a.redis_stock), (6, 3, Some(0)));
}

async fn a_cancel_interrupted_between_mysql_and_redis_is_repaired(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let mut cfg = fast_workers("w");
    cfg.release_grace = Duration::ZERO;
    let workers = Workers::new(&app.sales, &app.db, cfg);
    let sku = app.new_sale(5, 1).await;
    app.place_order(1, &sku, 1).await;
    workers.sale_worker(pid(&sku)).step().await.unwrap();
    let row = app
        .db
        .orders()
        .orders_of_product(&pid(&sku))
        .await
        .unwrap()
        .remove(0);
    let (id, _) = flashsale::domain::OrderId::parse(&row.order_id).unwrap();
    // The MySQL half commits; the process dies before the Redis half.
    app.db
        .orders()
        .cancel(&id, Some(UserId::new(1).unwrap()))
        .await
        .unwrap();
    assert_eq!(app.available_qty(&sku).await, 5);
    assert_eq!(app.stock(&sku).await, Some(4), "not yet back in Redis");
    assert_eq!(
        status_code(app.place_order(1, &sku, 1).await).await.1,
        "limit_exceeded"
    );
    // A worker's sweep finds it and finishes it, once.
    let swept = workers.sweeper().sweep().await.unwrap();
    assert_eq!(swept.repaired, 1);
    assert_eq!(workers.sweeper().sweep().await.unwrap().repaired, 0);
    assert_eq!(app.stock(&sku).await, Some(5));
    assert_eq!(app.bought(&sku, 1).await, 0);
    books_balance(&app, &sku).await;
}

async fn a_cancel_of_a_pending_order_is_applied_once_it_is_persisted(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let workers = Workers::new(&app.sales, &app.db, fast_workers("w"));
    let sku = app.new_sale(5, 1).await;
    let v: Value = app.place_order(1, &sku, 1).await.json().await.unwrap();
    let id = v["order_id"].as_str().unwrap();
    let (status, order) = app.act(id, "cancel", 1).await;
    assert_eq!(
        (status, order["status"].as_str()),
        (StatusCode::ACCEPTED, Some("cancelling"))
    );
    assert_eq!(app.act(id, "cancel", 2).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        app.stock(&sku).await,
        Some(4),
        "nothing returned while pending"
    );
    workers.sale_worker(pid(&sku)).step().await.unwrap();
    assert_eq!(workers.sweeper().sweep().await.unwrap().requests_applied, 1);
    assert_eq!(workers.sweeper().sweep().await.unwrap().requests_applied, 0);
    assert_eq!(
        app.get_json(&format!("/api/orders/{id}")).await.1["status"],
        "cancelled"
    );
    assert_eq!(app.stock(&sku).await, Some(5));
    books_balance(&app, &sku).await;
}

async fn a_sale_redis_forgot_is_recovered_from_mysql(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 2).await;
    let paid = buy(&app, 1, &sku, 2).await;
    app.act(&paid, "pay", 1).await;
    let keyed = buy_keyed(&app, 2, &sku, 1, Some("k2")).await;
    let cancelled = buy(&app, 3, &sku, 2).await;
    app.act(&cancelled, "cancel", 3).await;
    books_balance(&app, &sku).await;

    // Redis loses the sale.
    let mut r = app.redis.clone();
    for name in [
        "sale", "stock", "bought", "idem", "orders", "accepted", "released", "dead", "cancels",
    ] {
        let _: () = redis::cmd("DEL")
            .arg(app.key(&sku, name))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    assert_eq!(
        status_code(app.place_order(4, &sku, 1).await).await.1,
        "product_not_found"
    );
    let done = app
        .recovery()
        .recover(&pid(&sku), Overwrite::Refuse)
        .await
        .unwrap();
    assert_eq!((done.stock, done.buyers, done.released), (7, 2, 1));
    assert_eq!(app.stock(&sku).await, Some(7));
    // A retry with a key answers the order placed before the loss.
    let body = json!({"user_id": 2, "product_id": sku, "quantity": 1});
    let replay = app.post_order(&body, Some("k2")).await;
    assert_eq!(replay.status(), StatusCode::ACCEPTED);
    let v: Value = replay.json().await.unwrap();
    assert_eq!(v["order_id"], keyed.as_str());
    // The per-user limits still hold; the cancelled buyer may buy again.
    assert_eq!(
        status_code(app.place_order(1, &sku, 1).await).await.1,
        "limit_exceeded"
    );
    assert_eq!(
        app.place_order(2, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        app.place_order(3, &sku, 2).await.status(),
        StatusCode::ACCEPTED
    );
    app.drained(&sku, 8).await; // 2 + 1 + 2 (cancelled) + 1 + 2
    books_balance(&app, &sku).await;
    // Recovering a sale Redis has is refused.
    let again = app.recovery().recover(&pid(&sku), Overwrite::Refuse).await;
    assert!(matches!(
        again,
        Err(flashsale::bookkeeping::BookkeepingError::Refused(_))
    ));
}

/// Redis loses the two orders of buyers 1 and 2 (keys `a`, `b`; 3 units:
/// their records, units, buyer counts, key records) and the release of
/// buyer 3's cancelled order (2 units), as a failover to a replica that
/// missed the last writes would.
async fn forget_two_orders_and_a_release(
    app: &TestApp,
    sku: &str,
    orders: [&str; 2],
    cancelled: &str,
) {
    let _: () = redis::pipe()
        .hdel(app.key(sku, "accepted"), &orders)
        .incr(app.key(sku, "stock"), 3)
        .hdel(app.key(sku, "bought"), &["1", "2"])
        .hdel(app.key(sku, "idem"), &["1:a", "2:b"])
        .srem(app.key(sku, "released"), cancelled)
        .incr(app.key(sku, "stock"), -2)
        .hset(app.key(sku, "bought"), "3", 2)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
}

/// What a failover to a replica that missed the last writes leaves: the
/// books hold two orders and a release that Redis no longer knows.
async fn writes_redis_lost_are_restored_from_the_books_while_the_sale_runs(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 2).await;
    let first = buy_keyed(&app, 1, &sku, 2, Some("a")).await;
    let second = buy_keyed(&app, 2, &sku, 1, Some("b")).await;
    let cancelled = buy_keyed(&app, 3, &sku, 2, Some("c")).await;
    assert_eq!(app.act(&cancelled, "cancel", 3).await.0, StatusCode::OK);
    books_balance(&app, &sku).await;
    assert_eq!(app.stock(&sku).await, Some(7));

    forget_two_orders_and_a_release(&app, &sku, [&first, &second], &cancelled).await;
    let product = app
        .db
        .products()
        .product(&pid(&sku))
        .await
        .unwrap()
        .unwrap();
    let before = app.audit_of().sale(&product).await.unwrap();
    assert!(!before.ok(), "the loss shows in the audit");

    // A reconciler that has not seen this sale's master yet (as at a
    // worker's start, or after a failover) restores it; a second check,
    // with the master unchanged, does nothing.
    let mut reconciler = flashsale::worker::reconciler::Reconciler::new(
        (app.sales.lifecycle().clone(), app.sales.ledger().clone()),
        (app.db.orders(), app.db.products()),
    );
    assert!(reconciler.check().await.unwrap() >= 1);
    assert_eq!(reconciler.check().await.unwrap(), 0);
    assert_eq!(app.stock(&sku).await, Some(7));
    let audited = books_balance(&app, &sku).await;
    let r = audited.repaired;
    assert_eq!(
        (r.orders, r.units, r.releases, r.idempotency_records),
        (2, 3, 1, 2)
    );
    // The limits hold again, and a retry with a key answers its first order.
    assert_eq!(
        status_code(app.place_order(1, &sku, 1).await).await.1,
        "limit_exceeded"
    );
    assert_eq!(
        status_code(app.place_order(2, &sku, 2).await).await.1,
        "limit_exceeded"
    );
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 2});
    let replay = app.post_order(&body, Some("a")).await;
    assert_eq!(replay.status(), StatusCode::ACCEPTED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let v: Value = replay.json().await.unwrap();
    assert_eq!(v["order_id"], first.as_str());
    // The cancelled buyer may buy again; the books balance.
    buy(&app, 3, &sku, 2).await;
    app.drained(&sku, 7).await; // 2 + 1 + 2 (cancelled) + 2
    books_balance(&app, &sku).await;
}

/// A master promoted after a failover (WAIT off) that lost three persisted
/// orders; before reconciliation gets to the sale, buyers cancel two of
/// them. The promoted master never took their units, so the cancels must
/// not give any back, and reconciliation, whether it read the books before
/// or after a cancel, must not take them either: afterwards the books
/// balance, the stock is the units nobody holds, the buyers' counts are
/// right. (Before the fix a cancel added its units to a stock that never
/// lost them: the sale ended a unit high per cancel.)
async fn a_cancel_reaching_a_redis_that_lost_the_order_gives_back_nothing(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 2).await;
    let early = buy_keyed(&app, 1, &sku, 2, Some("a")).await;
    let stale = buy_keyed(&app, 2, &sku, 1, Some("b")).await;
    let kept = buy_keyed(&app, 3, &sku, 2, Some("c")).await;
    assert_eq!(app.stock(&sku).await, Some(5));
    // The books' view of `stale` as a reconciliation that read them before
    // its cancel holds it: sold.
    let row = app
        .db
        .orders()
        .orders_of_product(&pid(&sku))
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.order_id == stale)
        .unwrap();
    let (order_id, product_id) = OrderId::parse(&row.order_id).unwrap();
    let stale_view = Booked {
        order: PendingOrder {
            order_id,
            user_id: UserId::new(2).unwrap(),
            product_id,
            quantity: Quantity::ONE,
            price: row.price,
            created_ms: row.created,
            idempotency_key: row.idempotency_key.clone(),
        },
        state: BookedState::Sold,
    };

    // The new master lost the three orders: records, units, counts, keys.
    let mut r = app.redis.clone();
    let _: () = redis::pipe()
        .hdel(app.key(&sku, "accepted"), &[&early, &stale, &kept])
        .incr(app.key(&sku, "stock"), 5)
        .hdel(app.key(&sku, "bought"), &["1", "2", "3"])
        .hdel(app.key(&sku, "idem"), &["1:a", "2:b", "3:c"])
        .query_async(&mut r)
        .await
        .unwrap();

    // Two cancels reach it first: nothing comes back to a stock that never
    // gave the units.
    assert_eq!(app.act(&early, "cancel", 1).await.0, StatusCode::OK);
    assert_eq!(app.act(&stale, "cancel", 2).await.0, StatusCode::OK);
    assert_eq!(app.stock(&sku).await, Some(10), "units given back twice");
    assert_eq!(app.bought(&sku, 1).await, 0);
    // A reconciliation that read the books before the second cancel.
    app.sales
        .ledger()
        .restore_booked(&pid(&sku), &[stale_view], Restore::Repair)
        .await
        .unwrap();
    assert_eq!(
        app.stock(&sku).await,
        Some(10),
        "a cancelled order's units taken"
    );
    // And one that reads them now.
    let mut reconciler = flashsale::worker::reconciler::Reconciler::new(
        (app.sales.lifecycle().clone(), app.sales.ledger().clone()),
        (app.db.orders(), app.db.products()),
    );
    assert!(reconciler.check().await.unwrap() >= 1);
    assert_eq!(app.stock(&sku).await, Some(8));
    assert_eq!(
        (
            app.bought(&sku, 1).await,
            app.bought(&sku, 2).await,
            app.bought(&sku, 3).await
        ),
        (0, 0, 2)
    );
    books_balance(&app, &sku).await;
    // The cancelled buyers may buy again, up to their limit and no further.
    buy(&app, 1, &sku, 2).await;
    assert_eq!(
        status_code(app.place_order(1, &sku, 1).await).await.1,
        "limit_exceeded"
    );
    app.drained(&sku, 7).await; // 2 + 1 (both cancelled) + 2 + 2
    books_balance(&app, &sku).await;
}

async fn recovery_refuses_while_the_stream_holds_unpersisted_orders(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(10, 2).await;
    app.place_order(1, &sku, 1).await;
    let mut r = app.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(app.key(&sku, "sale"))
        .query_async(&mut r)
        .await
        .unwrap();
    let refused = app.recovery().recover(&pid(&sku), Overwrite::Refuse).await;
    assert!(
        matches!(refused, Err(flashsale::bookkeeping::BookkeepingError::Refused(ref why)) if why.contains("stream")),
        "{refused:?}"
    );
}

async fn the_audit_endpoint_reports_the_books_to_admins(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(5, 1).await;
    buy(&app, 1, &sku, 1).await;
    let url = app.url(&format!("/api/admin/products/{sku}/audit"));
    let resp = app
        .client
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["audit"]["confirmed"], 1);
    assert_eq!(body["audit"]["redis_stock"], 4);
    assert_eq!(
        app.client.get(&url).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    // A unit Redis lost shows as a mismatch.
    let mut r = app.redis.clone();
    let _: () = redis::cmd("DECR")
        .arg(app.key(&sku, "stock"))
        .query_async(&mut r)
        .await
        .unwrap();
    let body = app.audit(&sku).await;
    assert_eq!(body["ok"], false);
}

/// Pay or cancel sent the moment the 202 arrives races the worker's commit.
/// Whatever the timing, the answer is what the order's state warrants: done,
/// `cancelling`, or an honest "the order is pending" — never a refusal that
/// names `confirmed`, a status both transitions start from.
#[tokio::test]
async fn pay_or_cancel_right_after_the_202_is_never_refused_as_confirmed() {
    let app = crate::helpers::spawn_app().await;
    const BUYERS: u64 = 8;
    const ROUNDS: u64 = 30;
    let sku = app.new_sale(BUYERS * ROUNDS, ROUNDS).await;
    let app = std::sync::Arc::new(app);
    let mut buyers = JoinSet::new();
    for buyer in 1..=BUYERS {
        let (app, sku) = (app.clone(), sku.clone());
        buyers.spawn(async move {
            let mut answers = Vec::new();
            for round in 0..ROUNDS {
                let resp = app.place_order(buyer, &sku, 1).await;
                assert_eq!(resp.status(), StatusCode::ACCEPTED);
                let order: Value = resp.json().await.unwrap();
                let id = order["order_id"].as_str().unwrap().to_owned();
                let action = if round % 2 == 0 { "pay" } else { "cancel" };
                let (status, body) = app.act(&id, action, buyer).await;
                answers.push((action, status, body));
            }
            answers
        });
    }
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    while let Some(answers) = buyers.join_next().await {
        for (action, status, body) in answers.unwrap() {
            let fine = match (action, status) {
                ("pay", StatusCode::OK) => body["status"] == "paid",
                ("cancel", StatusCode::OK) => body["status"] == "cancelled",
                ("cancel", StatusCode::ACCEPTED) => body["status"] == "cancelling",
                ("pay", StatusCode::CONFLICT) => body["message"] == "the order is pending",
                _ => false,
            };
            assert!(fine, "{action} right after the 202: {status} {body}");
            *seen.entry(format!("{action} {status}")).or_default() += 1;
        }
    }
    eprintln!("answers: {seen:?}");
    // Every cancel took effect (the `cancelling` ones once persisted), both
    // halves: the audit is exact once no cancel is between them.
    crate::helpers::eventually("every cancel applied", Duration::from_secs(30), || async {
        let cancelled: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM tb_order \
             WHERE product_id = ? AND status = 'cancelled' AND released = 1",
        )
        .bind(&sku)
        .fetch_one(&app.mysql)
        .await
        .unwrap();
        cancelled == (BUYERS * ROUNDS / 2) as i64
    })
    .await;
    books_balance(&app, &sku).await;
}

crate::on_both_backends!(
    buy_pay_cancel_move_the_status_and_the_stock,
    a_hundred_concurrent_cancels_release_the_units_once,
    cancels_racing_the_payment_timeout_release_once,
    one_sweep_cancels_a_crowd_of_unpaid_orders,
    cancelled_units_of_a_sold_out_sale_sell_again_to_others,
    a_cancel_interrupted_between_mysql_and_redis_is_repaired,
    a_cancel_of_a_pending_order_is_applied_once_it_is_persisted,
    a_sale_redis_forgot_is_recovered_from_mysql,
    writes_redis_lost_are_restored_from_the_books_while_the_sale_runs,
    a_cancel_reaching_a_redis_that_lost_the_order_gives_back_nothing,
    recovery_refuses_while_the_stream_holds_unpersisted_orders,
    the_audit_endpoint_reports_the_books_to_admins,
);
