//! A master lost after its replication link was cut: the writes made during
//! the cut die with it, and the promoted replica never saw them. Keyed
//! clients keep retrying. With `REDIS_WAIT_REPLICAS=1` nothing acknowledged
//! may be among them: afterwards every 202 is in the books exactly once, no
//! unit is sold twice, no buyer is over the limit, and the audit balances.
//! With 0, the books already hold most of what the new master lost (the
//! workers persisted it from the old one): reconciliation must put it back
//! in Redis, so that no unit is sold twice, no key gets a second order, no
//! buyer goes over the limit and the audit balances; acknowledged orders
//! the workers had not read yet are lost (counted, as the README says).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{
    Backend, OwnCluster, TestApp, eventually, eventually_some, poll_for, spawn_app_on,
};
use crate::nodes::{await_failover, master_of, port_of, restart_node, server_pid, signal};

/// Sized with the pace below to sell out well after the failover.
const STOCK: u64 = 600;
const LIMIT: u64 = 2;
const USERS: u64 = 300;

/// What one keyed order ended as, after its retries.
#[derive(Debug)]
enum Fate {
    Accepted { order_id: String, user: u64 },
    Refused(String),
}

/// Sends one order under `key`, retrying the same key after a 503 or a
/// transport error, until a definitive answer (bounded).
async fn order_until_answered(app: &TestApp, sku: &str, user: u64, key: &str) -> Fate {
    let body = json!({"user_id": user, "product_id": sku, "quantity": 1});
    let what = format!("{key}: a definitive answer");
    eventually_some(&what, Duration::from_secs(120), || async {
        let resp = app
            .client
            .post(app.url("/api/orders"))
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .ok()?;
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap_or(Value::Null);
        if status == StatusCode::ACCEPTED {
            let order_id = answer["order_id"].as_str().unwrap().to_owned();
            return Some(Fate::Accepted { order_id, user });
        }
        if status.is_client_error() {
            return Some(Fate::Refused(
                answer["error"].as_str().unwrap_or("").to_owned(),
            ));
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        None
    })
    .await
}

/// An accepted order, for the buyers' cancels and pays: what to do with
/// it (0 cancel, 1 pay, 2 nothing), and whether it was accepted while the
/// master's replication was cut.
struct Accepted {
    id: String,
    user: u64,
    choice: u64,
    in_cut: bool,
}

/// For each accepted order: once it is confirmed, cancels or pays it
/// (retried through 503s and transport errors until answered). The cancels
/// of orders accepted during the cut wait for `failed_over`, and go all at
/// once then: they reach the new master, which lost those orders, before
/// reconciliation does. Returns (cancelled, paid).
async fn cancel_and_pay(
    app: std::sync::Arc<TestApp>,
    mut orders: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    failed_over: tokio::sync::watch::Receiver<bool>,
) -> (usize, usize) {
    let mut acting = JoinSet::new();
    while let Some(Accepted {
        id,
        user,
        choice,
        in_cut,
    }) = orders.recv().await
    {
        let action = match choice {
            0 => "cancel",
            1 => "pay",
            _ => continue,
        };
        let app = app.clone();
        let mut failed_over = failed_over.clone();
        acting.spawn(async move {
            if in_cut && action == "cancel" {
                let _ = failed_over.wait_for(|done| *done).await;
            }
            // An order lost with its master before the workers read it never
            // becomes confirmed: given up on after a while (counted above).
            poll_for(Duration::from_secs(30), || async {
                let (status, order) = app.get_json(&format!("/api/orders/{id}")).await;
                (status == StatusCode::OK && order["status"] == "confirmed").then_some(())
            })
            .await;
            // The action, until taken (Some) or refused (None), or given up on.
            let done = poll_for(Duration::from_secs(30), || async {
                let resp = app
                    .client
                    .post(app.url(&format!("/api/orders/{id}/{action}")))
                    .json(&json!({"user_id": user}))
                    .send()
                    .await
                    .ok()?;
                match resp.status() {
                    StatusCode::OK => Some(Some(action)),
                    s if s.is_client_error() => Some(None),
                    _ => None,
                }
            })
            .await;
            done.flatten()
        });
    }
    let (mut cancelled, mut paid) = (0, 0);
    while let Some(done) = acting.join_next().await {
        match done.unwrap() {
            Some("cancel") => cancelled += 1,
            Some(_) => paid += 1,
            None => {}
        }
    }
    (cancelled, paid)
}

/// Cuts the master on `port` off from its replica: the replica's link is
/// killed, and the master refuses it the commands it reconnects with, so
/// the master takes writes its replica never gets.
pub(crate) async fn cut_replication(port: u16) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-psync")
        .arg("-sync")
        .arg("-replconf")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test]
