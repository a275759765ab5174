//! The one read model of a sale's stream and its consumer group, for everyone who watches it (the
//! dashboard, `/metrics`, `flashsale streams`, the workers' retirement and
//! books checks): in one pipelined round trip to the sale's node (every key
//! shares the sale's hash tag), the stock and window, the stream and its
//! consumer group, each consumer, the oldest pending entry, the dead
//! letters, the cancel requests and the workers' last verdicts. The oldest
//! pending entries themselves are listed on demand. Read-only, but for the
//! verdicts the workers record beside it.

use std::collections::HashMap;

use std::sync::Arc;

use redis::AsyncCommands;
use redis::streams::{
    StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingCountReply, StreamPendingReply,
};
use redis::{FromRedisValue, RedisResult, Value};
use serde::Serialize;

use super::core::Core;
use super::error::SaleError;
use super::keys::GROUP;
use super::shards;
use crate::domain::ProductId;

/// The watch's handle.
#[derive(Clone)]
pub struct Watch {
    core: Arc<Core>,
}

/// What the books check needs of a sale's stream (see `bookkeeping::live`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Units left (`None`: the sale is not in Redis).
    pub stock: Option<i64>,
    /// Entries the workers have yet to settle: not yet delivered, or
    /// delivered and not acked (`None`: Redis cannot tell, `XINFO GROUPS`
    /// gave no lag).
    pub unsettled: Option<u64>,
    /// Entries in the dead letters.
    pub dead_letters: u64,
}

/// One sale's stream, now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StreamView {
    /// The stream's key and its dead letters' (for `redis-cli`).
    pub stream_key: String,
    pub dead_letter_key: String,
    /// Units left (`None`: the sale is not in Redis).
    pub stock: Option<i64>,
    /// Units the sale opened with.
    pub initial: Option<i64>,
    /// The window, by Redis's clock (ms since the epoch).
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    /// Since when an operator has paused the sale (`None`: not paused).
    pub paused_ms: Option<i64>,
    /// Units a buyer may buy, and the price of one (as the sale holds it).
    pub limit: Option<i64>,
    pub price: Option<String>,
    /// `XLEN`: entries kept in the stream (acked ones until trimmed).
    pub stream_length: u64,
    /// Orders the script ever appended (the stream's `entries-added`): the
    /// sale's accepted orders, across every instance.
    pub accepted: u64,
    /// Entries delivered to the workers and acked: persisted or moved to
    /// dead letters (or voided after a failed `WAIT`).
    pub acked: u64,
    /// Whether the workers' consumer group exists (from the sale's open).
    pub has_group: bool,
    /// Entries not yet delivered to any worker (`None`: Redis cannot tell).
    pub lag: Option<u64>,
    /// The stream's newest entry id, and the group's last delivered one.
    pub last_generated_id: Option<String>,
    pub last_delivered_id: Option<String>,
    /// Delivered, not yet acked.
    pub pending: u64,
    /// The oldest pending entry's id time (ms since the epoch).
    pub oldest_pending_ms: Option<i64>,
    pub consumers: Vec<Consumer>,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// The workers' last verdict on the books (`bookkeeping::live`).
    pub books: Option<BooksVerdict>,
    /// Cancels asked while their order was pending, not yet applied.
    pub cancel_requests: u64,
    /// Why the sale, ended, is not retired yet (`bookkeeping::retire`; reasons
    /// joined by commas), as the workers last found; `None`: no such verdict.
    pub unsettled: Option<String>,
}

