//! Two releases side by side (docs/operations.md "Upgrading"): what this
//! release does with what a later one left in the stores it shares.

use std::time::Duration;

use flashsale::domain::release;

use crate::helpers::{eventually, eventually_some, spawn_app};

/// `/metrics` names the release the process runs, as `--version` does:
/// mid-upgrade, which processes run which release.
#[tokio::test]
async fn metrics_name_the_release_and_its_commit() {
    let app = spawn_app().await;
    let text = app.metrics_text().await;
    let line = format!(
        "flashsale_build_info{{commit=\"{}\",version=\"{}\"}} 1",
        release::COMMIT,
        release::VERSION
    );
    assert!(text.lines().any(|l| l == line), "no {line:?} in /metrics");
    assert_eq!(release::VERSION, env!("CARGO_PKG_VERSION"));
    assert!(
        release::COMMIT == "unknown"
            || (release::COMMIT.len() == 12
                && release::COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
        "{}",
        release::COMMIT
    );
}

/// A later release applied a migration this one does not know (the books
/// expanded for it): this release still starts beside it, and is ready,
/// as after a rollback. (sqlx's migrator refuses a database with a
/// migration it lacks, unless told otherwise: the release would have
/// waited for its books for ever.)
#[tokio::test]
async fn a_migration_of_a_later_release_does_not_stop_this_one() {
    let app = spawn_app().await;
    let db = app.db_name().to_owned();
    sqlx::query(&format!(
        "INSERT INTO `{db}`._sqlx_migrations \
         (version, description, success, checksum, execution_time) \
         VALUES (29991231000001, 'a later release', 1, UNHEX(SHA2('later', 384)), 1)"
    ))
    .execute(&app.mysql)
    .await
    .expect("a later release's migration recorded");
    let beside = app.serve_beside(|_| {}).await;
    tokio::time::timeout(Duration::from_secs(20), beside.db.wait_ready())
        .await
        .expect("ready beside a later release's migration");
}

/// Mid-upgrade, the dashboard lists every `serve` and `worker` process of
/// the deployment with the release it runs: the fleet's roll in Redis,
/// which each process writes every few seconds and leaves when it stops.
/// A process that stopped beating shows as gone; one long gone, or a field
/// that is not a process of ours, leaves the roll; a later release's
/// member with fields this one does not know is listed all the same.
#[tokio::test]
async fn the_dashboard_lists_every_process_and_its_release() {
    let app = spawn_app().await;
    let beside = app.serve_beside(|_| {}).await;
    let cookie = crate::dashboard::session_cookie(&app).await;
    let roll = flashsale::sale::keys::fleet(&app.prefix);

    // Both processes (this test's), with this build's release, none gone.
    let listed = |snapshot: &serde_json::Value| -> Vec<(String, String)> {
        snapshot["fleet"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter(|m| m["gone"] == false && m["pid"] == std::process::id())
                    .map(|m| {
                        assert_eq!(m["version"], release::VERSION, "{m}");
                        assert_eq!(m["commit"], release::COMMIT, "{m}");
                        (
                            m["role"].as_str().unwrap_or("?").to_owned(),
                            m["name"].as_str().unwrap_or("?").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut roles: Vec<String> =
        eventually_some("both on the roll", Duration::from_secs(10), || async {
            let roles: Vec<String> = listed(&crate::dashboard::data(&app, &cookie).await)
                .into_iter()
                .map(|(role, _)| role)
                .collect();
            (roles.len() == 2).then_some(roles)
        })
        .await;
    roles.sort();
    assert_eq!(roles, ["api", "api_and_workers"]);

    // A later release beside them, with a field this one does not know; a
    // process killed 20 s ago; one gone 11 minutes ago; and a stray field.
    let now = flashsale::domain::now_ms();
    let member = |name: &str, seen_ms: i64| {
        serde_json::json!({
            "name": name, "role": "worker", "version": "0.3.0", "commit": "0123456789ab",
            "host": "elsewhere", "pid": 7, "started_ms": now - 3_600_000, "seen_ms": seen_ms,
            "zone": "eu-west-1a",
        })
        .to_string()
    };
    let mut r = app.redis.clone();
    let _: () = redis::cmd("HSET")
        .arg(&roll)
        .arg("later")
        .arg(member("later", now))
        .arg("killed")
        .arg(member("killed", now - 20_000))
        .arg("forgotten")
        .arg(member("forgotten", now - 11 * 60_000))
        .arg("stray")
        .arg("not json")
        .query_async(&mut r)
        .await
        .expect("HSET");
    let snapshot = eventually_some(
        "the later release listed",
        Duration::from_secs(5),
        || async {
            let s = crate::dashboard::data(&app, &cookie).await;
            s["fleet"]
                .as_array()
                .is_some_and(|f| f.iter().any(|m| m["name"] == "later"))
                .then_some(s)
        },
    )
    .await;
    let by_name = |name: &str| {
        snapshot["fleet"]
            .as_array()
            .and_then(|f| f.iter().find(|m| m["name"] == name).cloned())
    };
    let later = by_name("later").expect("listed");
    assert_eq!(
        (later["version"].as_str(), later["gone"].as_bool()),
        (Some("0.3.0"), Some(false))
    );
    assert_eq!(by_name("killed").expect("listed")["gone"], true);
    assert!(by_name("forgotten").is_none() && by_name("stray").is_none());
    let kept: Vec<String> = redis::cmd("HKEYS")
        .arg(&roll)
        .query_async(&mut r)
        .await
        .expect("HKEYS");
    assert!(
        !kept.iter().any(|k| k == "forgotten" || k == "stray"),
        "the long gone and the stray stay on the roll: {kept:?}"
    );

    // A process that stops cleanly leaves the roll.
    let beside_name = listed(&crate::dashboard::data(&app, &cookie).await)
        .into_iter()
        .find(|(role, _)| role == "api")
        .map(|(_, name)| name)
        .expect("the API beside is listed");
    drop(beside);
    eventually(
        "the stopped one off the roll",
        Duration::from_secs(10),
        || async {
            let on: bool = redis::cmd("HEXISTS")
                .arg(&roll)
                .arg(&beside_name)
                .query_async(&mut app.redis.clone())
                .await
                .expect("HEXISTS");
            !on
        },
    )
    .await;
}

/// A release's migration meets a long transaction on the table it alters
/// (a report's read, a batch held open by a stalled worker). An `ALTER`
/// waits for the table's metadata lock behind it, and every write to the
/// table waits behind the `ALTER`: the sale's writes would stop until the
/// transaction ends. The migration gives way instead, within
/// `TABLE_LOCK_WAIT_SECS`, so the writes go on; it is not left recorded as
/// "partially applied" (which would refuse every later start), and is
/// applied once the transaction is over.
#[tokio::test]
async fn a_migration_gives_way_to_a_long_transaction_and_the_writes_go_on() {
    use flashsale::store::Db;
    use sqlx::Connection;
    let db = crate::helpers::unique("fs_test_");
    let url = format!("{}/{db}", crate::helpers::MYSQL_SERVER);
    let connect = || sqlx::MySqlConnection::connect(&url);
    let store = Db::connect_lazy(&url, Duration::from_secs(5), 2).unwrap();
    store.create_and_migrate().await.unwrap();
    // The books as the release before left them: its newest migration of a
    // hot table not applied yet.
    let mut admin = connect().await.unwrap();
    for sql in [
        "ALTER TABLE tb_sale_second DROP COLUMN buyers",
        "DELETE FROM _sqlx_migrations WHERE version = 20261210000003",
    ] {
        sqlx::query(sql).execute(&mut admin).await.unwrap();
    }
    // A transaction that read the table and stays open.
    let mut holder = connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM tb_sale_second")
        .execute(&mut holder)
        .await
        .unwrap();
    // The new release starts and migrates.
    let migrating = tokio::spawn({
        let store = store.clone();
        async move { store.create_and_migrate().await }
    });
    // Once its ALTER waits for the table, a write comes (the workers' row
    // of a second).
    let waiting = "SELECT COUNT(*) FROM information_schema.processlist \
                   WHERE db = ? AND state LIKE 'Waiting for table metadata lock' \
                   AND info LIKE '%ALTER TABLE tb_sale_second%'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = sqlx::query_scalar(waiting)
            .bind(&db)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if n == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the migration's ALTER never waited for the table"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut writer = connect().await.unwrap();
    let wrote = tokio::time::timeout(
        Duration::from_secs(20),
        sqlx::query(
            "INSERT INTO tb_sale_second (product_id, second, source, counts, gauges, latency) \
             VALUES ('p', 1, 's', '{}', '{}', '{}')",
        )
        .execute(&mut writer),
    )
    .await;
    assert!(
        matches!(wrote, Ok(Ok(_))),
        "the write waited behind the migration for as long as the transaction stayed open: {wrote:?}"
    );
    let gave_way = tokio::time::timeout(Duration::from_secs(20), migrating)
        .await
        .expect("the migration gave way")
        .unwrap();
    assert!(
        gave_way.is_err(),
        "applied while the transaction held the table"
    );
    let dirty: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success = FALSE")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        dirty, 0,
        "the migration that gave way is recorded as partially applied"
    );
    // The transaction ends: the next attempt applies it.
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    store.create_and_migrate().await.unwrap();
    let applied: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns \
         WHERE table_schema = ? AND table_name = 'tb_sale_second' AND column_name = 'buyers'",
    )
    .bind(&db)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(applied, 1);
    sqlx::query(&format!("DROP DATABASE `{db}`"))
        .execute(&mut admin)
        .await
        .unwrap();
}
