//! The outbox: every change of an order (and of a sale) recorded as an
//! event in the transaction that makes it, read in order through
//! `GET /api/admin/events`.

use std::collections::BTreeMap;
use std::time::Duration;

use flashsale::config::Limits;
use flashsale::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

async fn spawn() -> TestApp {
    let secrets = format!("--payment-webhook-secrets={PAY_SECRET}");
    spawn_app_cli(&["--auth=none", &secrets], |s| {
        s.http.limits = Limits::unlimited();
        // Events are listed once DB_TIMEOUT_MS + 1 s old: keep it short.
        s.db.timeout = Duration::from_millis(500);
    })
    .await
}

impl TestApp {
    /// One page of the feed after `after`: its events and its `next`
    /// cursor; `None` when it is not answered 200 (a 503 mid-failover).
    pub(crate) async fn events_page(&self, after: i64, limit: u32) -> Option<(Vec<Value>, Value)> {
        let resp = self
            .client
            .get(self.url(&format!("/api/admin/events?after={after}&limit={limit}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .ok()
            .filter(|r| r.status() == StatusCode::OK)?;
        let page: Value = resp.json().await.ok()?;
        let events = page["events"].as_array()?.clone();
        Some((events, page["next"].clone()))
    }

    /// All events listed so far, page by page (`limit` each).
    pub(crate) async fn events(&self, limit: u32) -> Vec<Value> {
        let (mut after, mut all) = (0, Vec::new());
        loop {
            let (events, next) = self
                .events_page(after, limit)
                .await
                .expect("a page, answered 200");
            if events.is_empty() {
                assert_eq!(next, after, "an empty page keeps the cursor");
                return all;
            }
            after = next.as_i64().expect("a cursor");
            assert_eq!(Some(after), events.last().and_then(|e| e["id"].as_i64()));
            all.extend(events);
        }
    }

    /// Signs and sends a payment notification (the service's own signer:
    /// tests/it/payments.rs tests it against openssl), answered 200.
    pub(crate) async fn pay(&self, order_id: &str, payment_id: &str, amount: &str) -> Value {
        self.payment_event("payment.succeeded", order_id, payment_id, amount)
            .await
    }

    /// Signs and sends a notification of `kind`, answered 200.
    pub(crate) async fn payment_event(
        &self,
        kind: &str,
        order_id: &str,
        payment_id: &str,
        amount: &str,
    ) -> Value {
        let body = json!({"type": kind,
            "data": {"order_id": order_id, "payment_id": payment_id, "amount": amount, "currency": "CNY"}})
        .to_string();
        let resp = self
            .send_signed(&self.base, PAY_SECRET, &unique("msg_"), &body)
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("an answer")
    }
}

#[tokio::test]
async fn every_change_of_an_order_is_one_event_in_order() {
    let app = spawn().await;
    let sku = app.new_sale(10, 5).await;
    let ids = app.order_ids(&sku, 1..=4).await;
    app.drained(&sku, 4).await;
    // 0 paid, then paid again by another payment (owed back); 1 cancelled
    // by its buyer; 2 cancelled, then paid late (its units still there),
    // then refunded; 3 stays.
    assert_eq!(app.pay(&ids[0], "p0", "4999.00").await["result"], "paid");
    assert_eq!(
        app.pay(&ids[0], "p0-twice", "4999.00").await["result"],
        "refund_due"
    );
    assert_eq!(app.cancel(&ids[1], 2).await.status(), StatusCode::OK);
    assert_eq!(app.cancel(&ids[2], 3).await.status(), StatusCode::OK);
    assert_eq!(
        app.pay(&ids[2], "p2", "4999.00").await["result"],
        "paid_again"
    );
    assert_eq!(
        app.payment_event("payment.refunded", &ids[2], "p2", "4999.00")
            .await["result"],
        "refunded"
    );
    // Replays and refusals change nothing, and make no event.
    assert_eq!(app.pay(&ids[0], "p0", "4999.00").await["replayed"], true);
    assert_eq!(app.cancel(&ids[1], 2).await.status(), StatusCode::OK);

    // Not listed until settled; then all of them, once each.
    let expected: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        (
            ids[0].as_str(),
            vec!["order.confirmed", "order.paid", "order.refund_due"],
        ),
        (ids[1].as_str(), vec!["order.confirmed", "order.cancelled"]),
        (
            ids[2].as_str(),
            vec![
                "order.confirmed",
                "order.cancelled",
                "order.paid",
                "order.cancelled",
            ],
        ),
        (ids[3].as_str(), vec!["order.confirmed"]),
    ]);
    let total: usize = expected.values().map(Vec::len).sum();
    eventually("every event is listed", Duration::from_secs(10), || async {
        app.events(100).await.len() == total
    })
    .await;
    // Paged two at a time: the same events, in increasing id.
    let events = app.events(2).await;
    assert_eq!(events.len(), total);
    assert_eq!(order_events(&events, &sku), expected);
}

/// `events` in increasing id, each of `sku`, its data as the change left
/// the order: the types of each order's events, in order.
fn order_events<'a>(events: &'a [Value], sku: &str) -> BTreeMap<&'a str, Vec<&'a str>> {
    assert!(
        events
            .windows(2)
            .all(|w| w[0]["id"].as_i64() < w[1]["id"].as_i64())
    );
    let mut seen: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in events {
        let order = e["data"]["order_id"].as_str().unwrap();
        seen.entry(order)
            .or_default()
            .push(e["type"].as_str().unwrap());
        assert_eq!(e["data"]["product_id"], sku);
        assert_eq!(e["data"]["price"], "4999");
        let status = match e["type"].as_str().unwrap() {
            "order.confirmed" => json!("confirmed"),
            "order.paid" => json!("paid"),
            "order.cancelled" => json!("cancelled"),
            _ => Value::Null,
        };
        assert_eq!(e["data"]["status"], status, "{e}");
    }
    seen
}

