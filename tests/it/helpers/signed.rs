//! Signed messages: Standard Webhooks payment notifications (as the payment
//! side signs them).

use reqwest::Response;

use super::{TestApp, now_ms};

impl TestApp {
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
