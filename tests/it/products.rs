//! Products: creating, opening, reading.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{ADMIN_TOKEN, assert_refused, product_body, spawn_app, status_code, unique};

#[tokio::test]
async fn a_product_reads_back_with_null_stock_until_opened() {
    let app = spawn_app().await;
    let sku = unique("sku-");
    let body = product_body(&sku, 25, 3);
    let created = app.create_product(&body).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let created: Value = created.json().await.unwrap();
    for field in [
        "product_id",
        "title",
        "available_qty",
        "start_time",
        "end_time",
        "limit_per_user",
    ] {
        assert_eq!(created[field], body[field], "{field}");
    }
    assert_eq!(created["price"], "4999");
    assert_eq!(created["stock"], Value::Null);

    let path = format!("/api/products/{sku}");
    assert_eq!(app.get_json(&path).await, (StatusCode::OK, created));

    let opened: Value = app.open_sale(&sku).await.json().await.unwrap();
    assert_eq!(opened["stock"], 25);
    assert_eq!(app.get_json(&path).await.1["stock"], 25);
}

#[tokio::test]
async fn creating_a_product_twice_is_a_conflict() {
    let app = spawn_app().await;
    let body = product_body(&unique("sku-"), 5, 1);
    assert_eq!(
        app.create_product(&body).await.status(),
        StatusCode::CREATED
    );
    assert_refused(
        app.create_product(&body).await,
        StatusCode::CONFLICT,
        "product_exists",
    )
    .await;
}

#[tokio::test]
async fn unknown_products_are_not_found() {
    let app = spawn_app().await;
    for path in ["/api/products/nope", "/api/products/a%7Bb"] {
        let resp = app.client.get(app.url(path)).send().await.unwrap();
        assert_refused(resp, StatusCode::NOT_FOUND, "product_not_found").await;
    }
    assert_refused(
        app.open_sale("nope").await,
        StatusCode::NOT_FOUND,
        "product_not_found",
    )
    .await;
}

#[tokio::test]
async fn opening_a_sale_twice_does_not_reset_its_stock() {
    let app = spawn_app().await;
    let sku = app.new_sale(10, 1).await;
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    let again: Value = app.open_sale(&sku).await.json().await.unwrap();
    assert_eq!(again["opened"], false);
    assert_eq!(again["stock"], 9);
    assert_eq!(app.stock(&sku).await, Some(9));
    // The buyer's record survives too: the limit still holds.
    let (_, code) = status_code(app.place_order(1, &sku, 1).await).await;
    assert_eq!(code, "limit_exceeded");
}

#[tokio::test]
async fn admin_routes_need_the_right_token() {
    let app = spawn_app().await;
    let sku = unique("sku-");
    let body = product_body(&sku, 5, 1);
    let url = app.url("/api/admin/products");
    let attempts = [
        app.client.post(&url).json(&body),
        app.client.post(&url).bearer_auth("wrong").json(&body),
        app.client
            .post(&url)
            .bearer_auth(format!("{ADMIN_TOKEN}x"))
            .json(&body),
        app.client
            .post(&url)
            .header("authorization", ADMIN_TOKEN)
            .json(&body),
    ];
    for req in attempts {
        assert_refused(
            req.send().await.unwrap(),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
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
        "a refused create changed nothing"
    );

    assert_eq!(
        app.create_product(&body).await.status(),
        StatusCode::CREATED
    );
    let open = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/open")));
    assert_eq!(
        open.send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.stock(&sku).await,
        None,
        "a refused open changed nothing"
    );
}
