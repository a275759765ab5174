//! Payments from the payment side: Standard Webhooks notifications, signed
//! by a real sender (the `openssl` recipe of docs/api.md, run by bash: an
//! implementation of the scheme apart from the service's), checked as a
//! bookkeeper would.

use std::time::Duration;

use flashsale::config::Limits;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// The secret a rotation brings in beside [`PAY_SECRET`].
const NEXT: &str = "whsec_bmV4dC1zZWNyZXQtb2YtdGhlLXJvdGF0aW9uLTI0";
/// A secret the service does not hold.
const STRANGER: &str = "whsec_c3RyYW5nZXItc2VjcmV0LTAxMjM0NTY3ODkwMTI=";
/// The test sales' price (`product_body`).
const PRICE: &str = "4999.00";

pub(crate) async fn spawn_paying() -> TestApp {
    let secrets = format!("--payment-webhook-secrets={PAY_SECRET},{NEXT}");
    spawn_app_cli(&["--auth=none", &secrets, "--sale-currency=CNY"], |s| {
        s.http.limits = Limits::unlimited()
    })
    .await
}

impl TestApp {
    /// A confirmed order of `quantity` units for `user`: its id.
    async fn confirmed_order(&self, sku: &str, user: u64, quantity: u64) -> String {
        let resp = self.place_order(user, sku, quantity).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let order: Value = resp.json().await.expect("an order");
        order["order_id"].as_str().expect("an id").to_owned()
    }

    async fn status_of(&self, order_id: &str) -> String {
        sqlx::query_scalar("SELECT status FROM tb_order WHERE order_id = ?")
            .bind(order_id)
            .fetch_one(&self.mysql)
            .await
            .expect("the order's row")
    }

    /// (payment id, result) of each recorded payment of an order.
    async fn payments(&self, order_id: &str) -> Vec<(String, String)> {
        sqlx::query_as(
            "SELECT payment_id, result FROM tb_payment WHERE order_id = ? ORDER BY payment_id",
        )
        .bind(order_id)
        .fetch_all(&self.mysql)
        .await
        .expect("tb_payment")
    }
}

/// A paying service, a sale of 10 (5 a buyer), and a persisted order of
/// `quantity` units for user 1: the app, the sale and the order's id.
async fn paying_with_an_order(quantity: u64) -> (TestApp, String, String) {
    let app = spawn_paying().await;
    let sku = app.new_sale(10, 5).await;
    let id = app.confirmed_order(&sku, 1, quantity).await;
    app.drained(&sku, quantity as i64).await;
    (app, sku, id)
}

pub(crate) fn amount(quantity: u64) -> String {
    let price: rust_decimal::Decimal = PRICE.parse().unwrap();
    (price * rust_decimal::Decimal::from(quantity)).to_string()
}

#[tokio::test]
async fn a_signed_payment_of_the_orders_amount_pays_it_once() {
    let (app, sku, id) = paying_with_an_order(2).await;

    let body = notification("payment.succeeded", &id, "pay_1", &amount(2));
    let webhook_id = unique("msg_");
    let (status, paid) = app
        .notify_as(PAY_SECRET, &webhook_id, now_ms() / 1000, &body)
        .await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(paid["result"], "paid");
    assert_eq!(paid["order_status"], "paid");
    assert_eq!(paid["replayed"], false);
    assert_eq!(app.status_of(&id).await, "paid");
    let (_, seen) = app.get_json(&format!("/api/orders/{id}")).await;
    assert_eq!(seen["status"], "paid");

    // Delivered again (a retry: same webhook-id, signed anew; and as a
    // fresh message with the same payment id): the same answer, one record.
    let (status, again) = app
        .notify_as(PAY_SECRET, &webhook_id, now_ms() / 1000, &body)
        .await;
    assert_eq!(
        (status, &again["result"], &again["replayed"]),
        (StatusCode::OK, &json!("paid"), &json!(true))
    );
    let (status, again) = app.notify(&body).await;
    assert_eq!((status, &again["result"]), (StatusCode::OK, &json!("paid")));
    assert_eq!(
        app.payments(&id).await,
        vec![("pay_1".to_owned(), "paid".to_owned())]
    );

    // The same id for another order is refused, and records nothing.
    let other = app.confirmed_order(&sku, 2, 1).await;
    app.drained(&sku, 3).await;
    let (status, refused) = app
        .notify_of("payment.succeeded", &other, "pay_1", &amount(1))
        .await;
    assert_error(
        status,
        &refused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "payment_id_reused",
    );
    assert_eq!(app.status_of(&other).await, "confirmed");
    assert!(app.payments(&other).await.is_empty());

    // A second payment for a paid order is money owed back.
    let (status, double) = app
        .notify_of("payment.succeeded", &id, "pay_2", &amount(2))
        .await;
    assert_eq!(
        (status, &double["result"]),
        (StatusCode::OK, &json!("refund_due"))
    );
    assert_eq!(app.status_of(&id).await, "paid");
    // The books still balance: a payment moves no unit.
    assert_eq!(app.audit(&sku).await["ok"], true);
}