#[tokio::test]
async fn a_redelivered_batch_and_a_sweep_make_no_second_event() {
    let app = spawn().await;
    let sku = app.new_sale(10, 5).await;
    let order: Value = app.place_order(1, &sku, 2).await.json().await.unwrap();
    let id = order["order_id"].as_str().unwrap().to_owned();
    app.drained(&sku, 2).await;
    // The same entry persisted again (a redelivery after a crash before XACK).
    let product = ProductId::parse(&sku).unwrap();
    let again = PendingOrder {
        order_id: OrderId::from_trusted(id.clone()),
        user_id: UserId::new(1).unwrap(),
        product_id: product.clone(),
        quantity: Quantity::new(2).unwrap(),
        price: "4999".parse().unwrap(),
        created_ms: now_ms(),
        idempotency_key: None,
    };
    let persisted = app
        .db
        .orders()
        .persist_orders(&product, &[again.clone(), again])
        .await;
    assert_eq!(persisted.unwrap().inserted, 0);
    // The payment timeout cancels it once, however many sweeps.
    let sweeper = app.overdue_sweeper();
    for _ in 0..3 {
        sweeper.sweep().await.expect("a sweep");
    }
    eventually("both events listed", Duration::from_secs(10), || async {
        app.events(100).await.len() >= 2
    })
    .await;
    tokio::time::sleep(app.db.events().event_settle()).await;
    let types: Vec<Value> = app
        .events(100)
        .await
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(
        types,
        vec![json!("order.confirmed"), json!("order.cancelled")]
    );
}

