//! What only the benchmarks and the tests use of the library's insides,
//! behind the `bench` feature (off in a normal build, so the service's
//! public surface is what a service needs): the order script on a
//! connection of the caller's choosing, the raw MySQL pool, a bulk insert
//! into another table, the node holding a key, a bearer token verified as
//! a request would be.

use redis::Value;
use sqlx::MySqlPool;

use crate::domain::PendingOrder;
use crate::http::auth::Auth;
use crate::http::error::ApiError;
pub use crate::sale::{OrderCall, PlaceReply, place_orders_on};
use crate::sale::{Pool, Redis, SaleError};
use crate::store::{Db, StoreError};

/// The pool of dedicated connections below a Redis handle.
pub fn blocking_pool(redis: &Redis) -> &Pool {
    redis.pool()
}

/// The MySQL pool below the books (for queries of the benchmarks' own).
pub fn pool(db: &Db) -> &MySqlPool {
    db.pool()
}

/// Inserts `orders` into `table` (same columns as `tb_order`) in one
/// statement, as a worker's batch would be: the drain bench's baseline.
pub async fn insert_orders_raw(
    db: &Db,
    table: &str,
    orders: &[PendingOrder],
) -> Result<u64, StoreError> {
    db.orders().insert_orders_raw(table, orders).await
}

/// The user a bearer token (without `Bearer `) names, as a request
/// carrying it would be identified: the cache, else verifying.
pub fn identify_bearer(auth: &Auth, token: &str) -> Result<crate::domain::UserId, ApiError> {
    auth.identify_bearer(token)
}

/// The server holding `key`: `host:port` of its slot's master on a
/// cluster (from `CLUSTER KEYSLOT` and `CLUSTER SLOTS`), `single` otherwise.
pub async fn node_of(server: &Redis, key: &str) -> Result<String, SaleError> {
    if !server.is_cluster() {
        return Ok("single".into());
    }
    let mut conn = server.shared().await?;
    let slot: i64 = server
        .bounded(
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut conn),
        )
        .await?;
    let ranges: Vec<Value> = server
        .bounded(redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn))
        .await?;
    let int = |v: &Value| match v {
        Value::Int(n) => *n,
        _ => -1,
    };
    for range in ranges {
        if let Value::Array(parts) = range
            && parts.len() > 2
            && int(&parts[0]) <= slot
            && slot <= int(&parts[1])
            && let Value::Array(node) = &parts[2]
            && node.len() > 1
        {
            let host: String = redis::FromRedisValue::from_redis_value(node[0].clone())
                .map_err(redis::RedisError::from)?;
            return Ok(format!("{host}:{}", int(&node[1])));
        }
    }
    Err(SaleError::Corrupt(format!("no master serves slot {slot}")))
}
