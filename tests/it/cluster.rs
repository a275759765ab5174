//! The cluster as a deployment: sales spread over the masters, each sale in
//! one slot, all of them sold out at once and every order persisted once.

use std::collections::{HashMap, HashSet};

use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{Backend, eventually, poll_for, spawn_app_on};
use crate::nodes::{master_of, replica_pid, server_pid, signal};

#[tokio::test]
async fn many_sales_on_all_masters_sold_out_at_once_persist_every_order_once() {
    let app = spawn_app_on(Backend::Cluster, |_| {}).await;
    // Open sales until all three masters hold some (ids hash at random).
    let mut skus = Vec::new();
    let mut masters = HashSet::new();
    while skus.len() < 6 || masters.len() < 3 {
        assert!(skus.len() < 60, "sales never spread over 3 masters");
        let sku = app.new_sale(40, 1).await;
        masters.insert(master_of(&app.redis_below(), &app.key(&sku, "orders")).await);
        skus.push(sku);
    }
    let mut set = JoinSet::new();
    for (s, sku) in skus.iter().enumerate() {
        for user in 1..=100u64 {
            let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
            set.spawn(async move {
                let body =
                    json!({"user_id": user + 1000 * s as u64, "product_id": sku, "quantity": 1});
                client
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("answered")
                    .status()
            });
        }
    }
    let mut accepted = 0;
    while let Some(status) = set.join_next().await {
        match status.expect("task") {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(accepted, 40 * skus.len());
    for sku in &skus {
        app.drained(sku, 40).await;
        assert_eq!(app.persisted(sku).await, (40, 40, 40));
        assert_eq!(app.stock(sku).await, Some(0));
        assert_eq!(app.available_qty(sku).await, 0);
    }
}

fn wait_for_one_replica(s: &mut flashsale::config::Settings) {
    s.redis.wait = Some(flashsale::config::ReplicaWait {
        replicas: 1,
        timeout: std::time::Duration::from_millis(200),
    });
}

#[tokio::test]
async fn with_wait_an_order_is_answered_once_a_replica_has_it() {
    let app = spawn_app_on(Backend::Cluster, wait_for_one_replica).await;
    let sku = app.new_sale(10, 2).await;
    for user in 1..=5 {
        app.order_until_accepted(user, &sku).await;
    }
    assert_eq!(app.stock(&sku).await, Some(5));
}

/// With WAIT and no replica to confirm it, an order is answered 503, and so
/// is every keyed retry of it: a 202, first answer or replay, means the
/// replicas have the order.
#[tokio::test]
async fn with_wait_and_no_replica_an_order_answered_503_is_taken_back_and_never_persisted() {
    // The single test server has no replica: WAIT times out with 0 acks.
    // (No workers in the service: their WAIT would keep the entries.)
    let app = spawn_app_on(Backend::Single, |s| {
        wait_for_one_replica(s);
        s.workers = None;
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 1});
    for attempt in 0..3 {
        let resp = app.post_order(&body, Some("k1")).await;
        assert_eq!(
            resp.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "attempt {attempt}"
        );
        let err: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(err["error"], "unavailable");
        assert!(
            err["message"].as_str().unwrap().contains("replicas"),
            "{err}"
        );
    }
    // Each attempt was a new order (the key's record went with the void),
    // each taken back: stock and allowance whole.
    assert_eq!(app.stock(&sku).await, Some(10), "nothing deducted");
    assert_eq!(app.bought(&sku, 1).await, 0);
    assert_eq!(app.stream_len(&sku).await, 3);

    // A worker (here one without WAIT, so that it gets that far) acks the
    // voided entries without a row.
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let sales = flashsale::sale::Sales::new(
        app.redis_below(),
        app.prefix.clone(),
        flashsale::config::MemorySettings::default(),
        None,
    );
    let workers =
        flashsale::worker::Workers::new(&sales, &app.db, crate::helpers::fast_workers("no-wait"));
    let mut worker = workers.sale_worker(product);
    let mut acked = 0;
    for _ in 0..3 {
        acked += worker.step().await.unwrap().acked;
    }
    acked += worker.finish().await.unwrap().acked;
    assert_eq!(acked, 3);
    assert_eq!(
        app.persisted(&sku).await.0,
        0,
        "a voided order was persisted"
    );
    assert_eq!(app.pending(&sku).await, 0);
    let audit = app.audit(&sku).await;
    assert_eq!(audit["ok"], true, "{audit:#}");
}

/// Sends `request` again (for 5 s at most), while it is answered
/// 503, as a client retrying with its key would; returns the last answer.
async fn while_unavailable<F, Fut>(request: F) -> reqwest::Response
where
    F: Fn() -> Fut,
    Fut: Future<Output = reqwest::Response>,
{
    let last = std::cell::RefCell::new(None);
    let answered = poll_for(std::time::Duration::from_secs(5), || async {
        let resp = request().await;
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            return Some(resp);
        }
        last.replace(Some(resp));
        None
    })
    .await;
    answered.unwrap_or_else(|| last.into_inner().expect("asked at least once"))
}

/// While the sale's replica lags (paused), keyed retries of an order are
/// answered 503 like the order itself; once it has caught up, the next
/// retry gets the order, replayed, deducted once.
#[tokio::test]
async fn a_keyed_retry_gets_its_202_only_once_the_replica_has_the_order() {
    let base = 7200;
    let _cluster = crate::helpers::OwnCluster::start(base);
    // A WAIT long enough that the retry below (50 ms later, through
    // another instance) arrives within it on a loaded machine, and short
    // enough that three of them stay within the node timeout.
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        s.redis.wait = Some(flashsale::config::ReplicaWait {
            replicas: 1,
            timeout: std::time::Duration::from_millis(500),
        });
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    let replica = replica_pid(&app, &sku).await;
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 1});

    // Paused for less than the cluster's node timeout (2 s): it lags, it
    // does not fail over.
    // Retries land on another instance, as behind a load balancer: its
    // connections never wrote the order, so only the replay's own write
    // makes its WAIT wait for the order.
    let other = app.serve_beside(|_| {}).await.ready().await;
    // Its connection to the sale's master made now, not by the retry
    // below: on a loaded machine, connecting (and learning the slots)
    // could outlast the first request's WAIT, and the retry would then
    // find the order taken back and place a new one.
    let product = app
        .client
        .get(format!("{}/api/products/{sku}", other.base))
        .send()
        .await
        .unwrap();
    assert_eq!(product.status(), StatusCode::OK);
    let retry = || {
        app.client
            .post(format!("{}/api/orders", other.base))
            .header("Idempotency-Key", "k1")
            .json(&body)
            .send()
    };
    signal(replica, "-STOP");
    // The retry comes while the first request still waits for its WAIT (a
    // client that timed out early): that first request can no longer take
    // the order back, since the retry's answer might be the 202.
    let first = app.post_order(&body, Some("k1"));
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        retry().await.unwrap()
    };
    let (first, second) = tokio::join!(first, second);
    let third = retry().await.unwrap().status();
    signal(replica, "-CONT");
    assert_eq!(
        [first.status(), second.status(), third],
        [StatusCode::SERVICE_UNAVAILABLE; 3]
    );

    // The replica catches up within moments; a client keeps retrying.
    let resp = while_unavailable(|| async { retry().await.unwrap() }).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let order: Value = resp.json().await.unwrap();
    if !replayed {
        // On a loaded machine the retry can arrive after the first
        // request's WAIT ran out: that order was then taken back (voided,
        // its key freed), and the retries placed the one that stands.
        let void: HashMap<String, String> = app
            .redis
            .clone()
            .hgetall(app.key(&sku, "void"))
            .await
            .unwrap();
        assert!(
            void.values().any(|v| v == "void"),
            "a 202 not replayed only after the first order was voided: {void:?}"
        );
        assert!(!void.contains_key(order["order_id"].as_str().unwrap()));
    }
    assert_eq!(app.stock(&sku).await, Some(9), "deducted once");
    app.drained(&sku, 1).await;
}

