//! A sale's stream as the workers' consumer group uses it ([`SaleStream`]):
//! the consumer-group commands, each on one sale's keys only (one cluster
//! slot per command), each bounded by the Redis timeout.

use std::collections::HashMap;
use std::time::Duration;

use redis::streams::{
    StreamInfoGroupsReply, StreamPendingCountReply, StreamPendingReply, StreamReadOptions,
    StreamTrimOptions, StreamTrimmingMode,
};
use std::sync::LazyLock;

use redis::{AsyncCommands, RedisResult, Script, aio::ConnectionLike};

use super::conn::Redis;
use super::entry::Entry;
use super::keys::GROUP;
use super::keys::SaleKeys;
use super::types::SaleError;

/// One sale's stream, for one consumer of its group.
#[derive(Clone)]
pub struct SaleStream {
    redis: Redis,
    keys: SaleKeys,
    consumer: String,
}

impl SaleStream {
    pub(super) fn new(redis: Redis, keys: SaleKeys, consumer: &str) -> Self {
        Self {
            redis,
            keys,
            consumer: consumer.to_owned(),
        }
    }

    /// Up to `count` entries from `from` (`>`: new ones; an id: this
    /// consumer's own pending ones), without waiting.
    pub async fn read_now(&self, from: &str, count: usize) -> Result<Vec<Entry>, SaleError> {
        let mut conn = self.redis.shared().await?;
        let read = read(&mut conn, &self.keys, &self.consumer, from, count, None);
        self.redis.bounded(read).await
    }

    /// Up to `count` entries, waiting up to `block` for new ones on a pooled
    /// connection of its own; `None` when no pooled connection was free
    /// within `pool_wait` (then nothing was read).
    pub async fn read_waiting(
        &self,
        from: &str,
        count: usize,
        block: Duration,
        pool_wait: Duration,
    ) -> Result<Option<Vec<Entry>>, SaleError> {
        let Ok(Ok(mut conn)) = tokio::time::timeout(pool_wait, self.redis.pool().get()).await
        else {
            return Ok(None);
        };
        let read = read(
            &mut *conn,
            &self.keys,
            &self.consumer,
            from,
            count,
            Some(block),
        );
        // The block time comes on top of the usual bound.
        let bound = self.redis.timeout() + block;
        match tokio::time::timeout(bound, read).await {
            Ok(r) => Ok(Some(r.map_err(SaleError::from)?)),
            Err(_) => Err(SaleError::Timeout(bound)),
        }
    }

    /// `XACK`s `ids`.
    pub async fn ack(&self, ids: &[&str]) -> Result<u64, SaleError> {
        let mut conn = self.redis.shared().await?;
        self.redis.bounded(ack(&mut conn, &self.keys, ids)).await
    }

    /// Takes over entries idle for at least `min_idle`, from `start`.
    pub async fn autoclaim(
        &self,
        min_idle: Duration,
        start: &str,
        count: usize,
    ) -> Result<Claimed, SaleError> {
        let mut conn = self.redis.shared().await?;
        let call = autoclaim(
            &mut conn,
            &self.keys,
            &self.consumer,
            min_idle,
            start,
            count,
        );
        self.redis.bounded(call).await
    }

    /// Delivery counts of this consumer's pending entries between two ids.
    pub async fn deliveries(
        &self,
        first: &str,
        last: &str,
        count: usize,
    ) -> Result<HashMap<String, u64>, SaleError> {
        let mut conn = self.redis.shared().await?;
        let call = deliveries(&mut conn, &self.keys, &self.consumer, first, last, count);
        self.redis.bounded(call).await
    }

    /// Moves `entry` to dead letters and acks it, in one script.
    pub async fn dead_letter(
        &self,
        entry: &Entry,
        reason: &str,
        delivered: u64,
    ) -> Result<(), SaleError> {
        let mut conn = self.redis.shared().await?;
        let call = dead_letter(&mut conn, &self.keys, entry, reason, delivered);
        self.redis.bounded(call).await
    }

    /// Asks to sleep until the sale's bell (`drain_sleep.lua`): true when
    /// the group had nothing pending and nothing undelivered, and the sale's
    /// next order will ring; false when something waits.
    pub async fn sleep(&self) -> Result<bool, SaleError> {
        let mut conn = self.redis.shared().await?;
        let mut call = DRAIN_SLEEP.key(&self.keys.sale);
        call.key(&self.keys.orders).arg(GROUP);
        Ok(self
            .redis
            .bounded(call.invoke_async::<i64>(&mut conn))
            .await?
            == 1)
    }

    /// Trims acked entries older than `retention` (see [`trim`]).
    pub async fn trim(&self, retention: Duration) -> Result<u64, SaleError> {
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(trim(&mut conn, &self.keys, retention))
            .await
    }
}

/// `XREADGROUP GROUP persist <consumer> COUNT n [BLOCK ms] STREAMS <orders> <from>`:
/// `from` is `>` for new entries or an id to re-read this consumer's own pending ones.
async fn read(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    consumer: &str,
    from: &str,
    count: usize,
    block: Option<Duration>,
) -> RedisResult<Vec<Entry>> {
    let mut opts = StreamReadOptions::default()
        .group(GROUP, consumer)
        .count(count);
    if let Some(block) = block {
        opts = opts.block(block.as_millis() as usize);
    }
    // Decoded by hand: the generic StreamReadReply builds a HashMap of
    // `Value`s per entry, several times the cost of this (see BENCHMARKS.md).
    let reply: redis::Value = conn.xread_options(&[&keys.orders], &[from], &opts).await?;
    Ok(Entry::decode_read(reply)?)
}

