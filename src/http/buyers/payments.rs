//! `POST /api/payments/notifications`: the payment side tells the books a
//! payment's outcome, as a Standard Webhooks message (signed with a shared
//! `whsec_` secret: [`crate::domain::webhook`]). Not a buyer route: only
//! a sender holding a secret in `PAYMENT_WEBHOOK_SECRETS` is heard, and
//! with no secret set the route is not served.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::state::Buyers;
use crate::bookkeeping::PaymentRecord;
use crate::config::PaymentSettings;
use crate::domain::webhook::Signed;
use crate::domain::{Currency, OrderId, OrderStatus, PaymentKind, PaymentResult, now_ms};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract;
use crate::metrics::timeline::Count;
use crate::store::NewPayment;

/// A notification, per Standard Webhooks' payload convention (`type`:
/// `payment.succeeded`, `payment.failed` or `payment.refunded`,
/// `data`). Fields a sender adds beside these (its `timestamp`, its own
/// details) are ignored: payment sides add fields without notice.
#[derive(Deserialize, ToSchema)]
pub struct PaymentNotification {
    #[serde(rename = "type")]
    kind: PaymentKind,
    data: PaymentData,
}

#[derive(Deserialize, ToSchema)]
pub struct PaymentData {
    order_id: String,
    /// The payment side's own id for the payment: a notification with an
    /// id (and `type`) recorded before changes nothing.
    #[schema(min_length = 1, max_length = 191)]
    payment_id: String,
    /// A decimal string: price × quantity of the order.
    #[schema(example = "37.50")]
    amount: Decimal,
    /// ISO 4217, the service's `SALE_CURRENCY`.
    #[schema(example = "CNY")]
    currency: String,
}

/// What the books made of a notification.
#[derive(Serialize, ToSchema)]
pub struct PaymentAnswer {
    payment_id: String,
    order_id: String,
    /// For `payment.succeeded`: `paid`; `paid_again` (the order had been
    /// cancelled by its payment timeout and the sale still had its units
    /// for the buyer: taken again); `refund_due` (cancelled and the units
    /// gone, or paid by another payment: the money is owed back). For
    /// `payment.failed`: `failed` (the order stays `confirmed` until its
    /// timeout). For `payment.refunded`: `refunded` (the order is
    /// `cancelled`, its units back on sale), `refund_settled` (a payment
    /// owed back was given back), `unmatched` (no payment of this order
    /// the books hold as taken: recorded, nothing changed).
    result: PaymentResult,
    /// The order's status now.
    order_status: OrderStatus,
    /// Recorded by an earlier delivery of this notification.
    replayed: bool,
}

const MAX_PAYMENT_ID_LEN: usize = 191;

#[utoipa::path(
    post,
    path = "/api/payments/notifications",
    operation_id = "payment_notification",
    tag = "payments",
    summary = "A payment's outcome, from the payment side",
    description = "A Standard Webhooks message (headers `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>` with a `whsec_` secret of `PAYMENT_WEBHOOK_SECRETS`; 5 minutes of tolerance). `payment.succeeded` for the order's amount turns `confirmed` into `paid`, or a cancelled order into `paid` again when the sale still has its units for the buyer (`paid_again`), or is owed back (`refund_due`); `payment.refunded` (in full) cancels the order it paid and returns its units. The same notification again answers the first result (`replayed: true`). Served only when `PAYMENT_WEBHOOK_SECRETS` is set.",
    params(
        ("webhook-id" = String, Header, description = "The message's id"),
        ("webhook-timestamp" = i64, Header, description = "Seconds since the epoch"),
        ("webhook-signature" = String, Header, description = "`v1,<base64>`, space-separated when several"),
    ),
    request_body = PaymentNotification,
    responses(
        (status = 200, description = "Recorded: `paid`, `paid_again`, `refund_due`, `failed`, `refunded`, `refund_settled` or `unmatched`", body = PaymentAnswer),
        (status = 401, description = "`invalid_signature`: missing, malformed, stale or not signed with a secret this service holds", body = ErrorBody),
        (status = 404, description = "`order_not_found`: the books hold no such order", body = ErrorBody),
        (status = 409, description = "`order_pending`: accepted, not in the books yet; send again shortly", body = ErrorBody),
        (status = 422, description = "`amount_mismatch` (recorded; the order unchanged), `payment_id_reused` (the id was recorded for another order)", body = ErrorBody),
    )
)]
pub async fn notify(
    State(state): State<Buyers>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<PaymentAnswer>, ApiError> {
    let Some(settings) = &state.payments else {
        return Err(ApiError::RouteNotFound);
    };
    let answer = hear(&state, settings, &headers, &body).await;
    let result = match &answer {
        Ok(a) if a.replayed => "replayed",
        Ok(a) => a.result.as_str(),
        Err(ApiError::AmountMismatch) => PaymentResult::AmountMismatch.as_str(),
        Err(_) => "refused",
    };
    state
        .metrics
        .payment_notifications
        .with_label_values(&[result])
        .inc();
    // The sale's timeline: what a notification made of its order, once
    // (a replayed delivery is not counted again).
    if let Ok(a) = &answer
        && !a.replayed
        && let Some((_, product)) = crate::domain::OrderId::parse(&a.order_id)
    {
        state
            .metrics
            .timeline
            .count(product.as_str(), Count::Payment(a.result), 1);
    }
    answer.map(Json)
}

async fn hear(
    state: &Buyers,
    settings: &PaymentSettings,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<PaymentAnswer, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let signed = Signed {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
    };
    let webhook_id = signed
        .verify(&settings.secrets, body, now_ms() / 1000)
        .map_err(|why| {
            tracing::warn!(reason = %why, "payment notification refused");
            ApiError::InvalidSignature
        })?;
    let n: PaymentNotification = extract::json(headers, body)?;
    let payment = new_payment(n, webhook_id)?;
    let PaymentRecord {
        result,
        order,
        replayed,
    } = state
        .order_life
        .record_payment(&payment, settings.currency)
        .await?;
    if result == PaymentResult::AmountMismatch {
        return Err(ApiError::AmountMismatch);
    }
    Ok(PaymentAnswer {
        payment_id: payment.payment_id,
        order_id: order.order_id,
        result,
        order_status: order.status,
        replayed,
    })
}

fn new_payment(n: PaymentNotification, webhook_id: String) -> Result<NewPayment, ApiError> {
    let d = n.data;
    let bad = |m: &str| ApiError::InvalidRequest(m.to_owned());
    if d.payment_id.is_empty() || d.payment_id.len() > MAX_PAYMENT_ID_LEN {
        return Err(bad("data.payment_id: 1 to 191 characters"));
    }
    // An id this service never issued is no order of its books.
    let (order_id, _) = OrderId::parse(&d.order_id).ok_or(ApiError::OrderNotFound)?;
    if d.amount.is_sign_negative() {
        return Err(bad("data.amount: not negative"));
    }
    let currency = Currency::parse(&d.currency)
        .map_err(|e| ApiError::InvalidRequest(format!("data.currency: {e}")))?;
    Ok(NewPayment {
        payment_id: d.payment_id,
        kind: n.kind,
        order_id,
        amount: d.amount,
        currency,
        webhook_id,
    })
}
