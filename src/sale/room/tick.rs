//! `room_tick.lua`: admits a room's places at the pace (by Redis's
//! clock), lets the pace follow the backend between the
//! operator's floor and ceiling, applies a change of the bounds, and reads
//! the room. Its reply decoded into the [`RoomState`] an instance keeps.

use redis::{FromRedisValue, ParsingError, RedisResult, Value, aio::ConnectionLike};

use super::pass::RoomKey;
use super::state::RoomState;
use crate::domain::BoundsChange;

/// How old the oldest order not yet persisted may be before the backend
/// counts as strained and the room's pace halves (once a second, down to
/// the floor).
pub const STRAIN_MS: u64 = 2_000;
use crate::sale::error::SaleError;
use crate::sale::keys::{GROUP, SaleKeys};
use crate::sale::lua::script;
use crate::sale::shards::Elsewhere;

script!(ROOM_TICK, "room_tick");

/// `room_tick.lua` with `change` (the default: none).
pub(super) async fn tick(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    change: BoundsChange,
    elsewhere: &Elsewhere,
) -> RedisResult<Value> {
    let mut invocation = ROOM_TICK.prepare_invoke();
    invocation
        .key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.room)
        .key(&keys.orders)
        .key(&keys.room_log)
        .key(&keys.room_used)
        .arg(text(change.ceiling))
        .arg(text(change.floor))
        // No cap is 0 in the room's hash.
        .arg(text(change.cap.map(|cap| cap.unwrap_or(0))))
        .arg(GROUP)
        .arg(STRAIN_MS)
        .arg(text(change.join_difficulty))
        .arg(elsewhere.units)
        .arg(elsewhere.initial);
    for (bucket, buyers) in &elsewhere.used {
        invocation.arg(bucket).arg(buyers);
    }
    invocation.invoke_async(conn).await
}

/// `(the sale exists, its room)`, from the script's reply.
pub(super) fn decode(reply: Value) -> Result<(bool, Option<RoomState>), SaleError> {
    let parts = Vec::<Value>::from_redis_value(reply).map_err(redis::RedisError::from)?;
    let mut parts = parts.into_iter();
    let status: String = next(&mut parts)?;
    match status.as_str() {
        "room" => {}
        "no_room" => return Ok((true, None)),
        _ => return Ok((false, None)),
    }
    let start_ms = next(&mut parts)?;
    let end_ms = next(&mut parts)?;
    let admission_ms = next(&mut parts)?;
    let key_hex: String = next(&mut parts)?;
    let key = RoomKey::from_hex(&key_hex)
        .ok_or_else(|| SaleError::Corrupt("the room key is not hex".into()))?;
    let pace = fraction(next(&mut parts)?, "pace")?;
    let served = fraction(next(&mut parts)?, "served")?;
    Ok((
        true,
        Some(RoomState {
            start_ms,
            end_ms,
            admission_ms,
            seed: key.draw_seed(),
            key,
            pace,
            served,
            at_ms: next(&mut parts)?,
            early: next(&mut parts)?,
            late: next(&mut parts)?,
            stock: next(&mut parts)?,
            now_ms: next(&mut parts)?,
            ceiling: next(&mut parts)?,
            floor: next(&mut parts)?,
            // 0 in the room's hash: no cap.
            cap: Some(next::<u64>(&mut parts)?).filter(|&cap| cap > 0),
            active: next(&mut parts)?,
            unpersisted_ms: u64::try_from(next::<i64>(&mut parts)?).ok(),
            log: next::<Vec<String>>(&mut parts)?
                .iter()
                .map(|e| parse_log_entry(e))
                .collect::<Result<_, _>>()?,
            join_difficulty: next(&mut parts)?,
            pause: {
                let (from, to): (i64, i64) = (next(&mut parts)?, next(&mut parts)?);
                (from >= 0).then_some((from, (to >= 0).then_some(to)))
            },
            bucket_ms: next::<i64>(&mut parts)?.max(1),
            served_at_ms: next(&mut parts)?,
        }),
    ))
}

/// A room log entry, `at_ms:served`.
fn parse_log_entry(entry: &str) -> Result<(i64, f64), SaleError> {
    let mut parts = entry.split(':');
    let at = parts.next().and_then(|a| a.parse::<i64>().ok());
    let served = parts
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite());
    match (at, served) {
        (Some(at), Some(served)) => Ok((at, served)),
        _ => Err(SaleError::Corrupt(format!("room log entry {entry:?}"))),
    }
}

/// A fractional figure the script sends as text.
fn fraction(text: String, what: &str) -> Result<f64, SaleError> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| SaleError::Corrupt(format!("room {what} {text:?}")))
}

fn text(v: Option<impl ToString>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

pub(super) fn next<T: FromRedisValue>(
    parts: &mut impl Iterator<Item = Value>,
) -> Result<T, SaleError> {
    let v = parts
        .next()
        .ok_or_else(|| SaleError::Corrupt("a short reply from a room script".into()))?;
    T::from_redis_value(v).map_err(|e: ParsingError| SaleError::Redis(e.into()))
}
