//! Under a spike: load shedding, rate limits, stalled dependencies,
//! the admin surface and hostile input.

use std::time::Duration;

use flashsale::app::App;
use flashsale::config::RedisTarget;
use flashsale::config::{Limits, RateLimit};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, Backend, TestApp, assert_refused, eventually, settings_for, spawn_app_cli,
    spawn_app_with, status_code, unique,
};
use crate::proxy::{Mode, Proxy};

/// The audit of `sku` as admins get it, once the workers drained it.
async fn books_balance(app: &TestApp, sku: &str, accepted: i64) {
    eventually(
        "every accepted order persisted",
        Duration::from_secs(20),
        || async { app.persisted(sku).await.0 == accepted },
    )
    .await;
    let body = app.audit(sku).await;
    assert_eq!(body["ok"], true, "books balance: {body}");
    assert_eq!(body["audit"]["confirmed"], accepted, "{body}");
}

#[tokio::test]
async fn a_burst_of_twenty_times_the_in_flight_bound_is_all_answered_and_sheds_the_excess() {
    // Redis answers slowly, so the burst's orders overlap in the service.
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let bound = 4;
    let app = spawn_app_with(|s| {
        s.redis.target = RedisTarget::Single(format!("redis://127.0.0.1:{}", proxy.port));
        s.http.limits = Limits {
            max_in_flight: bound,
            ..Limits::unlimited()
        };
    })
    .await;
    let stock = 30;
    let sku = app.new_sale(stock, 1).await;
    proxy.set_mode(Mode::Slow(Duration::from_millis(20)));

    let burst = 20 * bound as u64;
    let mut tasks = Vec::new();
    for user in 1..=burst {
        let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(url)
                .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
                .send()
                .await
                .expect("every request is answered (no client-side timeout)");
            let retry_after = resp.headers().contains_key("retry-after");
            let status = resp.status();
            let body: Value = resp.json().await.expect("a JSON body");
            (status, body, retry_after)
        }));
    }
    let (mut accepted, mut shed) = (0, 0);
    for t in tasks {
        let (status, body, retry_after) = t.await.unwrap();
        match status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["error"], "overloaded", "{body}");
                assert!(body["message"].is_string());
                assert!(retry_after, "a shed request says when to retry");
                shed += 1;
            }
            StatusCode::CONFLICT => assert_eq!(body["error"], "sold_out", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        shed > 0,
        "a burst of {burst} over {bound} permits sheds some"
    );
    assert!(
        accepted <= stock as i64,
        "no oversell: {accepted} of {stock}"
    );
    proxy.set_mode(Mode::Forward);
    // Stock not sold is still there: shed requests took none.
    assert_eq!(app.stock(&sku).await, Some(stock as i64 - accepted));
    books_balance(&app, &sku, accepted).await;
}

#[tokio::test]
async fn one_user_hammering_gets_429_while_others_are_served() {
    let app = spawn_app_with(|s| {
        s.http.limits = Limits {
            user_rate: RateLimit::new(1, 3),
            ..Limits::unlimited()
        };
    })
    .await;
    let sku = app.new_sale(100, 1).await;
    let mut limited = 0;
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let resp = app.place_order(7, &sku, 1).await;
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = resp.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(retry >= 1);
            let (_, code) = status_code(resp).await;
            assert_eq!(code, "rate_limited");
            limited += 1;
        }
    }
    // A burst of 3, then 1/s: however slow the machine, at most 3 + one
    // per second started were let through.
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = 10 - limited;
    assert!(
        allowed as f64 <= 3.0 + elapsed.ceil(),
        "{allowed} of 10 let through in {elapsed:.1} s"
    );
    assert!(
        limited > 0 || elapsed > 6.0,
        "none limited in {elapsed:.1} s"
    );
    for user in 100..110 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED,
            "other users are served"
        );
    }
    // The hammering user bought one unit; refusals took no stock.
    assert_eq!(app.stock(&sku).await, Some(100 - 11));
}

