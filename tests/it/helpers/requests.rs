//! `TestApp`'s calls of the HTTP API, as buyers and operators make them.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use super::{ADMIN_TOKEN, TestApp, eventually, eventually_some, product_body, unique};

/// The catalog and the orders.
impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn create_product(&self, body: &Value) -> Response {
        self.client
            .post(self.url("/api/admin/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn open_sale(&self, product_id: &str) -> Response {
        self.client
            .post(self.url(&format!("/api/admin/products/{product_id}/open")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("request sent")
    }

    /// `POST path` as the operator (the admin token): the answer's status
    /// and JSON body (null when none).
    pub async fn admin_post(&self, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Closes the sale now, as an operator does (the admin API).
    pub async fn close_sale(&self, product_id: &str) {
        let resp = self
            .client
            .post(self.url(&format!("/api/admin/products/{product_id}/close")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("request sent");
        assert_eq!(resp.status(), StatusCode::OK, "closing {product_id}");
    }

    /// Creates and opens a sale with a window around now; returns its id.
    pub async fn new_sale(&self, stock: u64, limit: u64) -> String {
        let id = unique("sku-");
        self.sale_from(product_body(&id, stock, limit)).await
    }

    /// Creates and opens a sale from a full product body; returns its id.
    pub async fn sale_from(&self, body: Value) -> String {
        let id = body["product_id"].as_str().expect("product_id").to_owned();
        assert_eq!(
            self.create_product(&body).await.status(),
            StatusCode::CREATED
        );
        assert_eq!(self.open_sale(&id).await.status(), StatusCode::OK);
        id
    }

    pub async fn place_order(&self, user_id: u64, product_id: &str, quantity: u64) -> Response {
        self.post_order(
            &json!({"user_id": user_id, "product_id": product_id, "quantity": quantity}),
            None,
        )
        .await
    }

    pub async fn post_order(&self, body: &Value, idempotency_key: Option<&str>) -> Response {
        let mut req = self.client.post(self.url("/api/orders")).json(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.expect("request sent")
    }

    /// One order of one unit from each of `users`, each answered 202.
    pub async fn accept_orders(&self, product_id: &str, users: std::ops::RangeInclusive<u64>) {
        for user in users {
            assert_eq!(
                self.place_order(user, product_id, 1).await.status(),
                StatusCode::ACCEPTED
            );
        }
    }

    /// One order of one unit from each of `users`: their ids.
    pub async fn order_ids(
        &self,
        product_id: &str,
        users: std::ops::RangeInclusive<u64>,
    ) -> Vec<String> {
        let mut ids = Vec::new();
        for user in users {
            let order: Value = self
                .place_order(user, product_id, 1)
                .await
                .json()
                .await
                .unwrap();
            ids.push(order["order_id"].as_str().unwrap().to_owned());
        }
        ids
    }

    /// One unit for `user_id`, under an Idempotency-Key, retried while the
    /// answer is a 503 (as clients do: with WAIT on, a busy replica may not
    /// confirm in time); panics unless it ends in a 202. The order's JSON.
    pub async fn order_until_accepted(&self, user_id: u64, product_id: &str) -> Value {
        let body = json!({"user_id": user_id, "product_id": product_id, "quantity": 1});
        let key = format!("until-accepted-{user_id}");
        let what = format!("order of user {user_id} accepted");
        eventually_some(&what, Duration::from_secs(15), || async {
            let resp = self.post_order(&body, Some(&key)).await;
            match resp.status() {
                StatusCode::ACCEPTED => Some(resp.json().await.expect("an order")),
                StatusCode::SERVICE_UNAVAILABLE => None,
                other => panic!(
                    "order of user {user_id} answered {other}: {}",
                    resp.text().await.unwrap_or_default()
                ),
            }
        })
        .await
    }

    /// `POST /api/orders/{order_id}/cancel` as `user_id`.
    pub async fn cancel(&self, order_id: &str, user_id: u64) -> Response {
        self.client
            .post(self.url(&format!("/api/orders/{order_id}/cancel")))
            .json(&json!({"user_id": user_id}))
            .send()
            .await
            .expect("request sent")
    }

    /// `POST /api/orders/{id}/{action}` (`pay`, `cancel`) as `user`.
    pub async fn act(&self, id: &str, action: &str, user: u64) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(self.url(&format!("/api/orders/{id}/{action}")))
            .json(&json!({"user_id": user}))
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

/// What operators read.
impl TestApp {
    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `/metrics` as the operator scrapes it (with the admin token: every
    /// open sale, upcoming ones too).
    pub async fn metrics_text(&self) -> String {
        let resp = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        resp.expect("answered").text().await.expect("a text body")
    }

    /// `GET /api/admin/log<query>` as the operator: a page of the admin
    /// log (`entries`, newest first, and `next`).
    pub async fn admin_log_page(&self, query: &str) -> Value {
        let resp = self
            .client
            .get(self.url(&format!("/api/admin/log{query}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("a JSON page")
    }

    /// The admin log's newest page.
    pub async fn admin_log(&self) -> Value {
        self.admin_log_page("").await
    }

    /// A sale's audit, as admins get it (`{"ok", "audit"}`).
    pub async fn audit(&self, product_id: &str) -> Value {
        self.client
            .get(self.url(&format!("/api/admin/products/{product_id}/audit")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answered")
            .json()
            .await
            .expect("a JSON audit")
    }

    /// Waits (10 s at most) until the audit finds `sku`'s books balanced.
    pub async fn books_balance(&self, sku: &str) {
        eventually("the books balance", Duration::from_secs(10), || async {
            self.audit(sku).await["ok"] == true
        })
        .await;
    }
}

/// The value of a series on the instance's `/metrics` (0 when absent).
pub async fn metric(app: &TestApp, base: &str, series: &str) -> f64 {
    let text = app
        .client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}
