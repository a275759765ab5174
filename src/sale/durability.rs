//! Whether Redis keeps accepted orders across a restart. Until a worker has
//! committed them, accepted orders exist only in Redis (the sale's stream):
//! without the append-only file, a Redis restart forgets them, and buyers
//! who got a 202 lose their order. `serve` and `worker` check at start and
//! warn loudly (they still start: a test or a deliberately volatile setup
//! may want that).

use std::time::Duration;

use redis::Value;

use super::conn::Redis;
use super::error::SaleError;
use crate::domain::{Chain, backoff};

/// What is risky in Redis's persistence settings; empty when AOF is on with
/// fsync `everysec` or `always`.
pub async fn persistence_risks(redis: &Redis) -> Result<Vec<String>, SaleError> {
    let appendonly = config_get(redis, "appendonly").await?;
    let appendfsync = config_get(redis, "appendfsync").await?;
    let mut risks = Vec::new();
    if appendonly.as_deref() != Some("yes") {
        risks.push(format!(
            "Redis runs without the append-only file (appendonly {}): orders accepted but not yet persisted to MySQL are LOST if Redis restarts; set `appendonly yes` and `appendfsync everysec`",
            appendonly.as_deref().unwrap_or("?")
        ));
    } else if appendfsync.as_deref() == Some("no") {
        risks.push(
            "Redis writes its append-only file without fsync (appendfsync no): a host crash can lose the last ~30 s of accepted orders; set `appendfsync everysec`"
                .to_owned(),
        );
    }
    Ok(risks)
}

/// `CONFIG GET name` (the first node's answer on a cluster).
async fn config_get(redis: &Redis, name: &str) -> Result<Option<String>, SaleError> {
    let mut conn = redis.shared().await?;
    let reply: Value = redis
        .bounded(
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut conn),
        )
        .await?;
    Ok(first_value(&reply, name))
}

/// The value of `name` in a CONFIG GET reply: a flat array, a map (RESP3),
/// or on a cluster a map of node to one of those.
fn first_value(reply: &Value, name: &str) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| kv.len() == 2 && text(&kv[0]).as_deref() == Some(name))
            .and_then(|kv| text(&kv[1]))
            .or_else(|| items.iter().find_map(|v| first_value(v, name))),
        Value::Map(pairs) => pairs.iter().find_map(|(k, v)| {
            if text(k).as_deref() == Some(name) {
                text(v)
            } else {
                first_value(v, name)
            }
        }),
        _ => None,
    }
}

/// Logs the risks once Redis answers: a Redis that is down at start is asked
/// again with bounded back-off (one log line per failed attempt), so the
/// check is made whenever the process starts before Redis.
pub async fn check_persistence_when_up(redis: &Redis) {
    let last = Duration::from_secs(10);
    let mut waits = backoff::doubling(Duration::from_millis(250), last);
    loop {
        let wait = waits.next().unwrap_or(last);
        match persistence_risks(redis).await {
            Ok(risks) => {
                for risk in risks {
                    tracing::warn!("{risk}");
                }
                return;
            }
            // Answered, but not with the settings (a managed Redis that
            // refuses CONFIG): asking again would not change that.
            Err(e) if !not_up_yet(&e) => {
                tracing::warn!(
                    error = %Chain(&e),
                    "could not check Redis persistence (CONFIG GET); make sure AOF is on (appendonly yes, appendfsync everysec)"
                );
                return;
            }
            Err(e) => tracing::warn!(
                error = %Chain(&e),
                retry_in_ms = wait.as_millis() as u64,
                "Redis does not answer yet: orders get 503 until it does"
            ),
        }
        tokio::time::sleep(wait).await;
    }
}

/// True when `e` says Redis did not answer (down, unreachable, loading,
/// failing over); a refused CONFIG (`NOPERM`) is an answer.
fn not_up_yet(e: &SaleError) -> bool {
    let refused = matches!(e, SaleError::Redis(r)
        if r.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm));
    e.is_unavailable() && !refused
}
