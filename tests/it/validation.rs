//! Bad input gets a 4xx with the usual error body and changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, product_body, spawn_app, unique};

/// Sends a raw body and checks status, code and that the message names `needle`.
async fn expect_refused(
    app: &TestApp,
    req: reqwest::RequestBuilder,
    status: StatusCode,
    code: &str,
    needle: &str,
) {
    let resp = req.send().await.expect("answered");
    assert_eq!(resp.status(), status, "case naming {needle:?}");
    let body: Value = resp.json().await.expect("JSON error body");
    assert_eq!(body["error"], code, "{body}");
    let message = body["message"].as_str().expect("message");
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
    let _ = app;
}

#[tokio::test]
async fn bad_orders_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let sku = app.new_sale(10, 5).await;
    let long_id = "x".repeat(129);
    let cases: Vec<(String, &str)> = vec![
        ("{\"user_id\":1,".into(), "body"),
        ("[1,2]".into(), "body"),
        (
            json!({"user_id": 1, "product_id": sku}).to_string(),
            "quantity",
        ),
        (
            json!({"product_id": sku, "quantity": 1}).to_string(),
            "user_id",
        ),
        (
            json!({"user_id": "1", "product_id": sku, "quantity": 1}).to_string(),
            "user_id",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": "1"}).to_string(),
            "quantity",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": 1.5}).to_string(),
            "quantity",
        ),
        (
            json!({"user_id": 1, "product_id": 5, "quantity": 1}).to_string(),
            "product_id",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": 0}).to_string(),
            "quantity",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": -1}).to_string(),
            "quantity",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": 10_000_000}).to_string(),
            "quantity",
        ),
        (
            format!("{{\"user_id\":1,\"product_id\":\"{sku}\",\"quantity\":1e30}}"),
            "quantity",
        ),
        (
            json!({"user_id": 0, "product_id": sku, "quantity": 1}).to_string(),
            "user_id",
        ),
        (
            json!({"user_id": -3, "product_id": sku, "quantity": 1}).to_string(),
            "user_id",
        ),
        (
            json!({"user_id": u64::MAX, "product_id": sku, "quantity": 1}).to_string(),
            "user_id",
        ),
        (
            json!({"user_id": 1, "product_id": "", "quantity": 1}).to_string(),
            "product_id",
        ),
        (
            json!({"user_id": 1, "product_id": long_id, "quantity": 1}).to_string(),
            "product_id",
        ),
        (
            json!({"user_id": 1, "product_id": format!("{{{sku}}}"), "quantity": 1}).to_string(),
            "product_id",
        ),
        (
            json!({"user_id": 1, "product_id": "a b", "quantity": 1}).to_string(),
            "product_id",
        ),
        (
            json!({"user_id": 1, "product_id": sku, "quantity": 1, "price": "0"}).to_string(),
            "price",
        ),
    ];
    for (body, needle) in cases {
        let req = app
            .client
            .post(app.url("/api/orders"))
            .header("content-type", "application/json")
            .body(body);
        expect_refused(
            &app,
            req,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            needle,
        )
        .await;
    }
    for key in ["", &"k".repeat(129), "has space"] {
        let req = app
            .client
            .post(app.url("/api/orders"))
            .header("Idempotency-Key", key)
            .json(&json!({"user_id": 1, "product_id": sku, "quantity": 1}));
        expect_refused(
            &app,
            req,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Idempotency-Key",
        )
        .await;
    }
    let huge = json!({"user_id": 1, "product_id": sku, "quantity": 1, "pad": "x".repeat(20_000)});
    let req = app.client.post(app.url("/api/orders")).json(&huge);
    expect_refused(
        &app,
        req,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "large",
    )
    .await;
    let req = app
        .client
        .post(app.url("/api/orders"))
        .header("content-type", "text/plain")
        .body(json!({"user_id": 1, "product_id": sku, "quantity": 1}).to_string());
    expect_refused(
        &app,
        req,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "JSON",
    )
    .await;

    assert_eq!(app.stock(&sku).await, Some(10));
    assert_eq!(app.stream_len(&sku).await, 0);
    assert_eq!(app.bought(&sku, 1).await, 0);
}

#[tokio::test]
async fn bad_products_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let sku = unique("sku-");
    let good = product_body(&sku, 10, 1);
    let with = |field: &str, value: Value| {
        let mut b = good.clone();
        b[field] = value;
        b
    };
    let without = |field: &str| {
        let mut b = good.clone();
        b.as_object_mut().unwrap().remove(field);
        b
    };
    let start = good["start_time"].as_i64().unwrap();
    let cases = vec![
        (with("price", json!("abc")), "price"),
        (with("price", json!("-1")), "price"),
        (with("price", json!(12.5)), "price"),
        (with("price", json!("1.0000000000000000001")), "price"),
        (with("available_qty", json!(-5)), "available_qty"),
        (with("available_qty", json!(1e12 as u64)), "available_qty"),
        (with("limit_per_user", json!(0)), "limit_per_user"),
        (with("title", json!("")), "title"),
        (with("title", json!("t".repeat(1025))), "title"),
        (with("start_time", json!(-1)), "start_time"),
        (with("end_time", json!(start - 1)), "end_time"),
        (with("end_time", json!(start)), "end_time"),
        (with("product_id", json!("a/b")), "product_id"),
        (with("product_id", json!("")), "product_id"),
        (without("title"), "title"),
        (with("surprise", json!(1)), "surprise"),
    ];
    for (body, needle) in cases {
        let req = app
            .client
            .post(app.url("/api/admin/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body);
        expect_refused(
            &app,
            req,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            needle,
        )
        .await;
    }
    // A required body left out, or JSON `null` (what an optional body
    // may be), is refused all the same.
    let admin = || {
        app.client
            .post(app.url("/api/admin/products"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
    };
    for (req, needle) in [
        (admin(), "JSON object"),
        (admin().body("null"), "JSON object"),
    ] {
        expect_refused(
            &app,
            req,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            needle,
        )
        .await;
    }
    let resp = app
        .client
        .get(app.url(&format!("/api/products/{sku}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::NOT_FOUND,
        "no bad body created the product"
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_error_format() {
    let app = spawn_app().await;
    let resp = app
        .client
        .get(app.url("/api/nowhere"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"], "not_found");
    let resp = app
        .client
        .delete(app.url("/api/orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "method_not_allowed"
    );
}
