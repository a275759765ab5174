//! The private core every sale handle shares (as mini-redis's `Db` shares
//! its `Shared`): the Redis handle, the key prefix, this process's memory
//! of Redis's answers, the WAIT setting and the call counters. Handles reach Redis only through [`Core::call`] (the
//! shared connection, within the Redis timeout) and, to WAIT, through
//! [`Core::alone`]; nothing outside `sale` sees the core.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

use redis::AsyncCommands;

use super::conn::{Conn, Redis, Wait};
use super::keys::{self, SaleKeys};
use super::memory::{self, Memory};
use super::scripts;
use super::types::SaleError;
use crate::domain::{Chain, ProductId};

pub(super) struct Core {
    pub(super) redis: Redis,
    pub(super) prefix: String,
    pub(super) memory: Memory,
    /// Replicas a write must reach before it counts (`None`: no WAIT).
    pub(super) wait: Option<Wait>,
    pub(super) calls: Calls,
}

/// The Redis calls of the order path and its upkeep (the savings of the
/// memory show here).
#[derive(Debug, Default)]
pub(super) struct Calls {
    /// `place_order.lua` calls.
    pub(super) orders: AtomicU64,
    /// The orders those calls carried (several share a call when they
    /// arrive together: `sale::line`).
    pub(super) orders_sent: AtomicU64,
    /// `sale_clock.lua` and registry reads, in the background.
    pub(super) memory_reads: AtomicU64,
    /// `room_tick.lua` and `room_join.lua`.
    pub(super) rooms: AtomicU64,
}

impl Calls {
    pub(super) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
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
    ) -> Result<bb8::PooledConnection<'_, super::conn::BlockingConnections>, SaleError> {
        Ok(self.redis.exclusive().get().await?)
    }

    /// Whether no sale has this id, by this process's last read of the
    /// registry (no Redis call; the read is renewed in the background when
    /// due). False when memory cannot say: then Redis is asked.
    pub(super) fn is_no_sale(self: &Arc<Self>, product: &ProductId) -> bool {
        let known = self.memory.known();
        if known.claim_refresh() {
            self.refresh_known_sales();
        }
        known.lookup(product) == memory::Known::Unknown
    }

    /// Runs `read`, a read that keeps the memory fresh, in the background
    /// (no order waits for it), counted.
    fn in_background<F>(self: &Arc<Self>, read: impl FnOnce(Arc<Self>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Calls::count(&self.calls.memory_reads);
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

    /// Reads a sale's stock, to renew its sold-out mark.
    pub(super) fn renew_sold_out(self: &Arc<Self>, product: &ProductId) {
        let product = product.clone();
        self.in_background(|core| async move {
            let stock_key = core.keys(&product).stock;
            let sent = Instant::now();
            let read = core.call(|mut c| async move { c.get::<_, Option<i64>>(&stock_key).await });
            let stock = match read.await {
                Ok(stock) => Some(stock),
                Err(e) => {
                    tracing::debug!(product_id = %product, error = %Chain(&e), "stock read for the sold-out mark failed");
                    None
                }
            };
            core.memory.stock_read(&product, sent, stock);
        });
    }

    /// Reads a sale's window and its Redis node's clock.
    pub(super) fn refresh_sale_clock(self: &Arc<Self>, product: &ProductId) {
        let product = product.clone();
        self.in_background(|core| async move {
            let keys = core.keys(&product);
            let sent = core.memory.now();
            let read = core.call(|mut c| async move { scripts::sale_clock(&mut c, &keys).await });
            match read.await {
                Ok((redis_ms, window)) => {
                    let received = core.memory.now();
                    core.memory
                        .refreshed(&product, window, redis_ms, sent, received);
                }
                Err(e) => {
                    tracing::debug!(product_id = %product, error = %Chain(&e), "sale clock read failed");
                    core.memory.refresh_failed(&product);
                }
            }
        });
    }
}
