//! Giving an order's units back (`release_stock.lua`) and taking them again
//! for a late payment (`retake_order.lua`).

use redis::{FromRedisValue, ParsingError, Value};

use super::record::booked_record;
use crate::domain::PendingOrder;
use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

script!(RELEASE_STOCK, "release_stock");

script!(RETAKE_ORDER, "retake_order");

/// `release_stock.lua`, for a cancel made at `cancelled_ms`: replies
/// `(released_now, stock_left)`.
pub(super) fn release_stock_call(
    keys: &SaleKeys,
    order: &PendingOrder,
    cancelled_ms: i64,
) -> redis::ScriptInvocation<'static> {
    let k = keys;
    let keys = [&k.stock, &k.bought, &k.released, &k.accepted, &k.retaken];
    let mut call = order_call(&RELEASE_STOCK, &keys, order);
    call.arg(booked_record(order)).arg(cancelled_ms);
    call
}

/// `script` with `keys`, then the order's id, buyer and units: the first
/// ARGV of both scripts.
fn order_call(
    script: &'static redis::Script,
    keys: &[&String],
    order: &PendingOrder,
) -> redis::ScriptInvocation<'static> {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key.as_str());
    }
    call.arg(order.order_id.as_str())
        .arg(order.user_id)
        .arg(order.quantity);
    call
}

/// What `retake_order.lua` found for a late payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retake {
    /// The units are the order's again (now or by an earlier call).
    Taken,
    /// Not here: no such sale or order in this Redis, the sale is over,
    /// the units sold to others, or the buyer's allowance used up since.
    Refused(&'static str),
}

impl FromRedisValue for Retake {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut parts = Vec::<Value>::from_redis_value(v)?.into_iter();
        let tag = String::from_redis_value(parts.next().ok_or("empty reply")?)?;
        Ok(match tag.as_str() {
            "taken" => Self::Taken,
            "no_sale" => Self::Refused("no_sale"),
            "unknown" => Self::Refused("unknown"),
            "ended" => Self::Refused("ended"),
            "sold_out" => Self::Refused("sold_out"),
            "limit" => Self::Refused("limit"),
            other => {
                return Err(ParsingError::from(format!(
                    "unexpected retake_order reply {other:?}"
                )));
            }
        })
    }
}

/// `retake_order.lua`, for the cancel made at `cancelled_ms`: replies a
/// [`Retake`].
pub(super) fn retake_order_call(
    keys: &SaleKeys,
    order: &PendingOrder,
    cancelled_ms: i64,
) -> redis::ScriptInvocation<'static> {
    let k = keys;
    let keys = [
        &k.sale,
        &k.stock,
        &k.bought,
        &k.released,
        &k.accepted,
        &k.retaken,
    ];
    let mut call = order_call(&RETAKE_ORDER, &keys, order);
    call.arg(cancelled_ms);
    call
}
