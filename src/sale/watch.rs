//! A sale as the operator's dashboard shows it, read in one pipelined round
//! trip to the sale's node (every key shares the sale's hash tag): the
//! stock and window, the stream and its consumer group, each consumer, the
//! oldest pending entry, the dead letters, and the workers' last verdict on
//! the books. Read-only.

use std::collections::HashMap;

use redis::streams::{StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingReply};
use redis::{FromRedisValue, RedisResult, Value};
use serde::Serialize;

use super::keys::GROUP;
use super::{SaleError, Sales};
use crate::domain::ProductId;

/// One sale, now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SaleWatch {
    /// Units left (`None`: the sale is not in Redis).
    pub stock: Option<i64>,
    /// Units the sale opened with.
    pub initial: Option<i64>,
    /// The window, by Redis's clock (ms since the epoch).
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    /// `XLEN`: entries kept in the stream (acked ones until trimmed).
    pub stream_length: u64,
    /// Orders the script ever appended (the stream's `entries-added`): the
    /// sale's accepted orders, across every instance.
    pub accepted: u64,
    /// Entries delivered to the workers and acked: persisted or moved to
    /// dead letters (or voided after a failed `WAIT`).
    pub acked: u64,
    /// Entries not yet delivered to any worker (`None`: Redis cannot tell).
    pub lag: Option<u64>,
    /// The stream's newest entry id, and the group's last delivered one.
    pub last_generated_id: Option<String>,
    pub last_delivered_id: Option<String>,
    /// Delivered, not yet acked.
    pub pending: u64,
    /// The oldest pending entry's id time (ms since the epoch).
    pub oldest_pending_ms: Option<i64>,
    pub consumers: Vec<ConsumerWatch>,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// The workers' last verdict on the books (`books::live`).
    pub books: Option<BooksVerdict>,
    /// Cancels asked while their order was pending, not yet applied.
    pub cancel_requests: u64,
    /// Why the sale, ended, is not retired yet (`books::retire`; reasons
    /// joined by commas), as the workers last found; `None`: no such verdict.
    pub unsettled: Option<String>,
}

impl SaleWatch {
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerWatch {
    pub name: String,
    pub pending: u64,
    /// Since the consumer last read or acked.
    pub idle_ms: u64,
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

/// How long a recorded verdict outlives its last renewal: a verdict nobody
/// renews (no worker checking) fades rather than stand for the present.
const VERDICT_TTL_MS: u64 = 60_000;

impl Sales {
    /// The sale as [`SaleWatch`] says, in one round trip.
    pub async fn watch(&self, product: &ProductId) -> Result<SaleWatch, SaleError> {
        let keys = self.keys(product);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .get(&keys.stock)
            .cmd("HMGET")
            .arg(&keys.sale)
            .arg(&["initial", "start_ms", "end_ms"])
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
        let mut conn = self.redis.shared().await?;
        let replies: Vec<RedisResult<Value>> =
            self.redis.bounded(pipe.query_async(&mut conn)).await?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(Ok(Value::Nil));
        // The stock, the sale's hash and the dead letters are plain reads:
        // an error there is Redis failing. The stream's commands fail when
        // the stream or its group does not exist (a sale not opened yet).
        let stock: Option<i64> = parse(next()?)?;
        let (initial, start_ms, end_ms): (Option<i64>, Option<i64>, Option<i64>) = parse(next()?)?;
        let stream: Option<HashMap<String, Value>> = next().ok().map(parse).transpose()?;
        let groups: Option<StreamInfoGroupsReply> = next().ok().map(parse).transpose()?;
        let consumers: Option<StreamInfoConsumersReply> = next().ok().map(parse).transpose()?;
        let pending: Option<StreamPendingReply> = next().ok().map(parse).transpose()?;
        let dead_letters: u64 = parse(next()?)?;
        let books: (Option<u8>, Option<i64>, Option<i64>, Option<String>) = parse(next()?)?;
        let cancel_requests: u64 = parse(next()?)?;

        let number = |field: &str| {
            stream
                .as_ref()
                .and_then(|s| s.get(field))
                .and_then(|v| u64::from_redis_value(v.clone()).ok())
        };
        let last_generated_id = stream
            .as_ref()
            .and_then(|s| s.get("last-generated-id"))
            .and_then(|v| String::from_redis_value(v.clone()).ok());
        let group = groups.and_then(|g| g.groups.into_iter().find(|g| g.name == GROUP));
        let pending_count = group.as_ref().map_or(0, |g| g.pending as u64);
        let read = group.as_ref().and_then(|g| g.entries_read).unwrap_or(0) as u64;
        Ok(SaleWatch {
            stock,
            initial,
            start_ms,
            end_ms,
            stream_length: number("length").unwrap_or(0),
            accepted: number("entries-added").unwrap_or(0),
            acked: read.saturating_sub(pending_count),
            lag: group.as_ref().and_then(|g| g.lag).map(|l| l as u64),
            last_generated_id,
            last_delivered_id: group.as_ref().map(|g| g.last_delivered_id.clone()),
            pending: pending_count,
            oldest_pending_ms: match pending {
                Some(StreamPendingReply::Data(d)) => id_ms(&d.start_id),
                _ => None,
            },
            consumers: consumers
                .map(|c| c.consumers)
                .unwrap_or_default()
                .into_iter()
                .map(|c| ConsumerWatch {
                    name: c.name,
                    pending: c.pending as u64,
                    idle_ms: c.idle as u64,
                })
                .collect(),
            dead_letters,
            cancel_requests,
            unsettled: books.3.filter(|u| !u.is_empty()),
            books: match books {
                (Some(balanced), Some(difference), Some(judged_ms), _) => Some(BooksVerdict {
                    balanced: balanced == 1,
                    difference,
                    judged_ms,
                }),
                _ => None,
            },
        })
    }

    /// Records a worker's verdict on the sale's books for every instance's
    /// dashboard ([`SaleWatch::books`]); it expires unless renewed.
    pub async fn record_books(
        &self,
        product: &ProductId,
        verdict: BooksVerdict,
    ) -> Result<(), SaleError> {
        let keys = self.keys(product);
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
        .pexpire(&keys.books, VERDICT_TTL_MS as i64)
        .ignore();
        let mut conn = self.redis.shared().await?;
        self.redis.bounded(pipe.query_async::<()>(&mut conn)).await
    }

    /// Records why an ended sale is not retired yet (`reasons`, e.g.
    /// `dead_letters`), beside the books' verdict: every instance's
    /// dashboard shows it. It expires unless renewed.
    pub async fn record_unsettled(
        &self,
        product: &ProductId,
        reasons: &str,
    ) -> Result<(), SaleError> {
        let keys = self.keys(product);
        let mut pipe = redis::pipe();
        pipe.hset(&keys.books, "unsettled", reasons)
            .ignore()
            .pexpire(&keys.books, VERDICT_TTL_MS as i64)
            .ignore();
        let mut conn = self.redis.shared().await?;
        self.redis.bounded(pipe.query_async::<()>(&mut conn)).await
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