/// With WAIT on, an order whose call (the script and its WAIT) is not
/// answered within `REDIS_TIMEOUT_MS` is answered 503, and the 503 is true:
/// the order is taken back on the same connection after the call, and
/// never reaches the books (it did, once the replica was back, when the
/// call's timeout left it standing: seen under load in CI).
#[tokio::test]
async fn an_order_whose_call_outlasts_the_timeout_is_taken_back_and_never_persisted() {
    let base = 8700;
    let _cluster = crate::helpers::OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        // The WAIT's own bound past the call's: the call times out while
        // the script has placed the order and WAIT still waits.
        s.redis.timeout = std::time::Duration::from_millis(300);
        s.redis.wait = Some(flashsale::config::ReplicaWait {
            replicas: 1,
            timeout: std::time::Duration::from_millis(1000),
        });
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    let replica = replica_pid(&app, &sku).await;
    app.order_until_accepted(2, &sku).await;
    app.drained(&sku, 1).await;

    // Paused for less than the cluster's node timeout (2 s).
    signal(replica, "-STOP");
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 1});
    let first = app.post_order(&body, Some("k1")).await.status();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    signal(replica, "-CONT");
    assert_eq!(first, StatusCode::SERVICE_UNAVAILABLE);
    eventually(
        "the stream settled",
        std::time::Duration::from_secs(10),
        || async { app.pending(&sku).await == 0 },
    )
    .await;
    // Long enough for a worker to have persisted it, had it stood.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        app.persisted(&sku).await.0,
        1,
        "persisted an order answered 503"
    );
    assert_eq!(app.stock(&sku).await, Some(9), "its unit back");
}

