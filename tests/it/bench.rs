//! `flashsale bench` end to end: a small rehearsal against a live service.

use flashsale::bench::BenchArgs;
use flashsale::config::{DbArgs, RedisArgs};

use crate::helpers::{ADMIN_TOKEN, REDIS_URL, spawn_app};

#[tokio::test]
async fn a_small_rehearsal_balances_the_books() {
    let app = spawn_app().await;
    let args = BenchArgs {
        redis: RedisArgs {
            redis_url: REDIS_URL.into(),
            redis_cluster_nodes: None,
            key_prefix: app.prefix.clone(),
            redis_timeout_ms: 2000,
            redis_pool_size: 4,
            redis_wait_replicas: 0,
            redis_wait_timeout_ms: 100,
        },
        db: DbArgs {
            database_url: app.settings.database_url.clone(),
            db_timeout_ms: 5000,
            db_max_connections: 4,
        },
        url: app.base.clone(),
        local: false,
        admin_token: Some(ADMIN_TOKEN.into()),
        stock: 200,
        sales: 1,
        users: 1500,
        requests: 3000,
        concurrency: 16,
        limit_per_user: 2,
        repeat_share: 0.2,
        retry_share: 0.05,
        seed: 1,
        rate: None,
        then_at: None,
        no_direct: false,
        floor: true,
        limits: None,
        drain_timeout_secs: 60,
        keep: true,
        json: false,
        quiet: true,
    };
    let report = flashsale::bench::rehearsal::run(args)
        .await
        .expect("bench runs");
    assert!(!report.checks.is_empty());
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(report.units_accepted, 200, "demand is far above the stock");
    assert!(report.direct.is_some());
    // The constant floor answered every request of the plan; the script
    // floor sold exactly the stock through the real script; the ratios are there.
    let floor = report.floor.as_ref().expect("--floor ran");
    assert_eq!(
        floor.outcomes,
        std::collections::BTreeMap::from([("sold_out".to_owned(), 3000)])
    );
    let script = report.floor_script.as_ref().expect("--floor ran");
    assert_eq!(
        script.outcomes.get("accepted"),
        Some(&200),
        "{:?}",
        script.outcomes
    );
    assert_eq!(script.outcomes.values().sum::<u64>(), 3000);
    assert!(!script.outcomes.contains_key("unavailable"));
    for r in [
        report.http_over_floor,
        report.http_over_floor_script,
        report.floor_over_direct,
        report.floor_script_over_direct,
    ] {
        assert!(r.is_some_and(|r| r > 0.0));
    }
    assert!(report.persisted_after_burst_ms.is_some());
}
