//! An accepted order as Redis holds it: its record in the sale's
//! `accepted` hash (as `place_order.lua` writes it, or as the books restore
//! it), the field of its Idempotency-Key, and how far it got
//! (`order_state.lua`).

use redis::{ParsingError, RedisResult, aio::ConnectionLike};
use rust_decimal::Decimal;
use serde::Deserialize;

use crate::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId};
use crate::sale::error::SaleError;
use crate::sale::keys::{GROUP, SaleKeys};
use crate::sale::lua::script;

/// How far an accepted order got, as far as Redis knows (`order_state.lua`).
/// MySQL knows more (paid, cancelled before the units came back): this is
/// for answering while it is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// In the stream, not yet persisted.
    InStream,
    /// Persisted (acked by a worker): `confirmed` or later in MySQL.
    Persisted,
    /// A cancel waits for the order to be persisted.
    CancelRequested,
    /// Cancelled, and its units are back on sale.
    Released,
    /// In dead letters: never persisted, waiting for an operator.
    DeadLettered,
}

/// The `accepted` record of an order restored from the books: no stream
/// entry (it is persisted), marked `booked`.
pub(crate) fn booked_record(o: &PendingOrder) -> String {
    serde_json::json!({
        "user_id": o.user_id,
        "quantity": o.quantity,
        "price": o.price.to_string(),
        "created_ms": o.created_ms,
        "booked": true,
    })
    .to_string()
}

/// An order's record in the `accepted` hash, as `place_order.lua` writes it.
#[derive(Debug, Deserialize)]
pub(crate) struct AcceptedRecord {
    #[serde(default)]
    idempotency_key: Option<String>,
    user_id: u64,
    quantity: u64,
    price: Decimal,
    created_ms: i64,
}

impl AcceptedRecord {
    pub(crate) fn parse(
        json: &str,
        order_id: OrderId,
        product_id: ProductId,
    ) -> Result<PendingOrder, SaleError> {
        let r: Self = serde_json::from_str(json)
            .map_err(|e| SaleError::Corrupt(format!("order record {order_id}: {e}")))?;
        let corrupt =
            |e: crate::domain::Invalid| SaleError::Corrupt(format!("order record: {}", e.0));
        Ok(PendingOrder {
            order_id,
            user_id: UserId::new(r.user_id).map_err(corrupt)?,
            product_id,
            quantity: Quantity::new(r.quantity).map_err(corrupt)?,
            price: r.price,
            created_ms: r.created_ms,
            idempotency_key: r.idempotency_key,
        })
    }
}

script!(ORDER_STATE, "order_state");

/// `order_state.lua`: the order's record and progress, `None` when unknown.
#[tracing::instrument(level = "debug", skip_all, fields(order_id = %order_id))]
pub async fn order_state(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    order_id: &OrderId,
) -> RedisResult<Option<(String, Progress)>> {
    let reply: Vec<String> = ORDER_STATE
        .key(&keys.accepted)
        .key(&keys.released)
        .key(&keys.cancels)
        .key(&keys.orders)
        .key(&keys.dead)
        .arg(order_id.as_str())
        .arg(GROUP)
        .invoke_async(conn)
        .await?;
    let mut parts = reply.into_iter();
    let (Some(record), Some(state)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    let progress = match state.as_str() {
        "released" => Progress::Released,
        "cancel_requested" => Progress::CancelRequested,
        "in_stream" => Progress::InStream,
        "dead" => Progress::DeadLettered,
        "persisted" => Progress::Persisted,
        other => {
            return Err(ParsingError::from(format!("unknown order_state {other:?}")).into());
        }
    };
    Ok(Some((record, progress)))
}

/// The field of an Idempotency-Key's record in the sale's `idem` hash:
/// `user_id:key`, so that keys of different buyers never meet.
pub(crate) fn idempotency_field(user_id: UserId, key: &str) -> String {
    format!("{user_id}:{key}")
}
