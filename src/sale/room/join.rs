//! `room_join.lua`: a buyer joins a sale's waiting room once (joining
//! again gives the same number back), and its reply decoded.

use redis::{FromRedisValue, RedisResult, Value, aio::ConnectionLike};

use super::pass::Number;
use super::pow;
use super::tick::next;
use crate::domain::UserId;
use crate::sale::error::SaleError;
use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

/// What joining did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// In the line with this ticket (`new`: false when the buyer had joined before).
    Ticket {
        ticket: String,
        new: bool,
    },
    NoSale,
    NoRoom,
    /// The room opens at `opens_ms` (epoch ms).
    NotOpen {
        opens_ms: i64,
    },
    Ended,
    SoldOut,
    /// The room asks a proof of work of `difficulty` bits, and this join's
    /// is missing, stale or short.
    ProofRefused {
        refused: pow::ProofRefused,
        difficulty: u8,
    },
}

script!(JOIN, "room_join");

/// What `room_join.lua` answered.
pub(super) enum Reply {
    /// In the line with this number (`new`: false when joined before).
    Joined { number: Number, new: bool },
    /// No place in the line: the answer as it stands.
    Other(Joined),
}

pub(super) async fn join(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    user_id: UserId,
    elsewhere: i64,
) -> RedisResult<Value> {
    JOIN.key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.room)
        .key(&keys.joined)
        .arg(user_id)
        .arg(elsewhere)
        .invoke_async(conn)
        .await
}

pub(super) fn decode(reply: Value) -> Result<Reply, SaleError> {
    let parts = Vec::<Value>::from_redis_value(reply).map_err(redis::RedisError::from)?;
    let mut parts = parts.into_iter();
    let status: String = next(&mut parts)?;
    Ok(Reply::Other(match status.as_str() {
        "joined" => {
            let text: String = next(&mut parts)?;
            let new: i64 = next(&mut parts)?;
            let number = Number::parse(&text)
                .ok_or_else(|| SaleError::Corrupt(format!("room number {text:?}")))?;
            return Ok(Reply::Joined {
                number,
                new: new == 1,
            });
        }
        "no_sale" => Joined::NoSale,
        "no_room" => Joined::NoRoom,
        "not_open" => Joined::NotOpen {
            opens_ms: next(&mut parts)?,
        },
        "ended" => Joined::Ended,
        "sold_out" => Joined::SoldOut,
        other => return Err(SaleError::Corrupt(format!("room_join status {other:?}"))),
    }))
}