#[tokio::test]
async fn the_address_limit_applies_per_client_address() {
    let app = spawn_app_with(|s| {
        s.http.limits = Limits {
            ip_rate: RateLimit::new(1, 2),
            client_ip_header: Some("x-forwarded-for".parse().unwrap()),
            // The test's client is the proxy.
            client_ip_proxies: vec!["127.0.0.0/8".parse().unwrap()],
            ..Limits::unlimited()
        };
    })
    .await;
    let sku = app.new_sale(100, 1).await;
    let order = |user: u64, ip: &'static str| {
        app.client
            .post(app.url("/api/orders"))
            .header("x-forwarded-for", format!("203.0.113.9, {ip}"))
            .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
            .send()
    };
    let mut statuses = Vec::new();
    let started = std::time::Instant::now();
    for user in 1..=5 {
        statuses.push(order(user, "198.51.100.1").await.unwrap().status());
    }
    // A burst of 2, then 1/s: at most 2 + one per second started.
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    assert!(
        allowed as f64 <= 2.0 + elapsed.ceil(),
        "{allowed} of 5 from one address in {elapsed:.1} s: {statuses:?}"
    );
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS) || elapsed > 3.0,
        "5 orders from one address at 1/s, burst 2: {statuses:?}"
    );
    assert_eq!(
        order(50, "198.51.100.2").await.unwrap().status(),
        StatusCode::ACCEPTED,
        "another address is served"
    );
}

