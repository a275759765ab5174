//! The seams of a failover of the books, tried on servers of the tests'
//! own: a server that refuses writes (read-only) is an outage, not a bad
//! row; the feed never moves past an event it has not listed, whatever the
//! ids' order; on Galera the books are the cluster, and three instances
//! starting on three nodes at once migrate once; the runbook's commands run
//! as written.

use std::time::{Duration, Instant};

use flashsale::store::{Db, Outage, StoreError};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use crate::helpers::*;
use crate::replicas::{Galera, OwnMariadb, Single};

/// MySQL's clock in epoch ms, as the service writes `tb_event.created`.
const NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// The service's account on `server`, made by the runbook's grant statement
/// (`deploy/mysql-grants.sql`) for database `db`; its URL.
async fn service_account(server: &OwnMariadb, db: &str) -> String {
    let grants = include_str!("../../deploy/mysql-grants.sql")
        .replace("`flashsale`.*", &format!("`{db}`.*"))
        .replace("'change-me'", "'s3cret'");
    server.exec(&grants).await;
    format!("mysql://flashsale:s3cret@127.0.0.1:{}/{db}", server.port)
}

/// `why`'s count of calls the books refused (`flashsale_db_unavailable_total`).
async fn refused(app: &TestApp, why: &str) -> f64 {
    let series = format!("flashsale_db_unavailable_total{{why=\"{why}\"}}");
    metric(app, &app.base, &series).await
}