/// With WAIT on, a worker persists an entry only once the replica has it:
/// while the sale's replica is paused, MySQL stays behind the stream.
#[tokio::test]
async fn a_worker_does_not_persist_what_the_replica_lacks() {
    let base = 7400;
    let _cluster = crate::helpers::OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        wait_for_one_replica(s);
        // The void's own call bounded far past a loaded machine's delays:
        // an unanswered void leaves the order standing (docs/redis.md),
        // which is not what this test is about (twice in full runs under
        // load); the call that times out has its own test above.
        s.redis.timeout = std::time::Duration::from_secs(3);
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    let replica = replica_pid(&app, &sku).await;
    let body = json!({"user_id": 1, "product_id": sku, "quantity": 1});
    // The replica in sync first: a cluster just started may answer 503
    // before the script runs (then nothing is in the stream to hold back).
    app.order_until_accepted(2, &sku).await;
    app.drained(&sku, 1).await;
    let entries = app.stream_len(&sku).await;

    // Paused for less than the cluster's node timeout (2 s).
    signal(replica, "-STOP");
    let first = app.post_order(&body, Some("k1")).await.status();
    // The entry is in the master's stream; the workers read it and wait.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let persisted = app.persisted(&sku).await.0;
    signal(replica, "-CONT");
    assert_eq!(first, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.stream_len(&sku).await, entries + 1);
    assert_eq!(persisted, 1, "persisted an order the replica did not have");

    // Answered 503, the order was taken back: once the replica has caught
    // up, the worker acks its entry without a row, and the keyed retry is a
    // new order.
    eventually(
        "the voided entry acked",
        std::time::Duration::from_secs(10),
        || async { app.pending(&sku).await == 0 },
    )
    .await;
    assert_eq!(
        app.persisted(&sku).await.0,
        1,
        "persisted an order answered 503"
    );
    assert_eq!(app.stock(&sku).await, Some(9));
    let resp = while_unavailable(|| app.post_order(&body, Some("k1"))).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert!(resp.headers().get("idempotent-replayed").is_none());
    let order: serde_json::Value = resp.json().await.unwrap();
    app.drained(&sku, 2).await;
    let rows = app.order_rows(&sku).await;
    assert_eq!(rows.len(), 2);
    let id = order["order_id"].as_str().unwrap();
    assert!(
        rows.iter().any(|r| r.0 == id),
        "the retry's order persisted"
    );
    assert_eq!(app.stock(&sku).await, Some(8), "deducted once");
}

/// With WAIT on, a cancel's units count as back in Redis (`released = 1`)
/// only once the replica has the release; until then the sweeper keeps
/// redoing it (at most once in effect).
#[tokio::test]
async fn a_release_the_replica_lacks_is_not_marked_released_until_it_has_it() {
    use std::time::Duration;
    let base = 7500;
    let _cluster = crate::helpers::OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        wait_for_one_replica(s);
        s.workers = Some(flashsale::config::WorkerConfig {
            release_grace: Duration::from_millis(300),
            sweep_every: Duration::from_millis(200),
            ..crate::helpers::fast_workers("w")
        });
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    // A cluster just started may not have its replica in sync yet (then
    // 503 "not replicated"): retried with its key, as clients do.
    let order = app.order_until_accepted(1, &sku).await;
    let id = order["order_id"].as_str().expect("accepted").to_owned();
    app.drained(&sku, 1).await;
    let released = || async {
        let r: bool = sqlx::query_scalar("SELECT released FROM tb_order WHERE order_id = ?")
            .bind(&id)
            .fetch_one(&app.mysql)
            .await
            .unwrap();
        r
    };
    let replica = replica_pid(&app, &sku).await;

    // Paused for less than the cluster's node timeout (2 s).
    signal(replica, "-STOP");
    let cancel = app.cancel(&id, 1).await.status();
    // The sweeper tries meanwhile: past the release's grace, two sweeps.
    let w = app.settings.workers.as_ref().expect("workers");
    tokio::time::sleep(w.release_grace + w.sweep_every * 2).await;
    let marked = released().await;
    signal(replica, "-CONT");
    assert_eq!(cancel, StatusCode::OK, "the cancel itself is committed");
    assert!(
        !marked,
        "marked released while the replica lacked the release"
    );

    crate::helpers::eventually(
        "the sweeper finishes the release",
        Duration::from_secs(20),
        released,
    )
    .await;
    assert_eq!(app.stock(&sku).await, Some(10), "the unit is back once");
}