impl StreamView {
    /// Another stock shard's stream counted in (its initial share, its
    /// entries, its workers, its dead letters).
    fn add_shard(&mut self, part: StreamView) {
        self.initial = match (self.initial, part.initial) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.stream_length += part.stream_length;
        self.accepted += part.accepted;
        self.acked += part.acked;
        self.lag = self.lag.zip(part.lag).map(|(a, b)| a + b);
        self.pending += part.pending;
        self.oldest_pending_ms = match (self.oldest_pending_ms, part.oldest_pending_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for c in part.consumers {
            match self.consumers.iter_mut().find(|m| m.name == c.name) {
                Some(mine) => {
                    mine.pending += c.pending;
                    mine.idle_ms = mine.idle_ms.min(c.idle_ms);
                }
                None => self.consumers.push(c),
            }
        }
        self.dead_letters += part.dead_letters;
        self.cancel_requests += part.cancel_requests;
        // The ids of one stream mean nothing beside another's.
        if part.last_generated_id != part.last_delivered_id {
            self.last_delivered_id = None;
        }
    }

    /// Entries appended and not yet delivered to any worker: the group's
    /// lag, or, when Redis cannot count it (entries deleted from the
    /// stream), 0 if the last delivered entry is the last appended one.
    pub fn undelivered(&self) -> Option<u64> {
        self.lag.or_else(|| {
            (self.last_delivered_id.is_some() && self.last_delivered_id == self.last_generated_id)
                .then_some(0)
        })
    }
}

/// One worker of the sale's consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Consumer {
    pub name: String,
    pub pending: u64,
    /// Since the consumer last read or acked.
    pub idle_ms: u64,
}

/// A delivered, unacknowledged entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingEntry {
    pub id: String,
    pub consumer: String,
    /// Since it was last delivered.
    pub idle_ms: u64,
    pub deliveries: u64,
}

/// What a worker last found of a sale's books, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BooksVerdict {
    pub balanced: bool,
    /// Units by which the books were off (0 when balanced).
    pub difference: i64,
    /// When it was judged (ms since the epoch, the worker's clock).
    pub judged_ms: i64,
}

/// How long a recorded reason an ended sale is unsettled outlives its last
/// renewal: what nobody renews (no worker checking) fades rather than stand
/// for the present.
const VERDICT_TTL_MS: u64 = 60_000;

impl Watch {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// The sale's stream as [`StreamView`] says, in one round trip (a
    /// round trip per shard for a sale of several stock shards: their
    /// units, streams and dead letters summed, shard 0's window).
    pub async fn view(&self, product: &ProductId) -> Result<StreamView, SaleError> {
        let n = shards::count(&self.core, product).await?;
        let mut whole = self.view_of(product).await?;
        for k in 1..n {
            let part = self.view_of(&product.shard(k, n)).await?;
            whole.add_shard(part);
        }
        if n > 1 {
            whole.stock = shards::total_stock(&self.core, product, n).await?;
        }
        Ok(whole)
    }

    async fn view_of(&self, product: &ProductId) -> Result<StreamView, SaleError> {
        let keys = self.core.keys(product);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .get(&keys.stock)
            .cmd("HMGET")
            .arg(&keys.sale)
            .arg(&[
                "initial",
                "start_ms",
                "end_ms",
                "paused_ms",
                "limit",
                "price",
            ])
            .cmd("XINFO")
            .arg("STREAM")
            .arg(&keys.orders)
            .cmd("XINFO")
            .arg("GROUPS")
            .arg(&keys.orders)
            .cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&keys.orders)
            .arg(GROUP)
            .cmd("XPENDING")
            .arg(&keys.orders)
            .arg(GROUP)
            .xlen(&keys.dead)
            .cmd("HMGET")
            .arg(&keys.books)
            .arg(&["balanced", "difference", "judged_ms", "unsettled"])
            .hlen(&keys.cancels);
        // The multiplexed connection: a pipeline of cheap commands, once
        // per tick, never blocks the orders pipelined beside it (the pool's
        // connections are the workers', held through their blocking reads).
        let replies: Vec<RedisResult<Value>> = self
            .core
            .call(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        read_view(keys, replies)
    }

    /// What the books check reads of the stream ([`Backlog`]): four cheap
    /// commands in one round trip, where [`Self::view`] sends nine and
    /// parses the stream's first and last entries and every consumer.
    /// A sale of several stock shards: summed over them.
    pub async fn backlog(&self, product: &ProductId) -> Result<Backlog, SaleError> {
        let n = shards::count(&self.core, product).await?;
        let mut whole = self.backlog_of(product).await?;
        for k in 1..n {
            let part = self.backlog_of(&product.shard(k, n)).await?;
            whole.unsettled = whole.unsettled.zip(part.unsettled).map(|(a, b)| a + b);
            whole.dead_letters += part.dead_letters;
        }
        if n > 1 {
            whole.stock = shards::total_stock(&self.core, product, n).await?;
        }
        Ok(whole)
    }