#[tokio::test]
async fn a_full_rate_limit_table_refuses_new_clients_until_idle_ones_are_evicted() {
    let app = spawn_app_with(|s| {
        s.http.limits = Limits {
            user_rate: RateLimit::new(2, 2),
            max_keys: 3,
            ..Limits::unlimited()
        };
    })
    .await;
    let sku = app.new_sale(100, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    assert_refused(
        app.place_order(4, &sku, 1).await,
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
    )
    .await;
    // Once the first three buckets are full again, they are idle and evicted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        app.place_order(5, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(app.stock(&sku).await, Some(96));
}

#[tokio::test]
async fn a_stalled_redis_gives_503_within_the_timeout_and_recovery_follows() {
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let app = spawn_app_with(|s| {
        s.redis.target = RedisTarget::Single(format!("redis://127.0.0.1:{}", proxy.port));
        s.redis.timeout = Duration::from_millis(300);
        s.workers = None;
    })
    .await;
    let sku = app.new_sale(10, 1).await;
    proxy.set_mode(Mode::Stall);
    assert_refused(
        app.place_order(1, &sku, 1).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    )
    .await;
    let (status, _) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    proxy.set_mode(Mode::Forward);
    eventually(
        "orders are taken again",
        Duration::from_secs(10),
        || async { app.place_order(1, &sku, 1).await.status() == StatusCode::ACCEPTED },
    )
    .await;
    assert_eq!(
        app.stock(&sku).await,
        Some(9),
        "the stalled attempt took nothing"
    );
}

#[tokio::test]
async fn a_stalled_mysql_gives_503_within_the_request_timeout_and_recovery_follows() {
    let proxy = Proxy::start("127.0.0.1:3306").await;
    let app = spawn_app_with(|s| {
        s.db.url =
            s.db.url
                .replace("127.0.0.1:3306", &format!("127.0.0.1:{}", proxy.port));
        // The request bound is far shorter than MySQL's (and than the
        // client's patience below): it is what answers here.
        s.db.timeout = Duration::from_secs(60);
        s.http.limits.request_timeout = Duration::from_millis(400);
        s.workers = None;
    })
    .await;
    let (status, _) = app.get_json("/api/users/1/orders").await;
    assert_eq!(status, StatusCode::OK);
    proxy.set_mode(Mode::Stall);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let resp = impatient
        .get(app.url("/api/users/1/orders"))
        .send()
        .await
        .expect("answered before the client gives up");
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");

    proxy.set_mode(Mode::Forward);
    eventually("MySQL answers again", Duration::from_secs(10), || async {
        app.get_json("/api/users/1/orders").await.0 == StatusCode::OK
    })
    .await;
}

#[tokio::test]
async fn serve_refuses_to_start_with_admin_routes_and_no_or_a_weak_token() {
    for token in [
        None,
        Some("short"),
        Some("changeme-changeme-changeme"),
        Some("aaaaaaaaaaaaaaaaaaaaaaaa"),
    ] {
        let mut settings = settings_for(Backend::Single, &unique("t"), &unique("fs_test_"));
        settings.http.admin_token = token.map(Into::into);
        let err = App::build(&settings).await.err().expect("refused");
        assert!(err.to_string().contains("ADMIN_TOKEN"), "says why: {err}");
    }
}

#[tokio::test]
async fn without_admin_routes_there_is_nothing_to_guess() {
    let app = spawn_app_with(|s| {
        s.http.admin_token = None;
        s.http.admin_routes = false;
    })
    .await;
    let sku = unique("sku-");
    let resp = app
        .client
        .post(app.url("/api/admin/products"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&crate::helpers::product_body(&sku, 5, 1))
        .send()
        .await
        .unwrap();
    assert_refused(resp, StatusCode::NOT_FOUND, "not_found").await;
    let (status, _) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
}

#[tokio::test]
async fn too_many_or_too_large_headers_get_431_with_the_error_body() {
    let app = spawn_app_with(|_| {}).await;
    let mut req = app.client.get(app.url("/healthz"));
    for i in 0..80 {
        req = req.header(format!("x-h{i}"), "v");
    }
    assert_refused(
        req.send().await.unwrap(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
    )
    .await;
    let big = "x".repeat(10 * 1024);
    let resp = app
        .client
        .get(app.url("/healthz"))
        .header("x-big", big)
        .send()
        .await
        .unwrap();
    assert_refused(
        resp,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
    )
    .await;
}

#[tokio::test]
async fn deeply_nested_json_is_a_400_and_changes_nothing() {
    let app = spawn_app_with(|_| {}).await;
    let sku = app.new_sale(5, 1).await;
    let deep = format!(
        r#"{{"user_id": 1, "product_id": "{sku}", "quantity": {}1{}}}"#,
        "[".repeat(3000),
        "]".repeat(3000)
    );
    let resp = app
        .client
        .post(app.url("/api/orders"))
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    assert_refused(resp, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert_eq!(app.stock(&sku).await, Some(5));
}

#[tokio::test]
async fn the_openapi_document_covers_every_route_and_error_code() {
    let app = spawn_app_with(|_| {}).await;
    let (status, doc) = app.get_json("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let routes = [
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/api/products/{product_id}"),
        ("post", "/api/admin/products"),
        ("post", "/api/admin/products/{product_id}/open"),
        ("get", "/api/admin/products/{product_id}/audit"),
        ("post", "/api/orders"),
        ("get", "/api/orders/{order_id}"),
        ("post", "/api/orders/{order_id}/pay"),
        ("post", "/api/orders/{order_id}/cancel"),
        ("get", "/api/users/{user_id}/orders"),
        ("post", "/api/sales/{product_id}/queue"),
        ("get", "/api/sales/{product_id}/challenge"),
        ("get", "/api/sales/{product_id}/queue/{ticket}"),
        ("post", "/api/admin/products/{product_id}/room"),
        ("post", "/api/admin/products/{product_id}/close"),
        ("post", "/api/payments/notifications"),
        ("get", "/api/admin/events"),
        ("get", "/api/admin/events/dead"),
        ("post", "/api/admin/events/dead/replay"),
        ("post", "/api/admin/products/{product_id}/pause"),
        ("post", "/api/admin/products/{product_id}/resume"),
        ("get", "/api/admin/log"),
        ("post", "/api/admin/products/{product_id}/restock"),
        ("get", "/api/admin/products/{product_id}/report"),
        ("get", "/api/admin/products/{product_id}/report/csv"),
    ];
    let paths = doc["paths"].as_object().unwrap();
    let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(
        documented,
        routes.len(),
        "no undocumented or phantom routes"
    );
    for (method, path) in routes {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is documented");
        for status in ["431", "503"] {
            assert!(
                op["responses"][status].is_object(),
                "{method} {path} lists {status}"
            );
        }
    }
    // Every buyer route names its security scheme and its 401.
    assert_eq!(
        doc["components"]["securitySchemes"]["buyer"]["bearerFormat"],
        "JWT"
    );
    for (method, path) in routes {
        let op = &doc["paths"][path][method];
        let buyer = path.starts_with("/api/orders")
            || path.starts_with("/api/users/")
            || path == "/api/sales/{product_id}/queue";
        let admin = path.starts_with("/api/admin/");
        let scheme = if buyer { "buyer" } else { "admin" };
        if path == "/api/payments/notifications" {
            // Signed per Standard Webhooks, not a bearer: the headers, and
            // the 401 when they do not verify.
            let params = op["parameters"].to_string();
            for header in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
                assert!(params.contains(header), "{path} takes {header}");
            }
            assert!(op["responses"]["401"].is_object(), "{path} lists 401");
        } else if buyer || admin {
            assert!(
                op["security"][0][scheme].is_array(),
                "{method} {path} requires {scheme}"
            );
            assert!(
                op["responses"]["401"].is_object(),
                "{method} {path} lists 401"
            );
        } else {
            assert!(
                op["responses"]["401"].is_null(),
                "{method} {path} is public"
            );
        }
    }
    let order = &doc["paths"]["/api/orders"]["post"]["responses"];
    assert!(order["429"]["headers"]["Retry-After"].is_object());
    assert!(order["503"]["headers"]["Retry-After"].is_object());
    // `sale_not_started` says when: `starts_at` in the body, Retry-After.
    assert!(order["409"]["headers"]["Retry-After"].is_object());
    assert!(
        doc["components"]["schemas"]["ErrorBody"]["properties"]["starts_at"]["type"]
            .to_string()
            .contains("integer")
    );
    let codes: Vec<&str> = doc["components"]["schemas"]["ErrorBody"]["properties"]["error"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for code in [
        "overloaded",
        "rate_limited",
        "headers_too_large",
        "sold_out",
        "unavailable",
    ] {
        assert!(codes.contains(&code), "{code} is listed");
    }
    // Links are spelled as OpenAPI spells them.
    let link = &doc["paths"]["/api/orders"]["post"]["responses"]["202"]["links"]["GetOrder"];
    assert_eq!(link["operationId"], "get_order");
}

/// `CLIENT_IP_HEADER` is believed only from the proxies that set it: a
/// client reaching the service directly, writing its own
/// `X-Forwarded-For` anew for each order, is still one address and meets
/// the address limit (settings through the real command line).
#[tokio::test]
async fn a_client_past_the_proxies_cannot_pick_its_own_address() {
    let app = spawn_app_cli(
        &[
            "--auth=none",
            "--client-ip-header=X-Forwarded-For",
            "--client-ip-trusted-proxies=10.0.0.0/8",
            "--rate-limit-ip-per-sec=1",
            "--rate-limit-ip-burst=2",
        ],
        |_| {},
    )
    .await;
    let sku = app.new_sale(100, 1).await;
    let mut statuses = Vec::new();
    for user in 1..=6u64 {
        let resp = app
            .client
            .post(app.url("/api/orders"))
            .header("x-forwarded-for", format!("198.51.100.{user}"))
            .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}))
            .send()
            .await
            .expect("answered");
        statuses.push(resp.status());
    }
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(
        refused >= 2,
        "six orders from one address, each with an address of its own in the header: {statuses:?}"
    );
}
