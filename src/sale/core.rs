//! The private core every sale handle shares (as mini-redis's `Db` shares
//! its `Shared`): the Redis handle, the key prefix, this process's memory
//! of Redis's answers, the WAIT setting and the call counts. Handles reach
//! Redis only through [`Core::call`] (the shared connection, within the
//! Redis timeout) and, to WAIT, through [`Core::alone`]; nothing outside
//! `sale` sees the core.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

use redis::AsyncCommands;

use super::conn::{BlockingConnections, Conn, Redis};
use super::error::SaleError;
use super::keys::{self, SaleKeys};
use super::memory::{self, Memory};
use crate::config::ReplicaWait;
use crate::domain::{Chain, ProductId};

pub(super) struct Core {
    pub(super) redis: Redis,
    pub(super) prefix: String,
    pub(super) memory: Memory,
    /// Replicas a write must reach before it counts (`None`: no WAIT).
    pub(super) wait: Option<ReplicaWait>,
    pub(super) counts: Arc<Counts>,
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

    /// The sales listed in the registry.
    pub(super) async fn open_sales(&self) -> Result<Vec<ProductId>, SaleError> {
        let registry = self.registry();
        let ids: Vec<String> = self
            .call(|mut c| async move { c.smembers(&registry).await })
            .await?;
        Ok(ids
            .iter()
            .filter_map(|id| ProductId::parse(id).ok())
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
