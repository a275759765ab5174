//! Pausing a sale and resuming it (`pause_sale.lua`): while paused every
//! order is refused and the waiting room's line stands still; the window
//! is not moved.

use redis::{ParsingError, RedisResult, Value, aio::ConnectionLike};

use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

script!(PAUSE_SALE, "pause_sale");

/// A sale's pause, as `pause_sale.lua` left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paused {
    /// A pause asked past the sale's end: nothing changed (the rest says
    /// the sale is live, as it was).
    pub ended: bool,
    /// Paused now.
    pub paused: bool,
    /// This call paused or resumed it (false: it already was).
    pub changed: bool,
    /// Since when (epoch ms, by the sale's Redis node): the pause's start,
    /// or the last resume (0: never paused).
    pub since_ms: i64,
}

/// `pause_sale.lua`: pauses (`pause`) or resumes the sale; `None` when
/// Redis does not have it.
pub async fn pause_sale(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    pause: bool,
) -> RedisResult<Option<Paused>> {
    let reply: Vec<Value> = PAUSE_SALE
        .key(&keys.sale)
        .arg(if pause { "pause" } else { "resume" })
        .invoke_async(conn)
        .await?;
    let mut parts = reply.into_iter();
    let state: String = match parts.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => return Err(ParsingError::from("an empty pause_sale reply").into()),
    };
    match state.as_str() {
        "no_sale" => return Ok(None),
        "ended" => {
            return Ok(Some(Paused {
                ended: true,
                paused: false,
                changed: false,
                since_ms: 0,
            }));
        }
        _ => {}
    }
    let mut int = || -> RedisResult<i64> {
        match parts.next() {
            Some(v) => Ok(redis::from_redis_value(v)?),
            None => Err(ParsingError::from("a short pause_sale reply").into()),
        }
    };
    let changed = int()? == 1;
    let since_ms = int()?;
    Ok(Some(Paused {
        ended: false,
        paused: state == "paused",
        changed,
        since_ms,
    }))
}