/// A body changed after signing, and a message without each of its three
/// headers in turn: 401 `invalid_signature`, each.
async fn refuses_tampered_and_unsigned(app: &TestApp, body: &str, now: i64) {
    let url = app.url("/api/payments/notifications");
    let body = body.to_owned();
    let signature = openssl_signature(PAY_SECRET, "msg_x", now, &body);
    let tampered = body.replace(&amount(1), "0.01");
    for (headers, sent) in [
        (
            vec![
                ("webhook-id", "msg_x"),
                ("webhook-timestamp", &now.to_string()),
                ("webhook-signature", &signature),
            ],
            &tampered,
        ),
        (
            vec![
                ("webhook-timestamp", &now.to_string()),
                ("webhook-signature", &signature),
            ],
            &body,
        ),
        (
            vec![("webhook-id", "msg_x"), ("webhook-signature", &signature)],
            &body,
        ),
        (
            vec![
                ("webhook-id", "msg_x"),
                ("webhook-timestamp", &now.to_string()),
            ],
            &body,
        ),
    ] {
        let mut req = app
            .client
            .post(&url)
            .header("content-type", "application/json")
            .body(sent.clone());
        for (k, v) in headers {
            req = req.header(k, v);
        }
        assert_refused(
            req.send().await.unwrap(),
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
        )
        .await;
    }
}

