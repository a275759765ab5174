//! Two releases side by side (docs/operations.md "Upgrading"): what this
//! release does with what a later one left in the stores it shares.

use std::time::Duration;

use flashsale::domain::release;

use crate::helpers::spawn_app;

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
