//! A sale's window by Redis's clock: reading it with the node's time
//! (`sale_clock.lua`) and closing it early (`close_sale.lua`).

use redis::{ParsingError, RedisResult, aio::ConnectionLike};

use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

script!(SALE_CLOCK, "sale_clock");

script!(CLOSE_SALE, "close_sale");

/// `close_sale.lua`: ends the sale now; its end (ms), `None` when not open.
pub async fn close_sale(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
) -> RedisResult<Option<i64>> {
    CLOSE_SALE.key(&keys.sale).invoke_async(conn).await
}

/// `sale_clock.lua`: the Redis node's time (ms) and the sale's window, if open.
pub async fn sale_clock(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
) -> RedisResult<(i64, Option<(i64, i64)>)> {
    let reply: Vec<i64> = SALE_CLOCK.key(&keys.sale).invoke_async(conn).await?;
    match reply[..] {
        [secs, micros] => Ok((secs * 1000 + micros / 1000, None)),
        [secs, micros, start, end] => Ok((secs * 1000 + micros / 1000, Some((start, end)))),
        _ => Err(ParsingError::from(format!("unexpected sale_clock reply {reply:?}")).into()),
    }
}