#[tokio::test]
async fn only_a_message_signed_with_a_held_secret_in_time_is_heard() {
    let (app, _, id) = paying_with_an_order(1).await;
    let body = notification("payment.succeeded", &id, "pay_sig", &amount(1));
    let now = now_ms() / 1000;

    // Not signed with a secret it holds; stale (beyond 5 minutes, either
    // way: 310 s, clear of the second the request may take); a body
    // changed after signing; headers missing.
    for (secret, ts) in [
        (STRANGER, now),
        (PAY_SECRET, now - 310),
        (PAY_SECRET, now + 310),
    ] {
        let (status, refused) = app.notify_as(secret, &unique("msg_"), ts, &body).await;
        assert_eq!(
            (status, refused["error"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("invalid_signature")),
            "{ts}"
        );
    }
    refuses_tampered_and_unsigned(&app, &body, now).await;
    assert_eq!(app.status_of(&id).await, "confirmed");
    assert!(app.payments(&id).await.is_empty());

    // Mid-rotation, the new secret is heard as well as the old.
    let (status, paid) = app.notify_as(NEXT, &unique("msg_"), now, &body).await;
    assert_eq!((status, &paid["result"]), (StatusCode::OK, &json!("paid")));
    // The operator sees what came of them.
    let metrics = app.metrics_text().await;
    for line in [
        r#"flashsale_payment_notifications_total{result="refused"} 7"#,
        r#"flashsale_payment_notifications_total{result="paid"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

/// Payments of orders that never were (a well-formed id of `sku` and
/// made-up ones): 404 `order_not_found`, each, and no payment recorded for
/// any order but `known`.
async fn refuses_payments_of_orders_that_never_were(app: &TestApp, sku: &str, known: &str) {
    let never = format!("{sku}:{}", "0".repeat(36));
    for order in [never.as_str(), "not-an-order", "sku-x:123"] {
        let (status, refused) = app
            .notify_of("payment.succeeded", order, &unique("pay_"), &amount(1))
            .await;
        assert_eq!(
            (status, refused["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("order_not_found")),
            "{order}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tb_payment WHERE order_id <> ?")
        .bind(known)
        .fetch_one(&app.mysql)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn wrong_amounts_unknown_orders_and_failures_change_nothing() {
    let (app, sku, id) = paying_with_an_order(2).await;

    // Another amount, or the right amount in another currency: recorded, refused.
    let cases = [
        ("pay_low", amount(1), "CNY"),
        ("pay_high", amount(3), "CNY"),
        ("pay_usd", amount(2), "USD"),
    ];
    for (payment, sum, currency) in &cases {
        let body = json!({"type": "payment.succeeded",
            "data": {"order_id": id, "payment_id": payment, "amount": sum, "currency": currency}})
        .to_string();
        let (status, refused) = app.notify(&body).await;
        assert_eq!(
            (status, refused["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("amount_mismatch")),
            "{payment}"
        );
    }
    assert_eq!(app.status_of(&id).await, "confirmed");
    let recorded = app.payments(&id).await;
    assert_eq!(recorded.len(), 3);
    assert!(
        recorded.iter().all(|(_, r)| r == "amount_mismatch"),
        "{recorded:?}"
    );

    // A failed attempt is recorded; the order waits for its timeout.
    let (status, failed) = app
        .notify_of("payment.failed", &id, "pay_f", &amount(2))
        .await;
    assert_eq!(
        (status, &failed["result"], &failed["order_status"]),
        (StatusCode::OK, &json!("failed"), &json!("confirmed"))
    );

    // An order that never was: the same answer for a well-formed id and a
    // made-up one, and nothing recorded.
    refuses_payments_of_orders_that_never_were(&app, &sku, &id).await;
    // A malformed body (signed, so read) is a 400 and changes nothing.
    let (status, refused) = app
        .notify(r#"{"type":"payment.succeeded","data":{}}"#)
        .await;
    assert_error(status, &refused, StatusCode::BAD_REQUEST, "invalid_request");
    // The buyer's own pay route is not served once payments come signed.
    let (status, refused) = app.act(&id, "pay", 1).await;
    assert_error(status, &refused, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(app.status_of(&id).await, "confirmed");
}

#[tokio::test]
async fn a_payment_for_an_order_not_yet_in_the_books_is_asked_again() {
    // No workers: the order stays in its stream.
    let secrets = format!("--payment-webhook-secrets={PAY_SECRET}");
    let app = spawn_app_cli(&["--auth=none", &secrets], |s| {
        s.http.limits = Limits::unlimited();
        s.workers = None;
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    let id = app.confirmed_order(&sku, 1, 1).await;
    let body = notification("payment.succeeded", &id, "pay_early", &amount(1));
    let (status, refused) = app.notify(&body).await;
    assert_error(status, &refused, StatusCode::CONFLICT, "order_pending");
    assert!(app.payments(&id).await.is_empty());
}

/// A payment for an order not yet in the books while Redis does not
/// answer: 503, asked again, never the 404 that tells the payment side
/// there is no such order.
#[tokio::test]
async fn a_payment_while_redis_does_not_answer_is_asked_again() {
    let redis = crate::proxy::Proxy::start("127.0.0.1:6379").await;
    let secrets = format!("--payment-webhook-secrets={PAY_SECRET}");
    let app = spawn_app_cli(&["--auth=none", &secrets], |s| {
        s.http.limits = Limits::unlimited();
        s.workers = None;
        s.redis.target =
            flashsale::config::RedisTarget::Single(format!("redis://127.0.0.1:{}", redis.port));
        s.redis.timeout = Duration::from_millis(300);
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    let id = app.confirmed_order(&sku, 1, 1).await;
    redis.set_on(false);
    let body = notification("payment.succeeded", &id, "pay_redis_down", &amount(1));
    let (status, refused) = app.notify(&body).await;
    assert_error(
        status,
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    assert!(app.payments(&id).await.is_empty());
    // Redis back: still in its stream, asked again as before.
    redis.set_on(true);
    eventually("order_pending again", Duration::from_secs(10), || async {
        app.notify(&body).await.1["error"] == "order_pending"
    })
    .await;
}

/// Each of `ids` is paid, with one payment recorded: how many by a payment
/// `paid` and how many `paid_again`.
async fn paid_once_each(app: &TestApp, ids: &[String]) -> (i64, i64) {
    let (mut paid, mut paid_again) = (0, 0);
    for id in ids {
        let status = app.status_of(id).await;
        let recorded = app.payments(id).await;
        assert_eq!(recorded.len(), 1, "{id}: one payment recorded");
        match (status.as_str(), recorded[0].1.as_str()) {
            ("paid", "paid") => paid += 1,
            ("paid", "paid_again") => paid_again += 1,
            other => panic!("{id}: {other:?}"),
        }
    }
    (paid, paid_again)
}

/// A payment and the payment timeout race for the same orders, both
/// orders of arrival: each order ends paid, by a payment `paid` (it came
/// first) or `paid_again` (the timeout came first, and the sale still had
/// the units: taken again); one payment each, and the books balance.
#[tokio::test]
async fn a_payment_racing_its_timeout_is_paid_or_owed_back() {
    let app = spawn_paying().await;
    let sku = app.new_sale(40, 1).await;
    let mut ids = Vec::new();
    for user in 1..=30 {
        ids.push(app.confirmed_order(&sku, user, 1).await);
    }
    app.drained(&sku, 30).await;
    // The payment timeout at zero: every confirmed order is overdue.
    let sweeper = app.overdue_sweeper();
    let (first, rest) = ids.split_at(10);
    // Ten paid before the sweep, the rest raced against it.
    for id in first {
        let (status, _) = app
            .notify_of("payment.succeeded", id, &format!("pay-{id}"), &amount(1))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let payments = async {
        let mut results = Vec::new();
        for id in rest {
            let body = notification("payment.succeeded", id, &format!("pay-{id}"), &amount(1));
            results.push(app.notify(&body).await);
        }
        results
    };
    let sweep = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        sweeper.sweep().await.expect("a sweep")
    };
    let (results, _) = tokio::join!(payments, sweep);
    assert!(
        results.iter().all(|(s, _)| *s == StatusCode::OK),
        "{results:?}"
    );
    // A late payment, after the sweep: its units are still there.
    let late = app.confirmed_order(&sku, 31, 1).await;
    app.drained(&sku, 31).await;
    sweeper.sweep().await.expect("a sweep");
    let (status, owed) = app
        .notify_of("payment.succeeded", &late, "pay-late", &amount(1))
        .await;
    assert_eq!(
        (status, &owed["result"], &owed["order_status"]),
        (StatusCode::OK, &json!("paid_again"), &json!("paid"))
    );
    ids.push(late);

    let (paid, paid_again) = paid_once_each(&app, &ids).await;
    assert!(paid >= 10, "the ten paid before the sweep stay paid");
    assert!(paid_again >= 1, "the late one");
    let paid = paid + paid_again;
    assert_eq!(paid, 31);
    // Units of the cancelled orders are back on sale; the books balance.
    app.books_balance(&sku).await;
    assert_eq!(app.stock(&sku).await, Some(40 - paid));
}

#[tokio::test]
async fn one_notification_delivered_at_once_many_times_is_recorded_once() {
    let (app, _, id) = paying_with_an_order(1).await;
    let body = notification("payment.succeeded", &id, "pay_dup", &amount(1));
    let webhook_id = unique("msg_");
    let now = now_ms() / 1000;
    let signature = openssl_signature(PAY_SECRET, &webhook_id, now, &body);
    let mut deliveries = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let req = app
            .client
            .post(app.url("/api/payments/notifications"))
            .header("content-type", "application/json")
            .header("webhook-id", webhook_id.clone())
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", signature.clone())
            .body(body.clone());
        deliveries.spawn(async move {
            let resp = req.send().await.expect("answered");
            (
                resp.status(),
                resp.json::<Value>().await.unwrap_or(Value::Null),
            )
        });
    }
    let answers = deliveries.join_all().await;
    for (status, answer) in &answers {
        assert_eq!(
            (*status, &answer["result"]),
            (StatusCode::OK, &json!("paid")),
            "{answer}"
        );
    }
    let fresh = answers
        .iter()
        .filter(|(_, a)| a["replayed"] == false)
        .count();
    assert_eq!(fresh, 1, "one delivery recorded it, the others found it");
    assert_eq!(app.payments(&id).await.len(), 1);
}

/// A refusal answers the same message again, never another one: a
/// payment side's corrected notification of the same payment (the right
/// amount after a wrong one, the full refund after a partial one) is
/// decided anew.
#[tokio::test]
async fn a_corrected_notification_is_decided_anew_over_its_refusal() {
    let (app, sku, id) = paying_with_an_order(1).await;
    let now = now_ms() / 1000;
    let send = |msg: &'static str, body: String| {
        let app = &app;
        async move { app.notify_as(PAY_SECRET, msg, now, &body).await }
    };
    let (wrong, right) = (
        notification("payment.succeeded", &id, "pay-x", "1.00"),
        notification("payment.succeeded", &id, "pay-x", &amount(1)),
    );
    // The wrong amount, twice as one message: refused, then the same refusal.
    for _ in 0..2 {
        let (status, answer) = send("msg_wrong", wrong.clone()).await;
        assert_error(
            status,
            &answer,
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_mismatch",
        );
    }
    assert_eq!(app.status_of(&id).await, "confirmed");
    // The corrected notification, another message: paid.
    let (status, answer) = send("msg_right", right).await;
    assert_eq!(
        (status, &answer["result"], &answer["replayed"]),
        (StatusCode::OK, &json!("paid"), &json!(false)),
        "{answer}"
    );
    assert_eq!(app.status_of(&id).await, "paid");

    // A partial refund, refused; the full one, another message: refunded.
    let partial = notification("payment.refunded", &id, "pay-x", "1.00");
    let (status, _) = send("msg_partial", partial.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.status_of(&id).await, "paid");
    let full = notification("payment.refunded", &id, "pay-x", &amount(1));
    let (status, answer) = send("msg_full", full).await;
    assert_eq!(
        (status, &answer["result"], &answer["order_status"]),
        (StatusCode::OK, &json!("refunded"), &json!("cancelled")),
        "{answer}"
    );
    eventually("the unit back", Duration::from_secs(10), || async {
        app.stock(&sku).await == Some(10)
    })
    .await;
    // The partial message delivered again: what the payment came to now,
    // nothing changed.
    let (status, answer) = send("msg_partial", partial).await;
    assert_eq!(
        (status, &answer["result"], &answer["replayed"]),
        (StatusCode::OK, &json!("refunded"), &json!(true)),
        "{answer}"
    );
    assert_recorded(&app, &id, &[("pay-x", "paid"), ("pay-x", "refunded")]).await;
    assert_eq!(app.stock(&sku).await, Some(10));
    app.books_balance(&sku).await;
}

/// A notification's answer: what came of the payment, and the order's status.
fn assert_outcome(answer: &Value, result: &str, order_status: &str) {
    assert_eq!(
        (answer["result"].as_str(), answer["order_status"].as_str()),
        (Some(result), Some(order_status)),
        "{answer}"
    );
}

/// The payments recorded for `order_id`, in any order, are `expected`
/// (payment id, result).
async fn assert_recorded(app: &TestApp, order_id: &str, expected: &[(&str, &str)]) {
    let mut got = app.payments(order_id).await;
    got.sort();
    let mut expected: Vec<(String, String)> = expected
        .iter()
        .map(|(p, r)| ((*p).to_owned(), (*r).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(got, expected, "{order_id}");
}

/// Orders of users 1, 2 and 3 for `sku` (three units), persisted, then
/// cancelled by the payment timeout (the sweep at zero), their units back:
/// their ids.
async fn three_timed_out(app: &TestApp, sku: &str) -> [String; 3] {
    let a = app.confirmed_order(sku, 1, 1).await;
    let b = app.confirmed_order(sku, 2, 1).await;
    let c = app.confirmed_order(sku, 3, 1).await;
    app.drained(sku, 3).await;
    let sweeper = app.overdue_sweeper();
    assert_eq!(sweeper.sweep().await.expect("a sweep").expired, 3);
    eventually("units back", Duration::from_secs(10), || async {
        app.stock(sku).await == Some(3)
    })
    .await;
    [a, b, c]
}

/// Late payments, refunds: a cancelled order takes its units again when
/// the sale still has them for its buyer, otherwise its payment is owed
/// back; a refund of the payment that paid an order cancels it and gives
/// its units back; the books balance throughout.
#[tokio::test]
async fn a_late_payment_takes_the_units_again_or_is_owed_back() {
    let app = spawn_paying().await;
    let sku = app.new_sale(3, 1).await;
    let [a, b, c] = three_timed_out(&app, &sku).await;
    // Two of the three units go to a new buyer; buyer 3 buys again (the
    // limit is one per buyer: its cancelled order's unit is free again).
    let d = app.confirmed_order(&sku, 4, 1).await;
    let e = app.confirmed_order(&sku, 3, 1).await;
    assert_eq!(app.stock(&sku).await, Some(1));
    let pay = |id: &str, payment: &str| notification("payment.succeeded", id, payment, &amount(1));
    // c's buyer is at their limit: owed back, though a unit is left.
    let (status, answer) = app.notify(&pay(&c, "pay-c")).await;
    assert_eq!(status, StatusCode::OK);
    assert_outcome(&answer, "refund_due", "cancelled");
    // a takes the last unit again.
    let (_, answer) = app.notify(&pay(&a, "pay-a")).await;
    assert_outcome(&answer, "paid_again", "paid");
    assert_eq!(app.stock(&sku).await, Some(0));
    // b is late, and the units are gone: owed back.
    let (_, answer) = app.notify(&pay(&b, "pay-b")).await;
    assert_eq!(answer["result"], "refund_due");
    assert_eq!(app.status_of(&b).await, "cancelled");
    // The same notification again: the first answer, nothing taken twice.
    let (_, again) = app.notify(&pay(&a, "pay-a")).await;
    assert_eq!(
        (&again["result"], &again["replayed"]),
        (&json!("paid_again"), &json!(true))
    );
    assert_eq!(app.stock(&sku).await, Some(0));

    // Refunds: of a's payment (paid): a is cancelled, its unit back.
    let refund =
        |id: &str, payment: &str| notification("payment.refunded", id, payment, &amount(1));
    let (_, answer) = app.notify(&refund(&a, "pay-a")).await;
    assert_outcome(&answer, "refunded", "cancelled");
    eventually("a's unit back", Duration::from_secs(10), || async {
        app.stock(&sku).await == Some(1)
    })
    .await;
    // Of b's (owed back): settled; of a payment never made: unmatched; a
    // partial refund: refused, nothing changed.
    let (_, answer) = app.notify(&refund(&b, "pay-b")).await;
    assert_eq!(answer["result"], "refund_settled");
    let (_, answer) = app.notify(&refund(&d, "pay-never")).await;
    assert_eq!(answer["result"], "unmatched");
    assert_eq!(app.status_of(&d).await, "confirmed");
    let partial = notification("payment.refunded", &e, "pay-e", "1.00");
    assert_eq!(
        app.notify(&partial).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(app.status_of(&e).await, "confirmed");

    assert_recorded(&app, &a, &[("pay-a", "paid_again"), ("pay-a", "refunded")]).await;
    let settled = [("pay-b", "refund_due"), ("pay-b", "refund_settled")];
    assert_recorded(&app, &b, &settled).await;
    assert_recorded(&app, &c, &[("pay-c", "refund_due")]).await;
    app.books_balance(&sku).await;
}

/// A crash between the two halves of a late payment (the units taken in
/// Redis, the payment not yet in the books): reconciliation leaves the
/// units taken, and the payment side's retry finds them and records it,
/// taking nothing twice.
#[tokio::test]
async fn a_late_payment_interrupted_after_taking_its_units_is_finished_by_the_retry() {
    let app = spawn_paying().await;
    let sku = app.new_sale(2, 1).await;
    let sweeper = app.overdue_sweeper();
    let a = app.confirmed_order(&sku, 1, 1).await;
    app.drained(&sku, 1).await;
    sweeper.sweep().await.expect("a sweep");
    eventually("the unit back", Duration::from_secs(10), || async {
        app.stock(&sku).await == Some(2)
    })
    .await;
    // The Redis half alone, as a process that died before its commit.
    let (order_id, product) = flashsale::domain::OrderId::parse(&a).expect("an id");
    let row = app
        .db
        .orders()
        .order(&order_id)
        .await
        .unwrap()
        .expect("a row");
    let pending = flashsale::bookkeeping::pending_order_of(&row).expect("an order");
    assert_eq!(
        app.sales
            .accepted()
            .retake(&pending, row.updated)
            .await
            .unwrap(),
        flashsale::sale::Retake::Taken
    );
    assert_eq!(app.stock(&sku).await, Some(1));
    // Reconciliation (a failover, a restart) does not give them back.
    flashsale::bookkeeping::reconcile::reconcile(app.sales.ledger(), &app.db.orders(), &product)
        .await
        .expect("reconciled");
    assert_eq!(app.stock(&sku).await, Some(1));
    // The retry: paid, the unit taken once.
    let body = notification("payment.succeeded", &a, "pay-a", &amount(1));
    let (_, answer) = app.notify(&body).await;
    assert_eq!(answer["result"], "paid_again");
    assert_eq!(app.stock(&sku).await, Some(1));
    app.books_balance(&sku).await;
}

/// The chaos test's find: the payment timeout's cancel is committed, its
/// Redis half (the release) not yet run, and a late payment comes. The
/// payment finishes the release itself, takes the units again and is
/// `paid_again`; the sweeper's own release of that cancel, arriving after,
/// gives nothing back (the units were sold twice before the fix). A later
/// cancel of the order (a refund) does give them back, once.
#[tokio::test]
async fn a_release_of_the_cancel_a_late_payment_followed_gives_nothing_back() {
    let app = spawn_paying().await;
    let sku = app.new_sale(2, 1).await;
    let books = app.books();
    let a = app.confirmed_order(&sku, 1, 1).await;
    app.drained(&sku, 1).await;
    assert_eq!(app.stock(&sku).await, Some(1));
    // The sweeper's first half: cancelled in MySQL; it has not released yet.
    let cancelled = app
        .db
        .orders()
        .cancel_expired(now_ms() + 1, 10)
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 1);
    let body = notification("payment.succeeded", &a, "pay-a", &amount(1));
    let (_, answer) = app.notify(&body).await;
    assert_eq!(answer["result"], "paid_again");
    assert_eq!(app.stock(&sku).await, Some(1));
    // Now the sweeper's release of its cancel: nothing comes back.
    books.release(&cancelled[0]).await.unwrap();
    assert_eq!(app.stock(&sku).await, Some(1), "units given back twice");
    assert_eq!(app.status_of(&a).await, "paid");
    app.books_balance(&sku).await;
    // A refund is a later cancel: its release gives the unit back, once,
    // however often it runs (the sweeper repairs an interrupted one).
    let refund = notification("payment.refunded", &a, "pay-a", &amount(1));
    assert_eq!(app.notify(&refund).await.1["result"], "refunded");
    assert_eq!(app.stock(&sku).await, Some(2));
    let (order_id, _) = flashsale::domain::OrderId::parse(&a).unwrap();
    let row = app.db.orders().order(&order_id).await.unwrap().unwrap();
    books.release(&row).await.unwrap();
    books.release(&cancelled[0]).await.unwrap();
    assert_eq!(app.stock(&sku).await, Some(2));
    app.books_balance(&sku).await;
}

/// After a sale is retired and its Redis keys purged: a refund of a paid
/// order cancels it in the books and writes nothing back to Redis (no key
/// of the sale comes back); a late payment for an order cancelled before
/// the end is owed back (the sale has no units to take again).
#[tokio::test]
async fn payments_after_a_sale_is_retired_touch_only_the_books() {
    let app = spawn_paying().await;
    let sku = app.new_sale(5, 1).await;
    let paid = app.confirmed_order(&sku, 1, 1).await;
    let cancelled = app.confirmed_order(&sku, 2, 1).await;
    app.drained(&sku, 2).await;
    let (_, answer) = app
        .notify_of("payment.succeeded", &paid, "pay-1", &amount(1))
        .await;
    assert_eq!(answer["result"], "paid");
    assert_eq!(app.cancel(&cancelled, 2).await.status(), StatusCode::OK);
    app.close_sale(&sku).await;
    let workers = app.retiring_workers("w", Duration::ZERO);
    let pass = workers.retirer().pass().await.expect("a pass");
    assert_eq!(pass.retired.len(), 1, "{pass:?}");
    assert_eq!(pass.purged.len(), 1, "{pass:?}");
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let keys = app.sales.keys(&product);
    let left = || async {
        let mut r = app.redis.clone();
        let mut left = Vec::new();
        for key in keys.all() {
            if redis::AsyncCommands::exists::<_, bool>(&mut r, key)
                .await
                .unwrap()
            {
                left.push(key.to_owned());
            }
        }
        left
    };
    assert!(left().await.is_empty());

    let (status, answer) = app
        .notify_of("payment.refunded", &paid, "pay-1", &amount(1))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_outcome(&answer, "refunded", "cancelled");
    let (_, answer) = app
        .notify_of("payment.succeeded", &cancelled, "pay-2", &amount(1))
        .await;
    assert_outcome(&answer, "refund_due", "cancelled");
    assert!(left().await.is_empty(), "a retired sale's keys came back");
    let released: bool = sqlx::query_scalar("SELECT released FROM tb_order WHERE order_id = ?")
        .bind(&paid)
        .fetch_one(&app.mysql)
        .await
        .unwrap();
    assert!(released, "the refunded order's units are marked back");
}