/// The books' server read-only for longer than `MAX_DELIVERIES` ×
/// `CLAIM_IDLE_MS` (a proxy that picked a replica, an address moved before
/// the promotion's `read_only = 0`): orders are still taken (Redis decides
/// them), what needs the books is answered 503, `/readyz` says so, the
/// metric counts it, no order becomes a dead letter; once the server takes
/// writes, every 202 is in the books once.
#[tokio::test]
async fn a_read_only_books_server_is_an_outage_and_every_order_lands_once_it_takes_writes() {
    let own = Single::start().await;
    let db_name = unique("fs_ro_");
    let url = service_account(&own.server, &db_name).await;
    let mut app = spawn_app_with(|s| {
        s.db.url = url.clone();
        s.db.timeout = Duration::from_millis(1000);
        let w = s.workers.as_mut().expect("workers");
        // Dead letters after 2 deliveries, reclaimed after 300 ms idle: the
        // outage below lasts ten times that.
        w.claim_idle = Duration::from_millis(300);
        w.max_deliveries = 2;
    })
    .await;
    app.mysql = sqlx::MySqlPool::connect_lazy(&format!("{}/{db_name}", own.server.server()))
        .expect("a url");
    // The account the runbook grants cannot write past read_only; root can.
    assert!(!app.db.writes_past_read_only().await.unwrap());
    let root_url = format!("{}/{db_name}", own.server.server());
    let root = Db::connect_lazy(&root_url, Duration::from_secs(5), 1).unwrap();
    root.create_and_migrate().await.unwrap();
    assert!(root.writes_past_read_only().await.unwrap());
    let sku = app.new_sale(200, 1).await;
    app.accept_orders(&sku, 1..=20).await;
    app.drained(&sku, 20).await;

    own.server.exec("SET GLOBAL read_only = 1").await;
    app.accept_orders(&sku, 21..=60).await;
    // A write of the books: 503 unavailable, not 500.
    let created = app
        .create_product(&product_body(&unique("sku-"), 5, 1))
        .await;
    assert_refused(created, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Ten times MAX_DELIVERIES × CLAIM_IDLE_MS, the workers trying all along.
    let w = app.settings.workers.as_ref().expect("workers");
    let long = w.claim_idle * u32::try_from(w.max_deliveries).unwrap() * 10;
    let outage = Instant::now();
    eventually("the refusals counted", Duration::from_secs(10), || async {
        refused(&app, "read_only").await > 0.0
    })
    .await;
    tokio::time::sleep(long.saturating_sub(outage.elapsed())).await;
    let dead = app.audit(&sku).await;
    assert_eq!(
        dead["audit"]["dead_letters"], 0,
        "no order given up: {dead}"
    );
    assert!(app.pending(&sku).await > 0, "the orders wait in the stream");

    own.server.exec("SET GLOBAL read_only = 0").await;
    app.drained(&sku, 60).await;
    let (rows, distinct, _) = app.persisted(&sku).await;
    assert_eq!((rows, distinct), (60, 60), "every 202 in the books once");
    app.books_balance(&sku).await;
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

/// An order that did reach the dead letters (MySQL refused its row: here a
/// column made too narrow by hand) is counted by the audit, and taken home
/// by the repair once the cause is gone, listed as put back.
#[tokio::test]
async fn a_dead_lettered_order_is_put_back_once_the_books_take_it() {
    let app = spawn_app_with(|s| {
        let w = s.workers.as_mut().expect("workers");
        w.claim_idle = Duration::from_millis(200);
        w.max_deliveries = 1;
        w.reconcile_every = Duration::from_millis(200);
    })
    .await;
    let sku = app.new_sale(10, 2).await;
    assert_eq!(app.place_order(1, &sku, 1).await.status(), 202);
    app.drained(&sku, 1).await;
    // The books refuse the next rows for what they are (a bug, a hand edit).
    sqlx::query("ALTER TABLE tb_order ADD CONSTRAINT one_unit_only CHECK (quantity < 2)")
        .execute(&app.mysql)
        .await
        .unwrap();
    assert_eq!(app.place_order(2, &sku, 2).await.status(), 202);
    eventually(
        "the order dead-lettered",
        Duration::from_secs(20),
        || async { app.audit(&sku).await["audit"]["dead_letters"] == 2 },
    )
    .await;
    assert_eq!(app.audit(&sku).await["ok"], false, "the audit says so");

    sqlx::query("ALTER TABLE tb_order DROP CONSTRAINT one_unit_only")
        .execute(&app.mysql)
        .await
        .unwrap();
    // The repair tries the dead letters every 30 s.
    eventually(
        "the dead letter put back",
        Duration::from_secs(45),
        || async { app.audit(&sku).await["audit"]["dead_letters"] == 0 },
    )
    .await;
    app.drained(&sku, 3).await;
    app.books_balance(&sku).await;
    let audit = app.audit(&sku).await;
    let listed = audit["audit"]["put_back"].as_array().expect("a list");
    assert_eq!(listed.len(), 1, "{audit}");
    assert_eq!(listed[0]["what"], "dead_letter");
}

/// Inserts a sale's event (`sale.paused`) on `c`, recorded `age_ms` ago by
/// the server's clock; its id.
async fn event(c: &mut MySqlConnection, sku: &str, age_ms: i64) -> i64 {
    let done = sqlx::query(&format!(
        "INSERT INTO tb_event (type, product_id, created) VALUES ('sale.paused', ?, {NOW_MS} - ?)"
    ))
    .bind(sku)
    .bind(age_ms)
    .execute(&mut *c)
    .await
    .expect("an event");
    done.last_insert_id() as i64
}

/// The ids a read of the feed from the start lists (row ids).
async fn listed(db: &Db) -> Vec<i64> {
    db.events()
        .events_after(0, 100)
        .await
        .expect("the feed")
        .iter()
        .map(|e| e.id / flashsale::store::EVENTS_PER_ROW)
        .collect()
}

/// Two transactions on one server: the first takes its id, the second a
/// later one and commits first, recorded as long ago (another node's
/// clock): a read stops at the younger lower id, and lists both, in order,
/// once it is old enough; never the later one alone.
#[tokio::test]
async fn the_feed_never_moves_past_a_younger_event_with_a_lower_id() {
    let app = spawn_app_with(|s| s.db.timeout = Duration::from_millis(500)).await;
    let server = format!("{MYSQL_SERVER}/{}", app.db_name());
    let (mut first, mut second) = (
        MySqlConnection::connect(&server).await.unwrap(),
        MySqlConnection::connect(&server).await.unwrap(),
    );
    sqlx::query("BEGIN").execute(&mut first).await.unwrap();
    let low = event(&mut first, "sku-a", 0).await;
    let high = event(&mut second, "sku-b", 60_000).await;
    assert!(low < high, "{low} < {high}");
    sqlx::query("COMMIT").execute(&mut first).await.unwrap();
    assert_eq!(listed(&app.db).await, Vec::<i64>::new(), "stopped at {low}");
    eventually("both listed", Duration::from_secs(10), || async {
        listed(&app.db).await == vec![low, high]
    })
    .await;
}

/// Galera, a writer per node: ids interleave across nodes (each hands out
/// its own), and an event with a lower id can be recorded after one with a
/// higher id on another node. The feed stops at it until it is old enough,
/// then lists both: nothing skipped. A node whose applier lags behind
/// another's commit lists nothing past it: the feed's read is causal. And
/// three instances starting on three nodes at once: one migration (the
/// lease), one books (the cluster's identity), no failover.
#[tokio::test]
async fn on_galera_interleaved_ids_skip_no_event_and_three_instances_start_as_one() {
    let mut galera = Galera::start().await;
    let db_name = unique("fs_galera_");
    let dbs: Vec<Db> = galera
        .nodes
        .iter()
        .map(|n| {
            Db::connect_lazy(
                &format!("{}/{db_name}", n.server()),
                Duration::from_millis(2000),
                4,
            )
            .expect("a url")
        })
        .collect();
    // Three migrators at once, one per node: each done, none refused.
    let (a, b, c) = tokio::join!(
        dbs[0].create_and_migrate(),
        dbs[1].create_and_migrate(),
        dbs[2].create_and_migrate()
    );
    for (node, done) in [a, b, c].into_iter().enumerate() {
        done.unwrap_or_else(|e| panic!("node {node}: {e:?}"));
    }
    let mut ids = Vec::new();
    for db in &dbs {
        ids.push(db.server_identity().await.expect("an identity"));
    }
    assert!(ids[0].starts_with("galera:"), "{ids:?}");
    assert!(ids.iter().all(|id| *id == ids[0]), "one books: {ids:?}");

    // The node of higher ids records first (its id), holding its
    // transaction; the other records 2.5 s later, before it has seen that
    // row: a lower id,
    // younger.
    let connect = |i: usize| {
        let url = format!("{}/{db_name}", galera.nodes[i].server());
        async move { MySqlConnection::connect(&url).await.unwrap() }
    };
    // Which of nodes 1 and 2 hands out the lower ids (Galera gives each
    // node an `auto_increment_offset` by its place in the cluster, which
    // the order the nodes joined decides): `one` writes the lower.
    let mut offsets = Vec::new();
    for i in [1, 2] {
        let offset: i64 = sqlx::query_scalar("SELECT CAST(@@auto_increment_offset AS SIGNED)")
            .fetch_one(&mut connect(i).await)
            .await
            .unwrap();
        offsets.push((offset, i));
    }
    offsets.sort();
    let (one_node, two_node) = (offsets[0].1, offsets[1].1);
    let (mut one, mut two) = (connect(one_node).await, connect(two_node).await);
    sqlx::query("BEGIN").execute(&mut one).await.unwrap();
    sqlx::query("BEGIN").execute(&mut two).await.unwrap();
    let high = event(&mut two, "sku-two", 0).await;
    let high_settled = Instant::now() + dbs[0].events().event_settle();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let low_recorded = Instant::now();
    let low = event(&mut one, "sku-one", 0).await;
    assert!(low < high, "interleaved: {low} < {high}");
    sqlx::query("COMMIT").execute(&mut two).await.unwrap();
    sqlx::query("COMMIT").execute(&mut one).await.unwrap();
    // Read on node 0 again and again until both are listed: never the
    // higher alone, and nothing while the higher is old enough (3 s) and
    // the lower not yet (a window of about 2.5 s). The reads are causal:
    // node 0's applier lagging behind node 1's commit skips nothing.
    let low_settled = low_recorded + dbs[0].events().event_settle();
    let (mut held_back, started) = (0, Instant::now());
    loop {
        let before = Instant::now();
        let read = listed(&dbs[0]).await;
        if read == vec![low, high] {
            break;
        }
        assert_eq!(read, Vec::<i64>::new(), "never {high} without {low}");
        if before > high_settled && Instant::now() < low_settled {
            held_back += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "both listed in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        held_back > 0,
        "a read stopped at {low} while {high} was old enough"
    );

    // Node 0's applier held (`FLUSH TABLES WITH READ LOCK` pauses it):
    // node 2 commits a higher id, old enough at once, node 0 applies it;
    // then node 1 commits a lower one that node 0 cannot apply yet. A
    // read on node 0 that lists the higher would skip the lower for good;
    // the causal read waits instead (and gives up at the call's bound).
    let (mut one, mut two) = (connect(one_node).await, connect(two_node).await);
    sqlx::query("BEGIN").execute(&mut one).await.unwrap();
    sqlx::query("BEGIN").execute(&mut two).await.unwrap();
    let high = event(&mut two, "sku-two", 60_000).await;
    let low = event(&mut one, "sku-one", 0).await;
    assert!(low < high, "interleaved: {low} < {high}");
    sqlx::query("COMMIT").execute(&mut two).await.unwrap();
    let mut zero = connect(0).await;
    let applied: i64 = sqlx::query_scalar(
        "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM tb_event WHERE id = ?",
    )
    .bind(high)
    .fetch_one(&mut zero)
    .await
    .unwrap();
    assert_eq!(applied, 1, "node 0 applied {high}");
    sqlx::query("FLUSH TABLES WITH READ LOCK")
        .execute(&mut zero)
        .await
        .unwrap();
    sqlx::query("COMMIT").execute(&mut one).await.unwrap();
    let held = dbs[0].events().events_after(0, 100).await;
    let held = held.map(|page| {
        page.iter()
            .map(|e| e.id / flashsale::store::EVENTS_PER_ROW)
            .collect::<Vec<_>>()
    });
    assert!(
        matches!(held, Err(StoreError::Timeout(_))),
        "node 0 lacks {low}: the read waits for it, bounded, rather than list {high}: {held:?}"
    );
    sqlx::query("UNLOCK TABLES")
        .execute(&mut zero)
        .await
        .unwrap();
    eventually("all listed", Duration::from_secs(20), || async {
        listed(&dbs[0]).await.ends_with(&[low, high])
    })
    .await;

    // Three instances with their workers, one per node, starting together:
    // the books' server is the cluster, so none repairs or skips ids ahead.
    let url = |i: usize| format!("{}/{db_name}", galera.nodes[i].server());
    let app = spawn_app_with(|s| {
        s.db.url = url(0);
        let w = s.workers.as_mut().expect("workers");
        // Dead letters after one delivery, reclaimed after 200 ms idle: the
        // outage below lasts longer.
        w.claim_idle = Duration::from_millis(200);
        w.max_deliveries = 1;
    })
    .await;
    let b1 = app.workers_beside("node1", |s| s.db.url = url(1)).await;
    let b2 = app.workers_beside("node2", |s| s.db.url = url(2)).await;
    let sku = app.new_sale(40, 1).await;
    for user in 1..=30u64 {
        let base = [&app.base, &b1.base, &b2.base][(user % 3) as usize];
        let resp = app
            .client
            .post(format!("{base}/api/orders"))
            .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }
    let mut app = app;
    app.mysql = sqlx::MySqlPool::connect_lazy(&url(0)).expect("a url");
    app.drained(&sku, 30).await;
    // Two checks of the repairer have run meanwhile.
    let repairs = app
        .settings
        .workers
        .as_ref()
        .expect("workers")
        .reconcile_every;
    tokio::time::sleep(repairs * 2).await;
    let newest: i64 = sqlx::query_scalar("SELECT MAX(id) FROM tb_event")
        .fetch_one(&app.mysql)
        .await
        .unwrap();
    assert!(
        newest < flashsale::store::SKIP_AHEAD_ROWS,
        "no failover seen: ids skipped ahead to {newest}"
    );
    let put_back: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tb_put_back")
        .fetch_one(&app.mysql)
        .await
        .unwrap();
    assert_eq!(put_back, 0, "no repair ran");

    // Node 0 alone, the two others gone: no quorum, outside the primary
    // component. An outage: orders taken, the node not ready, nothing
    // given up; bootstrapped again, it takes every order once.
    galera.nodes[1].kill();
    galera.nodes[2].kill();
    eventually(
        "node 0 outside the primary component",
        Duration::from_secs(60),
        || async {
            matches!(dbs[0].ping().await, Err(e) if e.outage() == Some(Outage::NotPrimary))
        },
    )
    .await;
    for user in 31..=40u64 {
        assert_eq!(app.place_order(user, &sku, 1).await.status(), 202);
    }
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    eventually("the refusals counted", Duration::from_secs(10), || async {
        refused(&app, "not_primary").await > 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    galera.nodes[0]
        .exec("SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'")
        .await;
    eventually(
        "node 0 the primary component again",
        Duration::from_secs(30),
        || async { dbs[0].ping().await.is_ok() },
    )
    .await;
    app.drained(&sku, 40).await;
    app.books_balance(&sku).await;
    // None given up meanwhile (and so none put back).
    let dead = metric(&app, &app.base, "flashsale_dead_letters_total").await;
    assert_eq!(dead, 0.0, "orders dead-lettered while the node was out");
    let put_back: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tb_put_back")
        .fetch_one(&app.mysql)
        .await
        .unwrap();
    assert_eq!(put_back, 0, "nothing to put back");
}

/// The runbook's commands, as it writes them: `flashsale audit
/// <product_id>` (and `--product`), `flashsale streams <product_id>`.
#[tokio::test]
async fn the_runbook_s_commands_run_as_written() {
    let app = spawn_app().await;
    let sku = app.new_sale(10, 1).await;
    assert_eq!(app.place_order(1, &sku, 1).await.status(), 202);
    app.drained(&sku, 1).await;
    let run = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .args(args)
            .output()
            .await
            .expect("flashsale runs")
    };
    let common = [
        format!("--redis-url={REDIS_URL}"),
        format!("--key-prefix={}", app.prefix),
        format!("--database-url={MYSQL_SERVER}/{}", app.db_name()),
    ];
    for form in [vec![sku.clone()], vec!["--product".into(), sku.clone()]] {
        let args: Vec<String> = ["audit".to_owned()]
            .into_iter()
            .chain(form)
            .chain(common.iter().cloned())
            .collect();
        let out = run(args.clone()).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(&sku) && text.contains(" ok"), "{text}");
    }
    let out = run(vec![
        "streams".into(),
        sku.clone(),
        common[0].clone(),
        common[1].clone(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&sku));
}

/// Each class of `store::Fault`, from a real error of the shared server (the
/// outage of a read-only server is the first test's): a value the row
/// cannot hold is the row's, a missing table the setup's, a lock waited on
/// too long contention, a statement past its time limit an outage.
#[tokio::test]
async fn each_class_of_error_is_sorted_from_what_the_server_answers() {
    use flashsale::store::{Fault, StoreError};
    let app = spawn_app().await;
    let url = format!("{MYSQL_SERVER}/{}", app.db_name());
    let (mut a, mut b) = (
        MySqlConnection::connect(&url).await.unwrap(),
        MySqlConnection::connect(&url).await.unwrap(),
    );
    let fault = |e: sqlx::Error| StoreError::from(e).fault();
    sqlx::raw_sql(
        "CREATE TABLE sorted (id INT PRIMARY KEY, n INT NOT NULL CHECK (n < 10)); \
         INSERT INTO sorted VALUES (1, 1)",
    )
    .execute(&mut a)
    .await
    .unwrap();

    let row = sqlx::query("INSERT INTO sorted VALUES (2, 99)")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert_eq!(fault(row), Some(Fault::Row));
    let setup = sqlx::query("SELECT * FROM no_such_table")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert_eq!(fault(setup), Some(Fault::Setup));

    sqlx::raw_sql("BEGIN; SELECT * FROM sorted WHERE id = 1 FOR UPDATE")
        .execute(&mut a)
        .await
        .unwrap();
    let waited = sqlx::raw_sql(
        "SET SESSION innodb_lock_wait_timeout = 1; \
         UPDATE sorted SET n = 2 WHERE id = 1",
    )
    .execute(&mut b)
    .await
    .unwrap_err();
    assert_eq!(fault(waited), Some(Fault::Contention));
    sqlx::raw_sql("ROLLBACK").execute(&mut a).await.unwrap();

    let slow =
        sqlx::raw_sql("SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(2) FROM sorted")
            .execute(&mut b)
            .await
            .unwrap_err();
    assert_eq!(fault(slow), Some(Fault::Outage(Outage::Timeout)));
}
