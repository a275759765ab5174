//! A sale as operators see it, read-only: its queue (the facts `redis-cli`
//! gives with `XLEN`, `XINFO GROUPS`, `XINFO CONSUMERS` and `XPENDING`, in
//! one struct) and the audit's [`SaleSnapshot`]. Each command touches one key
//! of one sale.

use std::collections::{BTreeMap, HashMap, HashSet};

use redis::AsyncCommands;
use redis::streams::{StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingCountReply};
use serde::Serialize;

use super::keys::GROUP;
use super::{Entry, Repairs, SaleError, Sales};
use crate::domain::ProductId;

/// One sale's stream and consumer group.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub product_id: String,
    /// Units left (`None`: the sale is not in Redis).
    pub stock: Option<u64>,
    pub stream_key: String,
    /// `XLEN`: entries in the stream, acked ones kept for retention included.
    pub length: u64,
    /// The workers' group (`None` until the sale is opened).
    pub group: Option<GroupReport>,
    pub consumers: Vec<ConsumerReport>,
    /// The oldest pending entries (at most the limit asked for).
    pub pending: Vec<PendingEntry>,
    pub dead_letter_key: String,
    /// `XLEN` of the dead-letter stream.
    pub dead_letters: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    pub name: String,
    pub consumers: u64,
    /// Delivered and not acked.
    pub pending: u64,
    pub last_delivered_id: String,
    /// Entries not yet delivered to any consumer (`None` when Redis cannot tell).
    pub lag: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConsumerReport {
    pub name: String,
    pub pending: u64,
    /// Since the consumer's last attempted interaction.
    pub idle_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PendingEntry {
    pub id: String,
    pub consumer: String,
    /// Since it was last delivered.
    pub idle_ms: u64,
    pub deliveries: u64,
}

impl Sales {
    /// The sale's queue, with at most `pending_limit` pending entries listed.
    pub async fn inspect(
        &self,
        product: &ProductId,
        pending_limit: usize,
    ) -> Result<StreamReport, SaleError> {
        let keys = self.keys(product);
        let redis = self.redis();
        let mut conn = redis.shared().await?;
        let stock: Option<i64> = redis.bounded(conn.get(&keys.stock)).await?;
        let length: u64 = redis.bounded(conn.xlen(&keys.orders)).await?;
        let dead_letters: u64 = redis.bounded(conn.xlen(&keys.dead)).await?;
        let exists: bool = redis.bounded(conn.exists(&keys.orders)).await?;
        let mut report = StreamReport {
            product_id: product.to_string(),
            stock: stock.map(|s| s.max(0) as u64),
            stream_key: keys.orders.clone(),
            length,
            group: None,
            consumers: Vec::new(),
            pending: Vec::new(),
            dead_letter_key: keys.dead.clone(),
            dead_letters,
        };
        if !exists {
            return Ok(report);
        }
        let groups: StreamInfoGroupsReply = redis.bounded(conn.xinfo_groups(&keys.orders)).await?;
        let Some(group) = groups.groups.into_iter().find(|g| g.name == GROUP) else {
            return Ok(report);
        };
        report.group = Some(GroupReport {
            name: group.name,
            consumers: group.consumers as u64,
            pending: group.pending as u64,
            last_delivered_id: group.last_delivered_id,
            lag: group.lag.map(|l| l as u64),
        });
        let consumers: StreamInfoConsumersReply = redis
            .bounded(conn.xinfo_consumers(&keys.orders, GROUP))
            .await?;
        report.consumers = consumers
            .consumers
            .into_iter()
            .map(|c| ConsumerReport {
                name: c.name,
                pending: c.pending as u64,
                idle_ms: c.idle as u64,
            })
            .collect();
        if pending_limit > 0 {
            let pending: StreamPendingCountReply = redis
                .bounded(conn.xpending_count(&keys.orders, GROUP, "-", "+", pending_limit))
                .await?;
            report.pending = pending
                .ids
                .into_iter()
                .map(|p| PendingEntry {
                    id: p.id,
                    consumer: p.consumer,
                    idle_ms: p.last_delivered_ms as u64,
                    deliveries: p.times_delivered as u64,
                })
                .collect();
        }
        Ok(report)
    }
}

/// What the audit needs of a sale in Redis (each key read on its own: a
/// sale taking orders may move between the reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleSnapshot {
    /// Units left; `None`: the sale is not in Redis.
    pub stock: Option<i64>,
    /// Orders the script accepted and Redis still holds: id → units.
    pub accepted: BTreeMap<String, i64>,
    /// The dead-letter stream's orders.
    pub dead_letters: Vec<DeadLetter>,
    /// What reconciliation restored after Redis lost writes.
    pub repairs: Repairs,
}

