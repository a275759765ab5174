//! The stream workers: every accepted order ends up in `tb_order` exactly once.

use std::collections::HashSet;
use std::time::Duration;

use flashsale::domain::ProductId;
use flashsale::sale::Entry;
use flashsale::sale::keys::GROUP;
use flashsale::worker::Workers;
use redis::AsyncCommands;
use redis::streams::StreamReadOptions;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::helpers::{Backend, TestApp, eventually, fast_workers, spawn_app_on, unique};
use crate::proxy::Proxy;

/// Fires `users` buyers at a sale, each asking for 1 or 2 units; returns the
/// accepted orders (id, user, quantity).
async fn burst(app: &TestApp, sku: &str, users: u64) -> Vec<(String, u64, u64)> {
    let mut set = JoinSet::new();
    for user in 1..=users {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.to_owned());
        let quantity = 1 + user % 2;
        set.spawn(async move {
            let body = json!({"user_id": user, "product_id": sku, "quantity": quantity});
            let resp = client.post(url).json(&body).send().await.expect("answered");
            match resp.status() {
                StatusCode::ACCEPTED => {
                    let v: Value = resp.json().await.expect("json");
                    Some((
                        v["order_id"].as_str().expect("id").to_owned(),
                        user,
                        quantity,
                    ))
                }
                StatusCode::CONFLICT => None,
                other => panic!("unexpected status {other}"),
            }
        });
    }
    let mut accepted = Vec::new();
    while let Some(r) = set.join_next().await {
        accepted.extend(r.expect("task"));
    }
    accepted
}

/// Reads up to `count` new entries as `consumer`, without acking them.
async fn read_as(app: &TestApp, sku: &str, consumer: &str, count: usize) -> Vec<Entry> {
    let mut r = app.redis.clone();
    let opts = StreamReadOptions::default()
        .group(GROUP, consumer)
        .count(count);
    let reply: redis::Value = r
        .xread_options(&[app.key(sku, "orders")], &[">"], &opts)
        .await
        .expect("XREADGROUP");
    Entry::decode_read(reply).expect("entries")
}

fn pid(sku: &str) -> ProductId {
    ProductId::parse(sku).expect("valid id")
}

