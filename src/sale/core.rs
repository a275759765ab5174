//! The private core every sale handle shares (as mini-redis's `Db` shares
//! its `Shared`): the Redis handle, the key prefix, this process's memory
//! of Redis's answers, the WAIT setting and the call counts. Handles reach
//! Redis only through [`Core::call`] (the shared connection, within the
//! Redis timeout) and, to WAIT, through [`Core::alone`]; nothing outside
//! `sale` sees the core.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::time::Instant;

use redis::AsyncCommands;

use super::conn::{BlockingConnections, Conn, Redis};
use super::error::SaleError;
use super::keys::{self, SaleKeys};
use super::memory::{self, Memory};
use super::wait::{confirmed, invoke_and_wait};
use crate::config::ReplicaWait;
use crate::domain::{Chain, ProductId};

pub(super) struct Core {
    pub(super) redis: Redis,
    pub(super) prefix: String,
    pub(super) memory: Memory,
    /// Replicas a write must reach before it counts (`None`: no WAIT).
    pub(super) wait: Option<ReplicaWait>,
    pub(super) counts: Arc<Counts>,
    /// The sales' stock shard counts, as learnt (see `sale::shards`).
    pub(super) shards: ShardCounts,
}

/// What this process sent to Redis, by kind (the memory's savings show
/// here; `/metrics` exports them).
#[derive(Debug, Default)]
pub struct Counts([AtomicU64; 4]);

/// A kind of call [`Counts`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// `place_order.lua` calls.
    OrderCalls,
    /// The orders those calls carried (several share a call when they
    /// arrive together: `sale::orders`).
    OrdersSent,
    /// `sale_clock.lua` and registry reads, in the background.
    MemoryReads,
    /// `room_tick.lua` and `room_join.lua`.
    RoomCalls,
}

impl Counts {
    pub(super) fn add(&self, counter: Counter, n: usize) {
        self.0[counter as usize].fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The calls of this kind sent so far.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize].load(Ordering::Relaxed)
    }
}

impl Core {
    pub(super) fn keys(&self, product: &ProductId) -> SaleKeys {
        SaleKeys::new(&self.prefix, product)
    }

    pub(super) fn registry(&self) -> String {
        keys::registry(&self.prefix)
    }

    /// Runs `call` on the shared multiplexed connection, within the Redis
    /// timeout: the one way a handle sends a command.
    pub(super) async fn call<T, F>(&self, call: impl FnOnce(Conn) -> F) -> Result<T, SaleError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        self.redis.call(call).await
    }

    /// A script that writes: its reply, and with `REDIS_WAIT_REPLICAS`
    /// whether the replicas have its write (the script and `WAIT` as one
    /// pipeline to the node holding `key`, one of its keys).
    pub(super) async fn write<T: redis::FromRedisValue>(
        &self,
        key: &str,
        call: redis::ScriptInvocation<'static>,
    ) -> Result<(T, Result<(), SaleError>), SaleError> {
        match self.wait {
            None => {
                let reply = self
                    .call(|mut c| async move { call.invoke_async(&mut c).await })
                    .await?;
                Ok((reply, Ok(())))
            }
            Some(wait) => {
                let mut pooled = self.alone().await?;
                let (reply, acked) = self
                    .redis
                    .bounded(invoke_and_wait(&mut pooled, key, &call, wait))
                    .await?;
                Ok((reply, confirmed(wait, acked)))
            }
        }
    }

    /// A pooled connection of the caller's own (a `WAIT` counts the writes
    /// of its connection, and blocks it).
    pub(super) async fn alone(
        &self,
    ) -> Result<bb8::PooledConnection<'_, BlockingConnections>, SaleError> {
        Ok(self.redis.exclusive().get().await?)
    }

    /// Whether no sale has this id, by this process's last read of the
    /// registry (no Redis call; the read is renewed in the background when
    /// due). False when memory cannot say: then Redis is asked.
    pub(super) fn is_no_sale(self: &Arc<Self>, product: &ProductId) -> bool {
        let (known, refresh) = self.memory.known().look(product, Instant::now());
        if refresh {
            self.refresh_known_sales();
        }
        known == memory::Known::Unknown
    }

    /// Runs `read`, a read that keeps the memory fresh, in the background
    /// (no order waits for it), counted.
    pub(super) fn in_background<F>(self: &Arc<Self>, read: impl FnOnce(Arc<Self>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.counts.add(Counter::MemoryReads, 1);
        tokio::spawn(read(self.clone()));
    }

    /// The sales listed in the registry (its members less the stock shards).
    pub(super) async fn open_sales(&self) -> Result<Vec<ProductId>, SaleError> {
        let mut listed = self.open_streams().await?;
        listed.retain(|p| !p.is_shard());
        Ok(listed)
    }

    /// The registry's members: the open sales and their stock shards
    /// k >= 1 (`<pid>~<k>`, listed for the workers to drain their streams).
    pub(super) async fn open_streams(&self) -> Result<Vec<ProductId>, SaleError> {
        let registry = self.registry();
        let ids: Vec<String> = self
            .call(|mut c| async move { c.smembers(&registry).await })
            .await?;
        Ok(ids
            .iter()
            .filter_map(|id| ProductId::parse_sale_or_shard(id))
            .collect())
    }

    /// Reads the registry, for the memory to know which sales exist.
    pub(super) fn refresh_known_sales(self: &Arc<Self>) {
        self.in_background(|core| async move {
            let sent = Instant::now();
            match core.open_sales().await {
                Ok(ids) => core.memory.registry_read(ids, sent),
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "registry read for memory failed");
                    core.memory.known().refresh_failed();
                }
            }
        });
    }
}

/// What this process knows of the sales' shard counts, learnt from the
/// sales' hashes and the order script's answers; a sale's count is fixed
/// from its open to its end.
#[derive(Default)]
pub(super) struct ShardCounts {
    counts: RwLock<HashMap<ProductId, u16>>,
    /// One search for units at a time per shard in this process: the
    /// buyers of an empty shard who arrive together share its result.
    searches: Mutex<HashMap<ProductId, Arc<tokio::sync::Mutex<()>>>>,
}

impl ShardCounts {
    /// The sale's count, if known (no Redis call).
    pub(super) fn known(&self, product: &ProductId) -> Option<u16> {
        self.counts
            .read()
            .ok()
            .and_then(|c| c.get(product).copied())
    }

    pub(super) fn learn(&self, product: &ProductId, n: u16) {
        if let Ok(mut counts) = self.counts.write() {
            counts.insert(product.clone(), n.max(1));
        }
    }

    pub(super) fn forget(&self, product: &ProductId) {
        if let Ok(mut counts) = self.counts.write() {
            counts.remove(product);
        }
        if let Ok(mut searches) = self.searches.lock() {
            searches.retain(|shard, _| shard.sale() != *product);
        }
    }

    pub(super) fn search(&self, shard: &ProductId) -> Arc<tokio::sync::Mutex<()>> {
        match self.searches.lock() {
            Ok(mut s) => s.entry(shard.clone()).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }
}
