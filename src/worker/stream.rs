//! The consumer-group commands the workers send, each on one sale's keys
//! only (one cluster slot per command).

use std::collections::HashMap;
use std::time::Duration;

use redis::streams::{
    StreamInfoGroupsReply, StreamPendingCountReply, StreamPendingReply, StreamReadOptions,
    StreamTrimOptions, StreamTrimmingMode,
};
use std::sync::LazyLock;

use redis::{AsyncCommands, RedisResult, Script, aio::ConnectionLike};

use crate::sale::Entry;
use crate::sale::SaleKeys;
use crate::sale::keys::GROUP;

/// `XREADGROUP GROUP persist <consumer> COUNT n [BLOCK ms] STREAMS <orders> <from>`:
/// `from` is `>` for new entries or an id to re-read this consumer's own pending ones.
pub async fn read(
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

pub async fn ack(
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
pub async fn autoclaim(
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
pub async fn deliveries(
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

static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/dead_letter.lua")));

/// Moves an entry to the sale's dead-letter stream and acks it, in one
/// script: the copy is written before the original is released.
pub async fn dead_letter(
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

/// Trims entries that are acknowledged AND older than `retention`; never an
/// entry that is pending or not yet delivered. Returns the entries removed.
pub async fn trim(
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

    let mut bound = (delivered.0, delivered.1.saturating_add(1));
    if let StreamPendingReply::Data(p) = &pending
        && let Some(oldest) = parse_id(&p.start_id)
    {
        bound = bound.min(oldest);
    }
    bound = bound.min((now_ms.saturating_sub(retention.as_millis() as u64), 0));
    let opts = StreamTrimOptions::minid(
        StreamTrimmingMode::Exact,
        format!("{}-{}", bound.0, bound.1),
    );
    conn.xtrim_options(&keys.orders, &opts).await
}