async fn a_sold_out_sale_is_drained_into_mysql_exactly_once(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(100, 2).await;
    let accepted = burst(&app, &sku, 150).await;
    let units: u64 = accepted.iter().map(|a| a.2).sum();
    assert_eq!(units, 100, "the sale sold out exactly");
    app.drained(&sku, 100).await;

    let (rows, distinct, persisted_units) = app.persisted(&sku).await;
    assert_eq!(rows as usize, accepted.len());
    assert_eq!(distinct, rows, "no duplicate order ids");
    assert_eq!(persisted_units, 100);
    assert_eq!(app.available_qty(&sku).await, 0);
    assert_eq!(app.stock(&sku).await, Some(0));

    // Every accepted order is there with its own fields, and reads back confirmed.
    let rows = app.order_rows(&sku).await;
    let rows: HashSet<(String, u64, u64)> = rows
        .into_iter()
        .map(|(id, u, q)| (id, u as u64, q as u64))
        .collect();
    let accepted_set: HashSet<_> = accepted.iter().cloned().collect();
    assert_eq!(rows, accepted_set);
    let (id, user, _) = &accepted[0];
    let (status, order) = app.get_json(&format!("/api/orders/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(order["status"], "confirmed");
    let (status, list) = app.get_json(&format!("/api/users/{user}/orders")).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["order_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
}

async fn a_worker_killed_between_commit_and_ack_is_finished_by_another(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    app.accept_orders(&sku, 1..=5).await;
    // The doomed worker reads the batch and commits it ...
    let batch = read_as(&app, &sku, "doomed", 10).await;
    assert_eq!(batch.len(), 5);
    let orders: Vec<_> = batch.iter().map(|e| e.order(&pid(&sku)).unwrap()).collect();
    let persisted = app
        .db
        .orders()
        .persist_orders(&pid(&sku), &orders)
        .await
        .unwrap();
    assert_eq!(persisted.units, 5);
    // ... and dies before XACK. Another consumer reclaims the idle entries.
    assert_eq!(app.pending(&sku).await, 5);
    let mut cfg = fast_workers("rescuer");
    cfg.claim_idle = Duration::from_millis(100);
    // Idle for longer than that.
    let idle = cfg.claim_idle * 3 / 2;
    let mut rescuer = Workers::new(&app.sales, &app.db, cfg).sale_worker(pid(&sku));
    tokio::time::sleep(idle).await;
    let outcome = rescuer.reclaim().await.unwrap();
    assert_eq!(outcome.read, 5);
    assert_eq!(outcome.acked, 5);
    assert_eq!(outcome.persisted.inserted, 0, "the rows were there already");

    assert_eq!(app.pending(&sku).await, 0);
    assert_eq!(app.persisted(&sku).await, (5, 5, 5));
    assert_eq!(app.available_qty(&sku).await, 5, "decremented once");
}

async fn a_restarted_worker_finishes_its_own_pending_entries_first(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    for user in 1..=3 {
        app.place_order(user, &sku, 1).await;
    }
    // Read by "w1" in an earlier life, never acked.
    assert_eq!(read_as(&app, &sku, "w1", 10).await.len(), 3);
    app.place_order(4, &sku, 1).await;

    let workers = Workers::new(&app.sales, &app.db, fast_workers("w1"));
    let mut w1 = workers.sale_worker(pid(&sku));
    let first = w1.step().await.unwrap();
    assert_eq!(
        (first.read, first.acked),
        (3, 3),
        "own pending entries first"
    );
    let second = w1.step().await.unwrap();
    assert_eq!(second.read, 1, "then the new entry");
    assert_eq!(app.persisted(&sku).await, (4, 4, 4));
    assert_eq!(app.pending(&sku).await, 0);
}

async fn a_poison_entry_ends_in_dead_letters_and_the_rest_is_persisted(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    app.place_order(1, &sku, 1).await;
    let poison = app.add_poison_entry(&sku).await;
    app.place_order(3, &sku, 1).await;

    let mut cfg = fast_workers("w");
    cfg.claim_idle = Duration::ZERO;
    cfg.max_deliveries = 2;
    let w = Workers::new(&app.sales, &app.db, cfg);
    let metrics = w.metrics();
    let mut worker = w.sale_worker(pid(&sku));
    let step = worker.step().await.unwrap();
    assert_eq!((step.read, step.acked, step.kept, step.dead), (3, 2, 1, 0));
    assert_eq!(
        app.persisted(&sku).await,
        (2, 2, 2),
        "the rest of the batch is persisted"
    );

    let again = worker.reclaim().await.unwrap(); // second delivery: kept
    assert_eq!((again.kept, again.dead), (1, 0));
    let last = worker.reclaim().await.unwrap(); // third delivery > 2: dead letter
    assert_eq!((last.kept, last.dead), (0, 1));
    assert_eq!(metrics.dead_letters.get(), 1);
    assert_eq!(app.pending(&sku).await, 0);

    let dead = app.dead_letters(&sku).await;
    assert_eq!(dead.len(), 1);
    let fields: std::collections::HashMap<_, _> = dead[0].1.iter().cloned().collect();
    assert_eq!(fields["dead_source_id"], poison);
    assert_eq!(fields["quantity"], "lots", "the original fields are kept");
    assert!(fields["dead_reason"].contains("quantity"), "{fields:?}");
    assert_eq!(fields["dead_deliveries"], "3");

    // The worker keeps going.
    app.place_order(4, &sku, 1).await;
    let next = worker.step().await.unwrap();
    assert_eq!(next.acked, 1);
    assert_eq!(app.persisted(&sku).await, (3, 3, 3));
    drop(w);
}

/// A keyed order's entry carries its Idempotency-Key beside the order's JSON
/// (a key may hold any visible character); an entry written by an earlier
/// version, a field per value, is persisted as well.
async fn keyed_orders_and_entries_of_the_earlier_shape_are_persisted_whole(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(10, 1).await;
    let key = r#"k"e\y{"},:1"#;
    let keyed = app
        .post_order(
            &json!({"user_id": 7, "product_id": sku, "quantity": 1}),
            Some(key),
        )
        .await;
    assert_eq!(keyed.status(), StatusCode::ACCEPTED);
    let keyed: Value = keyed.json().await.unwrap();
    let old_id = format!("{sku}:0123456789abcdef0123456789abcdef0042");
    app.add_entry_of_fields(&sku, &old_id, 8, "1").await;

    let w = Workers::new(&app.sales, &app.db, fast_workers("w"));
    let step = w.sale_worker(pid(&sku)).step().await.unwrap();
    assert_eq!((step.read, step.acked, step.dead), (2, 2, 0));
    let rows: Vec<(String, i64, i64, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT order_id, user_id, quantity, CAST(price AS CHAR), created, idempotency_key \
         FROM tb_order WHERE product_id = ? ORDER BY user_id",
    )
    .bind(&sku)
    .fetch_all(&app.mysql)
    .await
    .unwrap();
    let price: rust_decimal::Decimal = rows[0].3.parse().unwrap();
    assert_eq!(
        (
            &rows[0].0,
            rows[0].1,
            rows[0].2,
            price.normalize().to_string()
        ),
        (
            &keyed["order_id"].as_str().unwrap().to_owned(),
            7,
            1,
            keyed["price"].as_str().unwrap().to_owned()
        )
    );
    assert_eq!(rows[0].4, keyed["created"].as_i64().unwrap());
    assert_eq!(rows[0].5.as_deref(), Some(key));
    assert_eq!(
        (&rows[1].0, rows[1].1, rows[1].2, rows[1].4),
        (&old_id, 8, 1, 1)
    );
    assert_eq!(rows[1].5.as_deref(), Some("old-key"));
    drop(w);
}

async fn orders_accepted_while_mysql_is_down_are_persisted_when_it_returns(backend: Backend) {
    let proxy = Proxy::start("127.0.0.1:3306").await;
    let app = spawn_app_on(backend, |s| {
        s.db.url =
            s.db.url
                .replace("127.0.0.1:3306", &format!("127.0.0.1:{}", proxy.port));
        s.db.timeout = Duration::from_millis(500);
    })
    .await;
    let sku = app.new_sale(50, 1).await;
    proxy.set_on(false);
    for user in 1..=20 {
        let resp = app.place_order(user, &sku, 1).await;
        assert_eq!(
            resp.status(),
            StatusCode::ACCEPTED,
            "orders never wait for MySQL"
        );
    }
    // Longer than a write's timeout: the workers fail and back off meanwhile.
    tokio::time::sleep(app.settings.db.timeout * 8 / 5).await;
    assert_eq!(app.persisted(&sku).await.0, 0);
    let (status, _) = app.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    proxy.set_on(true);
    app.drained(&sku, 20).await;
    assert_eq!(app.persisted(&sku).await, (20, 20, 20));
    assert_eq!(app.available_qty(&sku).await, 30);
}

async fn two_workers_on_one_sale_persist_every_order_once(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(300, 2).await;
    let token = CancellationToken::new();
    let mut runs = Vec::new();
    for name in ["a", "b"] {
        let mut cfg = fast_workers(name);
        cfg.batch_size = 7; // small batches: both consumers take part
        let w = Workers::new(&app.sales, &app.db, cfg);
        runs.push(tokio::spawn(w.run(token.clone())));
    }
    let accepted = burst(&app, &sku, 400).await;
    let units: u64 = accepted.iter().map(|a| a.2).sum();
    assert_eq!(units, 300);
    app.drained(&sku, 300).await;
    token.cancel();
    for r in runs {
        r.await.unwrap();
    }
    let (rows, distinct, _) = app.persisted(&sku).await;
    assert_eq!(
        (rows as usize, distinct as usize),
        (accepted.len(), accepted.len())
    );
    assert_eq!(app.available_qty(&sku).await, 0);
}

async fn trimming_keeps_pending_and_undelivered_entries_and_the_retention(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(20, 1).await;
    let mut cfg = fast_workers("w");
    cfg.retention = Duration::ZERO;
    let workers = Workers::new(&app.sales, &app.db, cfg);
    let mut w = workers.sale_worker(pid(&sku));
    for user in 1..=3 {
        app.place_order(user, &sku, 1).await;
    }
    assert_eq!(w.step().await.unwrap().acked, 3);
    for user in 4..=5 {
        app.place_order(user, &sku, 1).await;
    }
    assert_eq!(read_as(&app, &sku, "slow", 10).await.len(), 2); // pending, not acked
    app.place_order(6, &sku, 1).await; // not delivered yet

    // A worker that keeps acked entries ten minutes trims nothing.
    let keeper = Workers::new(&app.sales, &app.db, fast_workers("k"));
    assert_eq!(keeper.sale_worker(pid(&sku)).trim().await.unwrap(), 0);
    assert_eq!(app.stream_len(&sku).await, 6);
    // With no retention, exactly the three acked entries go.
    assert_eq!(w.trim().await.unwrap(), 3);
    assert_eq!(app.stream_len(&sku).await, 3);
    assert_eq!(app.pending(&sku).await, 2);
}

async fn shutdown_finishes_the_batch_in_hand(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(50, 1).await;
    let token = CancellationToken::new();
    let run = tokio::spawn(
        Workers::new(&app.sales, &app.db, fast_workers(&unique("w"))).run(token.clone()),
    );
    for user in 1..=30 {
        app.place_order(user, &sku, 1).await;
    }
    eventually("some orders persisted", Duration::from_secs(10), || async {
        app.persisted(&sku).await.0 > 0
    })
    .await;
    token.cancel();
    run.await.expect("workers stop after shutdown");
    assert_eq!(app.pending(&sku).await, 0, "nothing read was left unacked");
}

async fn listing_a_users_orders_validates_its_input(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    for path in [
        "/api/users/0/orders",
        "/api/users/abc/orders",
        "/api/users/1/orders?limit=0",
        "/api/users/1/orders?limit=x",
    ] {
        let (status, body) = app.get_json(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(body["error"], "invalid_request", "{path}");
    }
    let (status, body) = app.get_json("/api/users/77/orders").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["orders"], json!([]));
}

async fn a_blocking_read_on_an_idle_stream_waits_its_full_block_without_error(backend: Backend) {
    let app = spawn_app_on(backend, |s| s.workers = None).await;
    let sku = app.new_sale(5, 1).await;
    let mut cfg = fast_workers("w");
    // Longer than redis-rs's default 500 ms response timeout.
    cfg.block = Duration::from_millis(1200);
    let workers = Workers::new(&app.sales, &app.db, cfg);
    let mut w = workers.sale_worker(pid(&sku));
    let outcome = w.step().await.expect("an idle read is not an error");
    assert_eq!(outcome.read, 0);
    // And the connection is still good for the next read.
    app.place_order(1, &sku, 1).await;
    assert_eq!(w.step().await.unwrap().acked, 1);
}

async fn more_open_sales_than_pooled_connections_are_all_drained(backend: Backend) {
    let app = spawn_app_on(backend, |s| {
        s.redis.pool_size = 1;
        if let Some(w) = s.workers.as_mut() {
            w.block = Duration::from_secs(2);
        }
    })
    .await;
    let mut skus = Vec::new();
    for _ in 0..6 {
        let sku = app.new_sale(5, 1).await;
        app.accept_orders(&sku, 1..=3).await;
        skus.push(sku);
    }
    for sku in &skus {
        app.drained(sku, 3).await;
    }
}

crate::on_both_backends!(
    a_sold_out_sale_is_drained_into_mysql_exactly_once,
    a_worker_killed_between_commit_and_ack_is_finished_by_another,
    a_restarted_worker_finishes_its_own_pending_entries_first,
    a_poison_entry_ends_in_dead_letters_and_the_rest_is_persisted,
    keyed_orders_and_entries_of_the_earlier_shape_are_persisted_whole,
    orders_accepted_while_mysql_is_down_are_persisted_when_it_returns,
    two_workers_on_one_sale_persist_every_order_once,
    trimming_keeps_pending_and_undelivered_entries_and_the_retention,
    shutdown_finishes_the_batch_in_hand,
    listing_a_users_orders_validates_its_input,
    a_blocking_read_on_an_idle_stream_waits_its_full_block_without_error,
    more_open_sales_than_pooled_connections_are_all_drained,
);

/// The largest batch the workers may read is persisted by one statement:
/// BATCH_SIZE was once allowed up to 10,000 rows, past MySQL's 65,535
/// placeholders (9 a row), and such a batch could never be persisted.
#[tokio::test]
async fn the_largest_batch_is_persisted_in_one_call() {
    use flashsale::config::MAX_BATCH_SIZE;
    use flashsale::domain::{OrderId, PendingOrder, Quantity, UserId, now_ms};
    let app = spawn_app_on(Backend::Single, |s| s.workers = None).await;
    let sku = app.new_sale(MAX_BATCH_SIZE as u64, 1).await;
    let product = pid(&sku);
    let orders: Vec<PendingOrder> = (1..=MAX_BATCH_SIZE as u64)
        .map(|user_id| PendingOrder {
            order_id: OrderId::generate(&product),
            user_id: UserId::new(user_id).unwrap(),
            product_id: product.clone(),
            quantity: Quantity::ONE,
            price: "4999.00".parse().unwrap(),
            created_ms: now_ms(),
            idempotency_key: Some(format!("key-{user_id}")),
        })
        .collect();
    let persisted = app
        .db
        .orders()
        .persist_orders(&product, &orders)
        .await
        .unwrap();
    assert_eq!(persisted.inserted, MAX_BATCH_SIZE as u64);
    assert_eq!(app.available_qty(&sku).await, 0);
}
