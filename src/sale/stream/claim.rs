//! Claiming a batch before persisting it (`claim_batch.lua`): no order up to
//! its last entry can be voided from then on.

use redis::{RedisResult, aio::ConnectionLike};

use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;

script!(CLAIM_BATCH, "claim_batch");

/// `claim_batch.lua`: the batch's order ids that were voided.
pub async fn claim_batch(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    last_entry: &str,
    order_ids: &[&str],
) -> RedisResult<Vec<String>> {
    CLAIM_BATCH
        .key(&keys.void)
        .key(&keys.claimed)
        .arg(last_entry)
        .arg(order_ids)
        .invoke_async(conn)
        .await
}
