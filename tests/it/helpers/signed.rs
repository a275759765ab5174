//! Signed messages, as the other side signs them: buyers' JWTs (HS256 with
//! the suite's secret) and Standard Webhooks payment notifications (signed by
//! the `openssl` recipe of docs/api.md, run by bash: an implementation of the
//! scheme apart from the service's, or by the library's own signer).

use std::process::Command;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use super::{TestApp, now_ms, unique};

/// The HS256 secret of the services that verify buyers' tokens.
pub const JWT_SECRET: &str = "test-jwt-secret-0123456789abcdef0123456789";

/// The payment secret of the services these tests start.
pub const PAY_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A token with `claims`, signed by `alg` with `key`.
pub fn sign_jwt(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: Value) -> String {
    let header = Header {
        kid: kid.map(Into::into),
        ..Header::new(alg)
    };
    jsonwebtoken::encode(&header, &claims, key).expect("token signs")
}

/// A valid HS256 token for `user` (the suite's secret, an hour left).
pub fn token(user: u64) -> String {
    sign_jwt(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap(),
        json!({"sub": user.to_string(), "exp": now_ms() / 1000 + 3600}),
    )
}

/// The docs' recipe: the `webhook-signature` of a message, by openssl.
pub fn openssl_signature(secret: &str, id: &str, ts: i64, body: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            r#"set -euo pipefail
key=$(printf %s "${SECRET#whsec_}" | base64 -d | od -An -vtx1 | tr -d ' \n')
printf 'v1,%s' "$(printf '%s.%s.%s' "$ID" "$TS" "$BODY" \
  | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$key" -binary | base64)""#,
        )
        .env("SECRET", secret)
        .env("ID", id)
        .env("TS", ts.to_string())
        .env("BODY", body)
        .output()
        .expect("bash and openssl run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("base64 is ASCII")
}

/// A payment notification's body.
pub fn notification(kind: &str, order_id: &str, payment_id: &str, amount: &str) -> String {
    json!({
        "type": kind,
        "timestamp": "2026-12-01T20:00:00Z",
        "data": {"order_id": order_id, "payment_id": payment_id, "amount": amount, "currency": "CNY"},
    })
    .to_string()
}

impl TestApp {
    /// Sends `body` as the payment side would: signed with `secret`, dated
    /// `ts`, under `webhook_id`.
    pub async fn notify_as(
        &self,
        secret: &str,
        webhook_id: &str,
        ts: i64,
        body: &str,
    ) -> (StatusCode, Value) {
        let signature = openssl_signature(secret, webhook_id, ts, body);
        let resp = self
            .client
            .post(self.url("/api/payments/notifications"))
            .header("content-type", "application/json")
            .header("webhook-id", webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body.to_owned())
            .send()
            .await
            .expect("answered");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Sends a `kind` notification of `payment_id` (`amount`) for
    /// `order_id`, signed with [`PAY_SECRET`], dated now.
    pub async fn notify_of(
        &self,
        kind: &str,
        order_id: &str,
        payment_id: &str,
        amount: &str,
    ) -> (StatusCode, Value) {
        self.notify(&notification(kind, order_id, payment_id, amount))
            .await
    }

    /// Sends `body` signed with [`PAY_SECRET`], dated now.
    pub async fn notify(&self, body: &str) -> (StatusCode, Value) {
        let id = unique("msg_");
        self.notify_as(PAY_SECRET, &id, now_ms() / 1000, body).await
    }

    /// Posts `body` to `base`'s `/api/payments/notifications` as a payment
    /// side does: signed with `secret` (Standard Webhooks) under
    /// `webhook_id`, dated now.
    pub async fn send_signed(
        &self,
        base: &str,
        secret: &str,
        webhook_id: &str,
        body: &str,
    ) -> reqwest::Result<Response> {
        let secret = flashsale::domain::webhook::Secret::parse(secret).expect("a secret");
        let ts = now_ms() / 1000;
        self.client
            .post(format!("{base}/api/payments/notifications"))
            .header("content-type", "application/json")
            .header("webhook-id", webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                secret.sign(webhook_id, ts, body.as_bytes()),
            )
            .body(body.to_owned())
            .send()
            .await
    }
}