async fn with_wait_a_master_lost_after_a_replication_cut_loses_no_acknowledged_order() {
    let lost = cut_and_kill(7600, 1).await;
    assert_eq!(lost, 0, "acknowledged orders lost");
}

#[tokio::test]
async fn without_wait_reconciliation_keeps_the_books_after_a_master_lost_writes() {
    cut_and_kill(7700, 0).await;
}

/// The scenario, with `WAIT replicas`; checks the books and returns how many
/// acknowledged orders are not in them (must be 0 with WAIT on).
async fn cut_and_kill(base: u16, replicas: u32) -> usize {
    let _cluster = OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        s.redis.wait = Some(flashsale::config::ReplicaWait {
            replicas,
            timeout: Duration::from_millis(200),
        });
        s.redis.timeout = Duration::from_millis(1000);
    })
    .await;
    let sku = app.new_sale(STOCK, LIMIT).await;
    let victim = master_of(&app.redis_below(), &app.key(&sku, "orders")).await;
    let port = port_of(&victim);
    let app = std::sync::Arc::new(app);

    // Buyers for 12 s: each order under its own key, retried until answered;
    // a third of the accepted orders are cancelled and a third paid as soon
    // as they are confirmed, so cancels and pays are in flight through the
    // failover (a cancel reaching the new master before reconciliation).
    let end = Instant::now() + Duration::from_secs(12);
    let (after_tx, after_rx) = tokio::sync::mpsc::unbounded_channel();
    let (failed_over, failed_over_rx) = tokio::sync::watch::channel(false);
    let cutting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let afterwards = tokio::spawn(cancel_and_pay(app.clone(), after_rx, failed_over_rx));
    let mut buyers = JoinSet::new();
    for buyer in 0..8u64 {
        let (app, sku, after) = (app.clone(), sku.clone(), after_tx.clone());
        let cutting = cutting.clone();
        buyers.spawn(async move {
            let mut fates = Vec::new();
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let user = (buyer * 7919 + n * 104_729) % USERS + 1;
                let key = format!("b{buyer}-{n}");
                let fate = order_until_answered(&app, &sku, user, &key).await;
                if let Fate::Accepted { order_id, user } = &fate {
                    let _ = after.send(Accepted {
                        id: order_id.clone(),
                        user: *user,
                        choice: n % 3,
                        in_cut: cutting.load(std::sync::atomic::Ordering::Relaxed),
                    });
                }
                fates.push((key, fate));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            fates
        });
    }
    drop(after_tx);

    // Two seconds in: the link is cut; 1.5 s later the master dies.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cutting.store(true, std::sync::atomic::Ordering::Relaxed);
    cut_replication(port).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(server_pid(port).await, "-9");
    await_failover(base, &victim, &app.key(&sku, "orders")).await;
    cutting.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = failed_over.send(true);
    let promoted_ms = crate::helpers::now_ms();
    restart_node(base, port);

    let mut fates: HashMap<String, Fate> = HashMap::new();
    while let Some(done) = buyers.join_next().await {
        fates.extend(done.unwrap());
    }
    let (cancelled, paid) = afterwards.await.unwrap();
    eprintln!("WAIT {replicas}: {cancelled} orders cancelled, {paid} paid by their buyers");
    let accepted: Vec<(&String, &String, u64)> = fates
        .iter()
        .filter_map(|(key, fate)| match fate {
            Fate::Accepted { order_id, user } => Some((key, order_id, *user)),
            Fate::Refused(_) => None,
        })
        .collect();
    let mut refusals: BTreeMap<&str, usize> = BTreeMap::new();
    for fate in fates.values() {
        if let Fate::Refused(code) = fate {
            *refusals.entry(code.as_str()).or_default() += 1;
        }
    }
    eprintln!(
        "{} keys: {} accepted, refused {refusals:?}",
        fates.len(),
        accepted.len()
    );

    // Every 202 in the books, once; nothing else in them.
    let told: HashMap<&str, u64> = accepted
        .iter()
        .map(|(_, id, u)| (id.as_str(), *u))
        .collect();
    assert_eq!(
        told.len(),
        accepted.len(),
        "two keys were given one order id"
    );
    eventually("the stream drained", Duration::from_secs(60), || async {
        let enough = replicas == 0 || app.persisted(&sku).await.0 as usize >= told.len();
        enough && app.pending(&sku).await == 0
    })
    .await;
    let rows = app.order_rows(&sku).await;
    let mut in_books: HashMap<&str, usize> = HashMap::new();
    for (id, _, _) in &rows {
        *in_books.entry(id.as_str()).or_default() += 1;
    }
    // Units held: a cancelled order's went back on sale (and to its buyer's
    // allowance).
    let held: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT user_id, CAST(SUM(quantity) AS SIGNED) FROM tb_order \
         WHERE product_id = ? AND status <> 'cancelled' GROUP BY user_id",
    )
    .bind(&sku)
    .fetch_all(&app.mysql)
    .await
    .unwrap();
    let per_user: HashMap<i64, i64> = held.into_iter().collect();
    let doubled: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT idempotency_key, COUNT(*) FROM tb_order WHERE product_id = ? \
         GROUP BY idempotency_key HAVING COUNT(*) > 1",
    )
    .bind(&sku)
    .fetch_all(&app.mysql)
    .await
    .unwrap();
    let over: Vec<_> = per_user
        .iter()
        .filter(|(_, u)| **u > LIMIT as i64)
        .collect();
    let units: i64 = per_user.values().sum();
    let audit = app.audit(&sku).await;
    eprintln!(
        "WAIT {replicas}: {} rows, {units} units; keys with two orders {doubled:?}; users over the limit {over:?}; repaired {}",
        rows.len(),
        audit["audit"]["repaired"]
    );
    assert!(units as u64 <= STOCK, "oversold: {units} units of {STOCK}");
    assert_eq!(audit["ok"], true, "{audit:#}");
    for (id, n) in &in_books {
        assert_eq!(*n, 1, "order {id} in the books {n} times");
    }
    let lost = told.keys().filter(|id| !in_books.contains_key(*id)).count();
    let untold: Vec<_> = in_books
        .keys()
        .filter(|id| !told.contains_key(*id))
        .collect();
    eprintln!(
        "WAIT {replicas}: {lost} acknowledged orders lost, {} in the books untold; last repair {} ms after the test saw the new master",
        untold.len(),
        audit["audit"]["repaired"]["last_ms"]
            .as_i64()
            .map_or(0, |t| t - promoted_ms)
    );
    if replicas > 0 {
        assert!(
            untold.is_empty(),
            "orders in the books nobody was told of: {untold:?}"
        );
        assert!(doubled.is_empty(), "keys with two orders: {doubled:?}");
        assert!(over.is_empty(), "users over the limit: {over:?}");
    } else {
        // The new master lost what the workers had persisted from the old
        // one: reconciliation restored it (without it the audit fails).
        assert!(
            audit["audit"]["repaired"]["orders"].as_u64() > Some(0),
            "{audit:#}"
        );
    }
    lost
}