#[tokio::test]
async fn a_master_dies_mid_sale_and_every_acknowledged_order_is_persisted_once() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    // A cluster of this test's own: killing a master must not disturb the others.
    let base = 7100;
    let _cluster = crate::helpers::OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        wait_for_one_replica(s);
        // A healthy master's replica may lag behind on a busy machine (the
        // whole suite runs beside this test): give WAIT time, so that only
        // the failover shows as refusals.
        if let Some(wait) = s.redis.wait.as_mut() {
            wait.timeout = Duration::from_millis(1000);
        }
        s.redis.timeout = Duration::from_millis(1000);
    })
    .await;
    // The first sale's master will die; at least one sale lives on another
    // master (ids hash at random), whose buyers must not notice.
    let mut skus = vec![app.new_sale(5000, 1).await];
    let victim = master_of(&app.redis_below(), &app.key(&skus[0], "orders")).await;
    let port = crate::nodes::port_of(&victim);
    let mut healthy = Vec::new();
    while skus.len() < 3 || healthy.is_empty() {
        assert!(skus.len() < 20, "no sale landed on another master");
        let sku = app.new_sale(5000, 1).await;
        if master_of(&app.redis_below(), &app.key(&sku, "orders")).await != victim {
            healthy.push(sku.clone());
        }
        skus.push(sku);
    }

    // Buyers keep coming, each order under its own Idempotency-Key, until
    // 3 s after the failover is over (however long it takes: the cluster
    // has 20 s to fail over), so the failed-over sale must take orders again.
    let end = Arc::new(Mutex::new(Instant::now() + Duration::from_secs(120)));
    let mut set = JoinSet::new();
    for sku in &skus {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
        let end = end.clone();
        set.spawn(async move {
            let mut acknowledged = Vec::new();
            let mut refused = Vec::new();
            let mut user = 0u64;
            while Instant::now() < *end.lock().unwrap() {
                user += 1;
                let body = json!({"user_id": user, "product_id": sku, "quantity": 1});
                let resp = client
                    .post(&url)
                    .header("Idempotency-Key", format!("k{user}"))
                    .json(&body)
                    .send()
                    .await;
                match resp {
                    Ok(resp) if resp.status() == StatusCode::ACCEPTED => {
                        let v: serde_json::Value = resp.json().await.unwrap();
                        acknowledged
                            .push((Instant::now(), v["order_id"].as_str().unwrap().to_owned()));
                    }
                    Ok(resp) => refused.push(resp.status().to_string()),
                    Err(e) => refused.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (sku, acknowledged, refused)
        });
    }
    // Two seconds in, the first sale's master crashes (SIGKILL, no goodbye).
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(server_pid(port).await, "-9");
    // Its replica takes over. Only then may the dead node come back (as the
    // new replica: WAIT needs one), as an operator or orchestrator would do.
    // Back any sooner, with its empty memory, it would still be the master,
    // and its replica would copy the emptiness: the sale would be gone.
    crate::nodes::await_failover(base, &victim, &app.key(&skus[0], "orders")).await;
    crate::nodes::restart_node(base, port);
    let recovered = Instant::now();
    *end.lock().unwrap() = recovered + Duration::from_secs(3);

    let mut books = Vec::new();
    while let Some(done) = set.join_next().await {
        books.push(done.unwrap());
    }
    let first = &books.iter().find(|(sku, ..)| *sku == skus[0]).unwrap().1;
    assert!(
        first.iter().any(|(at, _)| *at > recovered),
        "the failed-over sale never took orders again"
    );
    // Only the failed master's sales see the failover.
    for (sku, _, refused) in &books {
        if healthy.contains(sku) {
            assert!(
                refused.is_empty(),
                "a sale on a healthy master got {refused:?}"
            );
        }
    }

    for (sku, acknowledged, _) in &books {
        let ids: HashSet<&str> = acknowledged.iter().map(|(_, id)| id.as_str()).collect();
        crate::helpers::eventually(
            "every acknowledged order persisted",
            Duration::from_secs(60),
            || async {
                let rows: Vec<String> =
                    sqlx::query_scalar("SELECT order_id FROM tb_order WHERE product_id = ?")
                        .bind(sku)
                        .fetch_all(&app.mysql)
                        .await
                        .unwrap();
                let rows: HashSet<String> = rows.into_iter().collect();
                ids.iter().all(|id| rows.contains(*id)) && app.pending(sku).await == 0
            },
        )
        .await;
        let (count, distinct, units) = app.persisted(sku).await;
        assert_eq!(count, distinct, "no order twice");
        let stock = app.stock(sku).await.unwrap_or(0);
        assert!(
            stock + units <= 5000,
            "redis stock {stock} + sold {units} over the initial 5000"
        );
    }
}
