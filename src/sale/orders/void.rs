//! With `REDIS_WAIT_REPLICAS`: a call's orders and their `WAIT` on a
//! connection of their own, and each order its replicas did not confirm
//! taken back (`void_order.lua`), so that a 503 never reaches the books.

use redis::{ParsingError, RedisResult, aio::ConnectionLike};

use super::place::{OrderCall, PlaceReply, place_orders_and_wait};
use crate::config::ReplicaWait;
use crate::domain::{Chain, OrderId, ProductId};
use crate::sale::conn::Conn;
use crate::sale::core::Core;
use crate::sale::error::SaleError;
use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;
use crate::sale::wait::confirmed;

/// The order script and its WAIT on a connection to themselves (WAIT
/// blocks it, and counts that connection's own writes). A 202, first
/// answer or replay, only once the replicas have the order: a failover
/// must not lose an acknowledged one.
pub(super) async fn place_and_wait(
    core: &Core,
    product: &ProductId,
    orders: &[OrderCall],
    wait: ReplicaWait,
) -> Result<Vec<Result<PlaceReply, SaleError>>, SaleError> {
    let mut pooled = core.alone().await?;
    let keys = core.keys(product);
    let placed = core
        .redis
        .bounded(place_orders_and_wait(
            &mut pooled,
            &core.prefix,
            product,
            orders,
            wait,
        ))
        .await;
    let (replies, acked) = match placed {
        Ok(placed) => placed,
        Err(e) if e.is_timeout() => {
            // No answer in time: the script may have placed the orders,
            // which the replicas may lack. Each is taken back on the same
            // connection, after the call (a connection's commands run in
            // order): one the script placed is voided (or found claimed by
            // a worker after its WAIT: the replicas have it, and a retry
            // with its key gets the 202), one it did not is unknown. So the
            // 503 says what happened (seen under load: an order answered
            // 503 persisted once the replica came back). All within one
            // more Redis timeout past the WAIT's own (the WAIT holds the
            // connection until then): what is not taken back by then
            // stands, as when Redis does not answer a void.
            let behind_the_call = async {
                // A read in the sale's hash slot, sent behind the call: its
                // answer comes once the WAIT is over (asked again while the
                // client's own timeout cuts it short).
                loop {
                    let read: RedisResult<Option<i64>> = redis::cmd("GET")
                        .arg(&keys.stock)
                        .query_async(&mut *pooled)
                        .await;
                    match read {
                        Ok(_) => return true,
                        Err(e) if e.is_timeout() => continue,
                        Err(_) => return false,
                    }
                }
            };
            let bound = wait.timeout + core.redis.timeout();
            if tokio::time::timeout(bound, behind_the_call).await == Ok(true) {
                let until = tokio::time::Instant::now() + bound;
                let take_back = async {
                    for order in orders {
                        void(core, &mut pooled, &keys, (product, order), until).await;
                    }
                };
                // (A void cut short by the client's timeout is asked again,
                // within the same bound: see `void`.)
                let _ = tokio::time::timeout(bound, take_back).await;
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let confirmed = confirmed(wait, acked);
    let until = tokio::time::Instant::now() + wait.timeout + core.redis.timeout();
    let mut answers = Vec::with_capacity(replies.len());
    for (reply, order) in replies.into_iter().zip(orders) {
        answers.push(match (&reply, &confirmed) {
            (
                PlaceReply::Rejected(_) | PlaceReply::OutsideWindow { .. } | PlaceReply::Shards(_),
                _,
            )
            | (_, Ok(())) => Ok(reply),
            (PlaceReply::Replayed { .. }, Err(e)) => Err(e.clone()),
            // A 503 for a new order: take it back, so that it never
            // reaches the books unless a later answer is a 202. (Unless
            // a worker claimed it meanwhile, after its own WAIT: then
            // the replicas have it after all.)
            (PlaceReply::Accepted { .. }, Err(e)) => {
                match void(core, &mut pooled, &keys, (product, order), until).await {
                    Some(Voided::Claimed) => Ok(reply),
                    _ => Err(e.clone()),
                }
            }
        });
    }
    Ok(answers)
}

/// Takes back an order whose WAIT failed (see `lua/void_order.lua`), on
/// the connection that placed it, asked again while the client's own
/// timeout cuts it short until `until` (`void_order.lua` is idempotent: a
/// cluster client reconnecting to a frozen node holds the connection for
/// a while, seen under load); `None` when Redis did not answer by then
/// (the order then stands, like one a keyed retry answered: see the docs).
async fn void(
    core: &Core,
    conn: &mut Conn,
    keys: &SaleKeys,
    (product, order): (&ProductId, &OrderCall),
    until: tokio::time::Instant,
) -> Option<Voided> {
    let order_id = &order.order_id;
    let field = order.idempotency_field();
    let voided = loop {
        let voided = core
            .redis
            .bounded(void_order(conn, keys, order_id, field.as_deref()))
            .await;
        match voided {
            Err(ref e) if e.is_timeout() && tokio::time::Instant::now() < until => continue,
            voided => break voided,
        }
    };
    match voided {
        Ok(Voided::Void) => {
            core.memory
                .released(&product.sale(), Some(order.user_id.get()));
            tracing::info!(order_id = %order_id, "order not confirmed by the replicas: voided");
        }
        Ok(Voided::Claimed) => {}
        Ok(other) => {
            tracing::warn!(order_id = %order_id, outcome = ?other, "unconfirmed order not voided; it stands");
        }
        Err(ref e) => {
            tracing::warn!(order_id = %order_id, error = %Chain(e), "unconfirmed order not voided; it stands");
        }
    }
    voided.ok()
}

script!(VOID_ORDER, "void_order");

/// What `void_order.lua` did with an order whose WAIT failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voided {
    /// Taken back: it will never be persisted.
    Void,
    /// A worker claimed it after its own WAIT: the replicas have it.
    Claimed,
    /// A keyed retry answered it since: it stands.
    Replayed,
    /// This Redis does not know the order (a failover lost it).
    Unknown,
}

/// `void_order.lua`.
pub async fn void_order(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    order_id: &OrderId,
    idempotency_field: Option<&str>,
) -> RedisResult<Voided> {
    let reply: String = VOID_ORDER
        .key(&keys.accepted)
        .key(&keys.void)
        .key(&keys.claimed)
        .key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.idem)
        .arg(order_id.as_str())
        .arg(idempotency_field.unwrap_or(""))
        .invoke_async(conn)
        .await?;
    Ok(match reply.as_str() {
        "void" => Voided::Void,
        "claimed" => Voided::Claimed,
        "replayed" => Voided::Replayed,
        "unknown" => Voided::Unknown,
        other => {
            return Err(ParsingError::from(format!("unknown void_order reply {other:?}")).into());
        }
    })
}