#[tokio::test]
async fn the_event_feed_is_for_admins_and_refuses_bad_cursors() {
    let app = spawn().await;
    let resp = app
        .client
        .get(app.url("/api/admin/events"))
        .send()
        .await
        .unwrap();
    assert_refused(resp, StatusCode::UNAUTHORIZED, "unauthorized").await;
    for query in ["after=-1", "limit=0", "limit=1001", "after=x", "since=3"] {
        let resp = app
            .client
            .get(app.url(&format!("/api/admin/events?{query}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_refused(resp, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
}

/// A sale's own events: `sale.sold_out` in the transaction that books its
/// last unit (again after a cancel gave units back and they sold), then
/// `sale.ended` and `sale.retired` from the workers' retirement pass, once
/// each, among its orders' events in order.
#[tokio::test]
async fn a_sale_tells_when_it_sells_out_ends_and_retires() {
    let app = spawn().await;
    let sku = app.new_sale(2, 2).await;
    let order = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let v: Value = resp.json().await.unwrap();
        v["order_id"].as_str().unwrap().to_owned()
    };
    let a = order(app.place_order(1, &sku, 2).await).await;
    app.drained(&sku, 2).await;
    assert_eq!(app.cancel(&a, 1).await.status(), StatusCode::OK);
    eventually("the units back", Duration::from_secs(10), || async {
        app.stock(&sku).await == Some(2)
    })
    .await;
    let b = order(app.place_order(2, &sku, 2).await).await;
    app.drained(&sku, 4).await;
    assert_eq!(app.pay(&b, "pay-b", "9998.00").await["result"], "paid");
    app.close_sale(&sku).await;
    let workers = app.retiring_workers("w", Duration::from_secs(3600));
    let pass = workers.retirer().pass().await.expect("a pass");
    assert_eq!(pass.retired.len(), 1, "{pass:?}");
    // A second pass records nothing more.
    workers.retirer().pass().await.expect("a pass");

    let expected = vec![
        ("order.confirmed", Some(a.as_str())),
        ("sale.sold_out", None),
        ("order.cancelled", Some(a.as_str())),
        ("order.confirmed", Some(b.as_str())),
        ("sale.sold_out", None),
        ("order.paid", Some(b.as_str())),
        ("sale.ended", None),
        ("sale.retired", None),
    ];
    eventually("every event is listed", Duration::from_secs(10), || async {
        app.events(100).await.len() == expected.len()
    })
    .await;
    let events = app.events(100).await;
    let seen: Vec<(&str, Option<&str>)> = events
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["data"]["order_id"].as_str()))
        .collect();
    assert_eq!(seen, expected);
    for e in &events {
        assert_eq!(e["data"]["product_id"], sku.as_str(), "{e}");
        if e["type"].as_str().unwrap().starts_with("sale.") {
            assert_eq!(e["data"], json!({"product_id": sku}), "{e}");
        }
    }
}

/// Many orders changed in one transaction are one stored row: the feed
/// lists each of them, a cursor in the middle of the row goes on from
/// there, and the delivery lag counts events, not rows.
#[tokio::test]
async fn a_batch_of_orders_is_one_row_and_each_of_its_events() {
    let app = spawn().await;
    let sku = app.new_sale(10, 1).await;
    for user in 1..=6 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }
    app.drained(&sku, 6).await;
    // The payment timeout at zero: one sweep cancels all six at once.
    let sweeper = app.overdue_sweeper();
    assert_eq!(sweeper.sweep().await.unwrap().expired, 6);
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tb_event WHERE type = 'order.cancelled'")
            .fetch_one(&app.mysql)
            .await
            .unwrap();
    assert_eq!(rows, 1, "six cancels in one transaction: one row");
    eventually("listed", Duration::from_secs(10), || async {
        app.events(100).await.len() == 12
    })
    .await;
    let ids: Vec<i64> = app
        .events(100)
        .await
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    // Page by page, one at a time: the same ids.
    let ones: Vec<i64> = app
        .events(1)
        .await
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ones, ids);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            app.db.events().events_behind(*id).await.unwrap(),
            (11 - i) as i64
        );
    }
    assert_eq!(app.db.events().events_behind(0).await.unwrap(), 12);
    assert_eq!(app.db.events().last_event_id().await.unwrap(), ids[11]);
}
