//! The workers' side of the sales' streams: [`Streams`] hands out
//! [`SaleStream`], one sale's stream for one consumer of its group, with
//! the consumer-group commands (read, ack, reclaim, dead letters, the
//! claim before a batch is persisted, sleeping until the sale's bell),
//! each on one sale's keys only (one cluster slot per command), each
//! bounded by the Redis timeout. What wakes a sleeping drain is [`bells`];
//! an entry's shape is [`entry`].

pub mod bells;
mod claim;
pub mod entry;
mod trim;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamPendingCountReply, StreamReadOptions};
use redis::{AsyncCommands, RedisResult, aio::ConnectionLike};

use super::core::Core;
use super::error::SaleError;
use super::keys::{GROUP, SaleKeys};
use super::lua::script;
use super::wait::{confirmed, then_wait};
use crate::domain::ProductId;
use entry::Entry;

/// The sales' streams, for the workers.
#[derive(Clone)]
pub struct Streams {
    core: Arc<Core>,
}

impl Streams {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// The books' MySQL server the workers last persisted to, as
    /// [`store::Db::server_identity`](crate::store::Db::server_identity)
    /// names it (`<prefix>:books:server`, one key for every sale): a
    /// change is a failover of the books.
    pub async fn books_server(&self) -> Result<Option<String>, SaleError> {
        let key = self.books_server_key();
        self.core
            .call(|mut c| async move { c.get(&key).await })
            .await
    }

    /// Records the books' server ([`Self::books_server`]).
    pub async fn set_books_server(&self, identity: &str) -> Result<(), SaleError> {
        let key = self.books_server_key();
        self.core
            .call(|mut c| async move { c.set(&key, identity).await })
            .await
    }

    /// `<prefix>:books:server`: one key for every sale (no hash tag).
    fn books_server_key(&self) -> String {
        format!("{}:books:server", self.core.prefix)
    }

    /// One sale's stream, for consumer `consumer` of its group.
    pub fn stream(&self, product: &ProductId, consumer: &str) -> SaleStream {
        SaleStream {
            keys: self.core.keys(product),
            core: self.core.clone(),
            consumer: consumer.to_owned(),
        }
    }
}

/// One sale's stream, for one consumer of its group.
#[derive(Clone)]
pub struct SaleStream {
    core: Arc<Core>,
    keys: SaleKeys,
    consumer: String,
}