async fn ack(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    ids: &[&str],
) -> RedisResult<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    conn.xack(&keys.orders, GROUP, ids).await
}

/// What one `XAUTOCLAIM` call took over.
pub struct Claimed {
    /// Where the next call starts; `0-0` once the whole pending list was scanned.
    pub next: String,
    pub entries: Vec<Entry>,
    /// Pending ids whose entries no longer exist (Redis dropped them from the list).
    pub deleted: Vec<String>,
}

/// `XAUTOCLAIM`: takes over entries idle for at least `min_idle`, from `start`.
async fn autoclaim(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    consumer: &str,
    min_idle: Duration,
    start: &str,
    count: usize,
) -> RedisResult<Claimed> {
    let (next, entries, deleted): (String, redis::Value, Vec<String>) = redis::cmd("XAUTOCLAIM")
        .arg(&keys.orders)
        .arg(GROUP)
        .arg(consumer)
        .arg(min_idle.as_millis() as u64)
        .arg(start)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(Claimed {
        next,
        entries: Entry::decode_list(entries)?,
        deleted,
    })
}

/// Delivery counts of `consumer`'s pending entries between two ids.
async fn deliveries(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    consumer: &str,
    first: &str,
    last: &str,
    count: usize,
) -> RedisResult<HashMap<String, u64>> {
    let reply: StreamPendingCountReply = conn
        .xpending_consumer_count(&keys.orders, GROUP, first, last, count, consumer)
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .map(|p| (p.id, p.times_delivered as u64))
        .collect())
}

static DRAIN_SLEEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/drain_sleep.lua")));
static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/dead_letter.lua")));

/// Moves an entry to the sale's dead-letter stream and acks it, in one
/// script: the copy is written before the original is released.
async fn dead_letter(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    entry: &Entry,
    reason: &str,
    deliveries: u64,
) -> RedisResult<()> {
    let mut call = DEAD_LETTER.key(&keys.orders);
    call.key(&keys.dead).arg(GROUP).arg(&entry.id);
    for (field, value) in &entry.fields {
        call.arg(field).arg(value);
    }
    call.arg("dead_reason")
        .arg(reason)
        .arg("dead_source_id")
        .arg(&entry.id)
        .arg("dead_deliveries")
        .arg(deliveries);
    call.invoke_async::<String>(conn).await.map(|_| ())
}

/// A stream id as a comparable pair.
fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The lowest stream id to keep (`XTRIM MINID`): nothing pending, nothing
/// not yet delivered (above `delivered`), nothing younger than `retention`
/// by the Redis clock (`now_ms`).
fn trim_bound(
    delivered: (u64, u64),
    oldest_pending: Option<(u64, u64)>,
    now_ms: u64,
    retention: Duration,
) -> (u64, u64) {
    let mut bound = (delivered.0, delivered.1.saturating_add(1));
    if let Some(oldest) = oldest_pending {
        bound = bound.min(oldest);
    }
    bound.min((now_ms.saturating_sub(retention.as_millis() as u64), 0))
}

/// Trims entries that are acknowledged AND older than `retention`; never an
/// entry that is pending or not yet delivered. Returns the entries removed.
async fn trim(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    retention: Duration,
) -> RedisResult<u64> {
    // Order matters: the group's last delivered id first, the pending list
    // second. An entry delivered between the two reads is newer than that id,
    // so it is above the bound either way.
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(&keys.orders).await?;
    let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
        return Ok(0);
    };
    let Some(delivered) = parse_id(&group.last_delivered_id) else {
        return Ok(0);
    };
    let pending: StreamPendingReply = conn.xpending(&keys.orders, GROUP).await?;
    let (now_s, now_us): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let now_ms = now_s * 1000 + now_us / 1000;

    let oldest_pending = match &pending {
        StreamPendingReply::Data(p) => parse_id(&p.start_id),
        _ => None,
    };
    let bound = trim_bound(delivered, oldest_pending, now_ms, retention);
    let opts = StreamTrimOptions::minid(
        StreamTrimmingMode::Exact,
        format!("{}-{}", bound.0, bound.1),
    );
    conn.xtrim_options(&keys.orders, &opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn the_trim_keeps_everything_pending_undelivered_or_recent() {
        let now = 10 * 3_600_000;
        // All delivered and acked, long ago: up to the last delivered one.
        assert_eq!(trim_bound((1000, 4), None, now, HOUR), (1000, 5));
        // A pending entry holds everything from it on.
        assert_eq!(trim_bound((1000, 4), Some((900, 2)), now, HOUR), (900, 2));
        // Retention holds the last hour, acked or not.
        let recent = now - 60_000;
        assert_eq!(
            trim_bound((recent, 0), None, now, HOUR),
            (now - 3_600_000, 0)
        );
        // A clock before the retention trims nothing rather than wrapping.
        assert_eq!(trim_bound((5, 0), None, 1000, HOUR), (0, 0));
        assert_eq!(parse_id("1700000000000-7"), Some((1_700_000_000_000, 7)));
        assert_eq!(parse_id("nonsense"), None);
    }
}
