//! Durability of a write: with `REDIS_WAIT_REPLICAS`, a write counts only
//! once that many replicas have it. A write and its `WAIT` go as one
//! pipeline on a connection of the caller's own, to the master that ran the
//! write (see [`then_wait`]).

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Pipeline, RedisResult, Value};

use super::conn::Conn;
use super::error::SaleError;
use crate::config::ReplicaWait;

/// `NotReplicated` when fewer than `wait.replicas` acknowledged the writes.
pub fn confirmed(wait: ReplicaWait, acked: u32) -> Result<(), SaleError> {
    if acked < wait.replicas {
        return Err(SaleError::NotReplicated {
            acked,
            wanted: wait.replicas,
        });
    }
    Ok(())
}

/// Runs the one call in `pipe`, then `WAIT`, as one pipeline on one
/// connection to the master that holds `key`; returns the call's reply (an
/// error reply as `Err`) and how many replicas acknowledged. Sent together,
/// the WAIT runs right after the call, on the node the call ran on, and
/// counts the replicas that have everything this connection wrote, the
/// call's writes included. (Routed on its own, a WAIT could reach another
/// node mid-failover, which would answer at once for writes it never saw.)
pub async fn then_wait(
    conn: &mut Conn,
    key: &str,
    mut pipe: Pipeline,
    wait: ReplicaWait,
) -> redis::RedisResult<(Value, u32)> {
    use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
    pipe.cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout.as_millis() as u64);
    let replies = match conn {
        Conn::Cluster(c) => {
            let route = Route::with_key(key, SlotAddr::Master);
            c.route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::SpecificNode(route))
                .await?
        }
        other => other.req_packed_commands(&pipe, 0, 2).await?,
    };
    let [reply, acked]: [Value; 2] = replies
        .try_into()
        .map_err(|_| redis::ParsingError::from("a call and a WAIT give two replies"))?;
    let acked = redis::FromRedisValue::from_redis_value(acked.extract_error()?)?;
    Ok((reply.extract_error()?, acked))
}

/// A script call, then `WAIT`, as one pipeline to the master holding `key`
/// (one of the script's keys); see [`then_wait`].
pub(crate) async fn invoke_and_wait<T: FromRedisValue>(
    conn: &mut Conn,
    key: &str,
    call: &redis::ScriptInvocation<'_>,
    wait: ReplicaWait,
) -> RedisResult<(T, u32)> {
    let pipe = || {
        let mut pipe = redis::pipe();
        pipe.invoke_script(call);
        pipe
    };
    pipe_and_wait(
        conn,
        key,
        pipe,
        async |c: &mut Conn| call.load_async(c).await,
        wait,
    )
    .await
}

/// A pipeline of one script call (`pipe` makes it), then `WAIT`; `load`
/// loads the script when the node answers NOSCRIPT (a pipeline does not load
/// it by itself: after a restart, or a failover to a node that never ran it).
pub(crate) async fn pipe_and_wait<T: FromRedisValue>(
    conn: &mut Conn,
    key: &str,
    pipe: impl Fn() -> redis::Pipeline,
    load: impl AsyncFnOnce(&mut Conn) -> RedisResult<String>,
    wait: ReplicaWait,
) -> RedisResult<(T, u32)> {
    let (reply, acked) = match then_wait(conn, key, pipe(), wait).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            load(conn).await?;
            then_wait(conn, key, pipe(), wait).await?
        }
        other => other?,
    };
    Ok((T::from_redis_value(reply)?, acked))
}