impl SaleStream {
    /// Up to `count` entries from `from` (`>`: new ones; an id: this
    /// consumer's own pending ones), without waiting.
    pub async fn read_now(&self, from: &str, count: usize) -> Result<Vec<Entry>, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        let read = read(&mut conn, &self.keys, &self.consumer, from, count, None);
        self.core.redis.bounded(read).await
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
        let Ok(Ok(mut conn)) = tokio::time::timeout(pool_wait, self.core.redis.pool().get()).await
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
        let bound = self.core.redis.timeout() + block;
        match tokio::time::timeout(bound, read).await {
            Ok(r) => Ok(Some(r.map_err(SaleError::from)?)),
            Err(_) => Err(SaleError::Timeout(bound)),
        }
    }

    /// Up to `count` retained entries after `after` (`XRANGE (after +`),
    /// acked or not: what a repair reads again.
    pub async fn range(&self, after: &str, count: usize) -> Result<Vec<Entry>, SaleError> {
        self.xrange(&self.keys.orders, after, count).await
    }

    /// Up to `count` of the sale's dead letters, oldest first, after
    /// `after` (`XRANGE` of `fs:{sku}:dead`): what the repair tries to take
    /// home.
    pub async fn dead_letters(&self, after: &str, count: usize) -> Result<Vec<Entry>, SaleError> {
        self.xrange(&self.keys.dead, after, count).await
    }

    /// `XRANGE key (after + COUNT count`, decoded.
    async fn xrange(&self, key: &str, after: &str, count: usize) -> Result<Vec<Entry>, SaleError> {
        let from = format!("({after}");
        self.core
            .call(|mut c| async move {
                let reply: redis::Value = redis::cmd("XRANGE")
                    .arg(key)
                    .arg(&from)
                    .arg("+")
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut c)
                    .await?;
                Ok(Entry::decode_list(reply)?)
            })
            .await
    }

    /// Removes dead letters whose orders are in the books now (`XDEL`).
    pub async fn forget_dead_letters(&self, ids: &[&str]) -> Result<u64, SaleError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let key = &self.keys.dead;
        self.core
            .call(|mut c| async move {
                redis::cmd("XDEL")
                    .arg(key)
                    .arg(ids)
                    .query_async::<u64>(&mut c)
                    .await
            })
            .await
    }

    /// `XACK`s `ids`.
    pub async fn ack(&self, ids: &[&str]) -> Result<u64, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        self.core
            .redis
            .bounded(ack(&mut conn, &self.keys, ids))
            .await
    }

    /// Takes over entries idle for at least `min_idle`, from `start`.
    pub async fn autoclaim(
        &self,
        min_idle: Duration,
        start: &str,
        count: usize,
    ) -> Result<Claimed, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        let call = autoclaim(
            &mut conn,
            &self.keys,
            &self.consumer,
            min_idle,
            start,
            count,
        );
        self.core.redis.bounded(call).await
    }

    /// Delivery counts of this consumer's pending entries between two ids.
    pub async fn deliveries(
        &self,
        first: &str,
        last: &str,
        count: usize,
    ) -> Result<HashMap<String, u64>, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        let call = deliveries(&mut conn, &self.keys, &self.consumer, first, last, count);
        self.core.redis.bounded(call).await
    }

    /// Moves `entry` to dead letters and acks it, in one script.
    pub async fn dead_letter(
        &self,
        entry: &Entry,
        reason: &str,
        delivered: u64,
    ) -> Result<(), SaleError> {
        let mut conn = self.core.redis.shared().await?;
        let call = dead_letter(&mut conn, &self.keys, entry, reason, delivered);
        self.core.redis.bounded(call).await
    }

    /// Before a worker persists a batch: raises the sale's claimed mark to
    /// `last_entry` (no order up to it can be voided from now on) and
    /// returns the batch's orders that were voided, to be acked without a
    /// row. Call it after [`Self::confirm_replicated`].
    pub async fn claim(
        &self,
        last_entry: &str,
        order_ids: &[&str],
    ) -> Result<Vec<String>, SaleError> {
        let keys = &self.keys;
        self.core
            .call(|mut c| async move { claim::claim_batch(&mut c, keys, last_entry, order_ids).await })
            .await
    }

    /// With WAIT configured: returns once the replicas hold everything
    /// written to the sale so far (its stream entries included), else
    /// `NotReplicated`. A write to the sale's slot and a WAIT behind it, on
    /// a connection of their own. The workers call it before persisting a
    /// batch: MySQL must never hold an order that a promoted replica would
    /// not know (it would sell the units again).
    pub async fn confirm_replicated(&self) -> Result<(), SaleError> {
        let Some(wait) = self.core.wait else {
            return Ok(());
        };
        let keys = &self.keys;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.replicated)
            .arg(crate::domain::now_ms())
            .arg("PX")
            .arg(60_000);
        let mut pooled = self.core.alone().await?;
        let (_, acked) = self
            .core
            .redis
            .bounded(then_wait(&mut pooled, &keys.orders, pipe, wait))
            .await?;
        confirmed(wait, acked)
    }

    /// Asks to sleep until the sale's bell (`drain_sleep.lua`): true when
    /// the group had nothing pending and nothing undelivered, and the sale's
    /// next order will ring; false when something waits.
    pub async fn sleep(&self) -> Result<bool, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        let mut call = DRAIN_SLEEP.key(&self.keys.sale);
        call.key(&self.keys.orders).arg(GROUP);
        Ok(self
            .core
            .redis
            .bounded(call.invoke_async::<i64>(&mut conn))
            .await?
            == 1)
    }

    /// Trims acked entries older than `retention` (see [`trim`]).
    pub async fn trim(&self, retention: Duration) -> Result<u64, SaleError> {
        let mut conn = self.core.redis.shared().await?;
        self.core
            .redis
            .bounded(trim::trim(&mut conn, &self.keys, retention))
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
    // `Value`s per entry, several times the cost of this (BENCHMARKS.md, "What does
    // persisting cost?").
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

script!(DRAIN_SLEEP, "drain_sleep");
script!(DEAD_LETTER, "dead_letter");

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
