//! `flashsale bench` end to end: a small rehearsal against a live service.

use std::collections::BTreeMap;
use std::sync::Arc;

use flashsale::bench::BenchArgs;
use flashsale::bench::tokens::Tokens;
use flashsale::config::{DbArgs, RedisArgs};

use crate::helpers::{ADMIN_TOKEN, REDIS_URL, TestApp, spawn_app};

/// A small rehearsal against `app`, its stores and its admin token.
fn small_rehearsal(app: &TestApp) -> BenchArgs {
    BenchArgs {
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
        jwt_secret: None,
        jwt_private_key: None,
        jwt_algorithm: None,
        jwt_public_key: None,
        token_cache: 100_000,
        tokens: None,
    }
}

#[tokio::test]
async fn a_small_rehearsal_balances_the_books() {
    let app = spawn_app().await;
    let args = small_rehearsal(&app);
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
        BTreeMap::from([("sold_out".to_owned(), 3000)])
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

#[tokio::test]
async fn a_local_rehearsal_with_bearer_tokens_balances_the_books() {
    const SECRET: &str = "bench-test-secret-0123456789abcdef0123";
    let app = spawn_app().await;
    // A server of the bench's own (`--local`) verifying HS256 tokens, on the
    // test's stores; the bench mints each buyer's token with the same secret.
    let args = BenchArgs {
        local: true,
        admin_token: None,
        stock: 50,
        users: 200,
        requests: 400,
        limit_per_user: 1,
        no_direct: true,
        floor: false,
        keep: false,
        jwt_secret: Some(SECRET.into()),
        token_cache: 1000,
        ..small_rehearsal(&app)
    };
    let report = flashsale::bench::rehearsal::run(args.clone())
        .await
        .expect("bench runs");
    for c in &report.checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    assert_eq!(
        report.units_accepted, 50,
        "the tokens were accepted: {:?}",
        report.http.outcomes
    );
    assert!(!report.http.outcomes.contains_key("unauthorized"));
    assert!(report.http_cpu_us_per_request.is_some_and(|us| us > 0.0));

    // Tokens from another key: the server refuses every order.
    let other = Tokens::hmac("another-secret-0123456789abcdef01234567", None).unwrap();
    let report = flashsale::bench::rehearsal::run(BenchArgs {
        tokens: Some(Arc::new(other)),
        ..args
    })
    .await
    .expect("bench runs");
    assert_eq!(
        report.http.outcomes,
        BTreeMap::from([("unauthorized".to_owned(), 400)])
    );
    assert!(!report.ok(), "nothing sold: the books' checks fail");
}
