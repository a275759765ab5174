//! A sale's queue as operators see it: the facts `redis-cli` gives with
//! `XLEN`, `XINFO GROUPS`, `XINFO CONSUMERS` and `XPENDING`, in one struct.
//! Read-only; each command touches one key of one sale.

use redis::AsyncCommands;
use redis::streams::{StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingCountReply};
use serde::Serialize;

use super::keys::GROUP;
use super::{SaleError, Sales};
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