    async fn backlog_of(&self, product: &ProductId) -> Result<Backlog, SaleError> {
        let keys = self.core.keys(product);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .get(&keys.stock)
            .cmd("XINFO")
            .arg("GROUPS")
            .arg(&keys.orders)
            .xlen(&keys.orders)
            .xlen(&keys.dead);
        let replies: Vec<RedisResult<Value>> = self
            .core
            .call(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(Ok(Value::Nil));
        let stock: Option<i64> = parse(next()?)?;
        // Fails when the stream does not exist (a sale not opened yet).
        let groups: Option<StreamInfoGroupsReply> = next().ok().map(parse).transpose()?;
        let stream_length: u64 = parse(next()?)?;
        let dead_letters: u64 = parse(next()?)?;
        let unsettled = match groups.and_then(|g| g.groups.into_iter().find(|g| g.name == GROUP)) {
            Some(group) => group.lag.map(|lag| lag as u64 + group.pending as u64),
            // No group yet: nothing was ever read, so nothing may be waiting.
            None => (stream_length == 0).then_some(0),
        };
        Ok(Backlog {
            stock,
            unsettled,
            dead_letters,
        })
    }

    /// The oldest `limit` entries delivered and not acknowledged (`XPENDING`).
    pub async fn pending(
        &self,
        product: &ProductId,
        limit: usize,
    ) -> Result<Vec<PendingEntry>, SaleError> {
        let orders = self.core.keys(product).orders;
        let pending: StreamPendingCountReply = self
            .core
            .call(|mut c| async move { c.xpending_count(&orders, GROUP, "-", "+", limit).await })
            .await?;
        Ok(pending
            .ids
            .into_iter()
            .map(|p| PendingEntry {
                id: p.id,
                consumer: p.consumer,
                idle_ms: p.last_delivered_ms as u64,
                deliveries: p.times_delivered as u64,
            })
            .collect())
    }

    /// Records a worker's verdict on the sale's books for every instance's
    /// dashboard ([`StreamView::books`]); it expires `lasts` after, unless
    /// renewed (the worker says how long: a quiet sale is judged less often).
    pub async fn record_books(
        &self,
        product: &ProductId,
        verdict: BooksVerdict,
        lasts: std::time::Duration,
    ) -> Result<(), SaleError> {
        let keys = self.core.keys(product);
        let mut pipe = redis::pipe();
        pipe.hset_multiple(
            &keys.books,
            &[
                ("balanced", i64::from(verdict.balanced)),
                ("difference", verdict.difference),
                ("judged_ms", verdict.judged_ms),
            ],
        )
        .ignore()
        .pexpire(&keys.books, lasts.as_millis().max(1) as i64)
        .ignore();
        self.core
            .call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
            .await
    }

    /// Records why an ended sale is not retired yet (`reasons`, e.g.
    /// `dead_letters`), beside the books' verdict: every instance's
    /// dashboard shows it. It expires unless renewed.
    pub async fn record_unsettled(
        &self,
        product: &ProductId,
        reasons: &str,
    ) -> Result<(), SaleError> {
        let keys = self.core.keys(product);
        let mut pipe = redis::pipe();
        pipe.hset(&keys.books, "unsettled", reasons)
            .ignore()
            .pexpire(&keys.books, VERDICT_TTL_MS as i64)
            .ignore();
        self.core
            .call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
            .await
    }
}

/// The sale hash's fields the view reads: initial, start_ms, end_ms,
/// paused_ms, limit, price.
type SaleFields = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// The view from the replies to [`Watch::view`]'s pipeline, in its order.
fn read_view(
    keys: super::keys::SaleKeys,
    replies: Vec<RedisResult<Value>>,
) -> Result<StreamView, SaleError> {
    let mut replies = replies.into_iter();
    let mut next = || replies.next().unwrap_or(Ok(Value::Nil));
    // The stock, the sale's hash and the dead letters are plain reads:
    // an error there is Redis failing. The stream's commands fail when
    // the stream or its group does not exist (a sale not opened yet).
    let stock: Option<i64> = parse(next()?)?;
    let (initial, start_ms, end_ms, paused_ms, limit, price): SaleFields = parse(next()?)?;
    let stream: Option<HashMap<String, Value>> = next().ok().map(parse).transpose()?;
    let groups: Option<StreamInfoGroupsReply> = next().ok().map(parse).transpose()?;
    let consumers: Option<StreamInfoConsumersReply> = next().ok().map(parse).transpose()?;
    let pending: Option<StreamPendingReply> = next().ok().map(parse).transpose()?;
    let dead_letters: u64 = parse(next()?)?;
    let books: (Option<u8>, Option<i64>, Option<i64>, Option<String>) = parse(next()?)?;
    let cancel_requests: u64 = parse(next()?)?;

    let group = groups.and_then(|g| g.groups.into_iter().find(|g| g.name == GROUP));
    let pending_count = group.as_ref().map_or(0, |g| g.pending as u64);
    let read = group.as_ref().and_then(|g| g.entries_read).unwrap_or(0) as u64;
    let stream = stream.unwrap_or_default();
    Ok(StreamView {
        stream_key: keys.orders,
        dead_letter_key: keys.dead,
        has_group: group.is_some(),
        stock,
        initial,
        start_ms,
        end_ms,
        paused_ms,
        limit,
        price,
        stream_length: field(&stream, "length").unwrap_or(0),
        accepted: field(&stream, "entries-added").unwrap_or(0),
        acked: read.saturating_sub(pending_count),
        lag: group.as_ref().and_then(|g| g.lag).map(|l| l as u64),
        last_generated_id: field(&stream, "last-generated-id"),
        last_delivered_id: group.as_ref().map(|g| g.last_delivered_id.clone()),
        pending: pending_count,
        oldest_pending_ms: match pending {
            Some(StreamPendingReply::Data(d)) => id_ms(&d.start_id),
            _ => None,
        },
        consumers: consumers.map_or_else(Vec::new, |c| {
            c.consumers.into_iter().map(Consumer::of).collect()
        }),
        dead_letters,
        cancel_requests,
        unsettled: books.3.clone().filter(|u| !u.is_empty()),
        books: BooksVerdict::of(books),
    })
}

/// A field of `XINFO STREAM`'s reply, when there and of its type.
fn field<T: FromRedisValue>(stream: &HashMap<String, Value>, name: &str) -> Option<T> {
    stream
        .get(name)
        .and_then(|v| T::from_redis_value(v.clone()).ok())
}

impl Consumer {
    fn of(c: redis::streams::StreamInfoConsumer) -> Self {
        Self {
            name: c.name,
            pending: c.pending as u64,
            idle_ms: c.idle as u64,
        }
    }
}

impl BooksVerdict {
    /// The verdict in the sale's `books` hash, when one is recorded.
    fn of(books: (Option<u8>, Option<i64>, Option<i64>, Option<String>)) -> Option<Self> {
        match books {
            (Some(balanced), Some(difference), Some(judged_ms), _) => Some(Self {
                balanced: balanced == 1,
                difference,
                judged_ms,
            }),
            _ => None,
        }
    }
}

fn parse<T: FromRedisValue>(v: Value) -> Result<T, SaleError> {
    T::from_redis_value(v).map_err(|e| SaleError::Redis(e.into()))
}

/// The time part of a stream entry id (`<ms>-<seq>`).
fn id_ms(id: &str) -> Option<i64> {
    id.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_ids_time_is_its_first_part() {
        assert_eq!(id_ms("1764565200123-7"), Some(1_764_565_200_123));
        assert_eq!(id_ms("garbage"), None);
    }
}