/// An order in dead letters: answered 202, never persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// `None` when the entry was too broken to name its order.
    pub order_id: Option<String>,
    pub quantity: i64,
}

impl Sales {
    /// The orders in a sale's dead letters.
    pub async fn dead_letters(&self, product: &ProductId) -> Result<Vec<DeadLetter>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let dead: redis::Value = self.redis.bounded(conn.xrange_all(&keys.dead)).await?;
        Ok(Entry::decode_list(dead)
            .map_err(redis::RedisError::from)?
            .iter()
            .map(|e| DeadLetter {
                order_id: e.field("order_id").map(str::to_owned),
                quantity: e
                    .field("quantity")
                    .and_then(|q| q.parse().ok())
                    .unwrap_or(0),
            })
            .collect())
    }

    /// A sale's stock, accepted records, dead letters and repairs.
    pub async fn snapshot(&self, product: &ProductId) -> Result<SaleSnapshot, SaleError> {
        let keys = self.keys(product);
        let redis = &self.redis;
        let mut conn = redis.shared().await?;
        let stock: Option<i64> = redis.bounded(conn.get(&keys.stock)).await?;
        // HSCAN in steps rather than one HGETALL: a sale of a million
        // orders would hold Redis (and every other sale's orders) for a
        // second; each step is short.
        let mut accepted = BTreeMap::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<(String, String)>) = redis
                .bounded(
                    redis::cmd("HSCAN")
                        .arg(&keys.accepted)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SCAN_STEP)
                        .query_async(&mut conn),
                )
                .await?;
            accepted.extend(
                page.into_iter()
                    .map(|(id, record)| (id, record_quantity(&record))),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let dead_letters = self.dead_letters(product).await?;
        Ok(SaleSnapshot {
            stock,
            accepted,
            dead_letters,
            repairs: self.repairs(product).await?,
        })
    }
}

/// Fields one HSCAN step asks for.
const SCAN_STEP: usize = 1000;

/// The quantity in an `accepted` record (see `place_order.lua`).
fn record_quantity(record: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(record)
        .ok()
        .and_then(|v| v["quantity"].as_i64())
        .unwrap_or(0)
}

impl Sales {
    /// Every entry in the sale's stream, acked or not (`XRANGE`; read-only).
    pub async fn stream_entries(&self, product: &ProductId) -> Result<Vec<Entry>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let stream: redis::Value = self.redis.bounded(conn.xrange_all(&keys.orders)).await?;
        Ok(Entry::decode_list(stream).map_err(redis::RedisError::from)?)
    }

    /// Whether Redis has the sale (its hash, which lets orders in).
    pub async fn has_sale(&self, product: &ProductId) -> Result<bool, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis.bounded(conn.exists(&keys.sale)).await
    }

    /// Orders in the sale's stream that are neither in `persisted` nor
    /// voided (taken back, never to be persisted): the orders a rebuild of
    /// the sale from MySQL would forget.
    pub async fn unpersisted_orders(
        &self,
        product: &ProductId,
        persisted: &HashSet<&str>,
    ) -> Result<usize, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let voided: HashMap<String, String> = self.redis.bounded(conn.hgetall(&keys.void)).await?;
        Ok(self
            .stream_entries(product)
            .await?
            .iter()
            .filter_map(|e| e.field("order_id"))
            .filter(|id| {
                !persisted.contains(id) && voided.get(*id).is_none_or(|state| state != "void")
            })
            .count())
    }
}
