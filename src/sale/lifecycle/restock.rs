//! Adding units to an open sale, or taking some away (`restock.lua`).

use redis::{ParsingError, RedisResult, Value, aio::ConnectionLike};

use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

script!(RESTOCK, "restock");

/// What a restock came to in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestockAnswer {
    /// Redis does not have the sale.
    NoSale,
    /// Past its end.
    Ended,
    /// Taking away more units than are left (`left`).
    TooFew { left: u64 },
    /// The stock and the sale's `initial` now; `applied`: this call moved
    /// them (false: this restock was done before).
    Done {
        stock: i64,
        initial: i64,
        applied: bool,
    },
}

/// Who asks for a restock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestockBy {
    /// An operator, on an open sale.
    Operator,
    /// The reconciler, putting back one the books hold and Redis lost:
    /// past the end too, whatever is left, counted as repaired.
    PutBack,
}

/// `restock.lua`: `units` (signed) once per `id`.
pub async fn restock(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    units: i64,
    id: &str,
    by: RestockBy,
) -> RedisResult<RestockAnswer> {
    let reply: Vec<Value> = RESTOCK
        .key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.restocks)
        .key(&keys.repaired)
        .arg(units)
        .arg(id)
        .arg(match by {
            RestockBy::Operator => "",
            RestockBy::PutBack => "again",
        })
        .invoke_async(conn)
        .await?;
    let mut parts = reply.into_iter();
    let status: String = match parts.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => return Err(ParsingError::from("an empty restock reply").into()),
    };
    let mut int = || -> RedisResult<i64> {
        match parts.next() {
            Some(v) => Ok(redis::from_redis_value(v)?),
            None => Err(ParsingError::from("a short restock reply").into()),
        }
    };
    Ok(match status.as_str() {
        "no_sale" => RestockAnswer::NoSale,
        "ended" => RestockAnswer::Ended,
        "too_few" => RestockAnswer::TooFew {
            left: u64::try_from(int()?).unwrap_or(0),
        },
        "done" => RestockAnswer::Done {
            stock: int()?,
            initial: int()?,
            applied: int()? == 1,
        },
        other => return Err(ParsingError::from(format!("restock reply {other:?}")).into()),
    })
}
