//! A sale's life in Redis: opening it (and listing it in the registry the
//! workers drain), the clock that decides its window, closing it early,
//! and its end (out of the registry, keys deleted). The steps that need the
//! books around them are `bookkeeping::retire`'s.

pub(crate) mod clock;
mod open;
mod pause;
mod restock;

use std::sync::Arc;

use redis::AsyncCommands;

use super::core::Core;
use super::error::SaleError;
use super::room::{Room, RoomKey};
use crate::domain::ProductId;
pub use open::SaleSpec;
pub use pause::Paused;
pub use restock::{RestockAnswer, RestockBy};

/// The lifecycle handle.
#[derive(Clone)]
pub struct Lifecycle {
    core: Arc<Core>,
    room: Room,
}

impl Lifecycle {
    pub(super) fn new(core: Arc<Core>, room: Room) -> Self {
        Self { core, room }
    }

    /// Loads a sale into Redis unless it is open already, and lists it in the
    /// registry the workers drain; returns `(opened_now, stock_left)`.
    pub async fn open(
        &self,
        product: &ProductId,
        spec: &SaleSpec,
    ) -> Result<(bool, u64), SaleError> {
        let core = &self.core;
        // A fresh key for every open: used only if this call loads the sale.
        let room_key = match spec.waiting_room {
            Some(_) => RoomKey::generate(),
            None => String::new(),
        };
        // Shard by shard (one for most sales), the last first: shard 0's
        // hash says the sale is open, so it is written once the others are.
        // An open that stops halfway is finished by opening again (each
        // shard is put-if-absent).
        let n = spec.shards.max(1);
        let mut opened = (false, 0);
        for k in (0..n).rev() {
            let keys = core.keys(&product.shard(k, n));
            let share = (k, spec.share(spec.stock, k));
            let room_key = &room_key;
            let (now, left) =
                core.call(|mut c| async move {
                    open::open_sale(&mut c, &keys, spec, room_key, share).await
                })
                .await?;
            opened = (now, opened.1 + left);
        }
        // A command of its own: the registry lives in another slot than the
        // sale. Repeated on every open, so opening again repairs a crash
        // between the two. A sale's shards k >= 1 are listed too, for the
        // workers to drain their streams.
        let registry = core.registry();
        let names: Vec<String> = (0..n).map(|k| product.shard(k, n).into_string()).collect();
        core.call(|mut c| async move { c.sadd::<_, _, ()>(&registry, &names).await })
            .await?;
        if opened.0 {
            core.shards.forget(product);
            // Whatever was remembered of an earlier sale of this id is void.
            core.memory.forget(product);
            self.room.forget(product);
        }
        core.memory.opened(product);
        Ok(opened)
    }

    /// Ends an open sale now, by its Redis node's clock: every order from
    /// the next on is refused `sale_ended`. Its end (epoch ms), or `None`
    /// when Redis does not have the sale.
    pub async fn close(&self, product: &ProductId) -> Result<Option<i64>, SaleError> {
        // Shards k >= 1 first: shard 0's answer is the sale's.
        let n = super::shards::count(&self.core, product).await?;
        let mut end = None;
        for k in (0..n).rev() {
            let keys = self.core.keys(&product.shard(k, n));
            end = self
                .core
                .call(|mut c| async move { clock::close_sale(&mut c, &keys).await })
                .await?;
        }
        // This instance learns the new window at its next order.
        self.core.memory.forget(product);
        Ok(end)
    }

    /// Pauses an open sale (`pause`) or resumes it: from the next order on,
    /// on every instance (no instance remembers it: each order's script
    /// reads it). `None` when Redis does not have the sale.
    pub async fn pause(
        &self,
        product: &ProductId,
        pause: bool,
    ) -> Result<Option<Paused>, SaleError> {
        let n = super::shards::count(&self.core, product).await?;
        let mut paused = None;
        for k in (0..n).rev() {
            let keys = self.core.keys(&product.shard(k, n));
            paused = self
                .core
                .call(|mut c| async move { pause::pause_sale(&mut c, &keys, pause).await })
                .await?;
        }
        // The room's line stands still (or moves again) from its next tick.
        self.room.renew(product);
        Ok(paused)
    }

    /// Adds `units` to an open sale (taken away when negative, never more
    /// than are left), once per `id`, atomically with its orders.
    /// `by` the reconciler: one the books hold, put back (see
    /// [`RestockBy::PutBack`]).
    pub async fn restock(
        &self,
        product: &ProductId,
        units: i64,
        id: &str,
        by: RestockBy,
    ) -> Result<RestockAnswer, SaleError> {
        if units < 0 {
            // A sale of several stock shards: the units taken away are
            // gathered on shard 0 first (moves, as a buyer's search makes).
            super::shards::gather(&self.core, product, -units).await?;
        }
        let keys = self.core.keys(product);
        let done = self
            .core
            .call(|mut c| async move { restock::restock(&mut c, &keys, units, id, by).await })
            .await?;
        // This instance's sold-out and allowance answers go (the others'
        // within SOLD_OUT_CACHE_MS); the room's line moves again for new
        // units from its next tick.
        self.core.memory.forget(product);
        self.room.renew(product);
        Ok(done)
    }

    /// Before `flashsale recover` opens a sale rebuilt from the books,
    /// whose `initial` counts its restocks already: the restocks as done
    /// (`restock_id -> units`, nothing moved), so that the reconciler does
    /// not make them again and an operator's retry answers as done.
    pub async fn restocks_done(
        &self,
        product: &ProductId,
        restocks: &[(String, i64)],
    ) -> Result<(), SaleError> {
        let key = self.core.keys(product).restocks;
        self.core
            .call(|mut c| async move {
                let mut pipe = redis::pipe();
                pipe.atomic().del(&key).ignore();
                if !restocks.is_empty() {
                    pipe.hset_multiple(&key, restocks).ignore();
                }
                pipe.query_async::<()>(&mut c).await
            })
            .await
    }

    /// The clock of the Redis node that decides the sale's orders (epoch
    /// ms), and the sale's window (`None` when Redis does not have it).
    pub async fn clock(&self, product: &ProductId) -> Result<(i64, Option<(i64, i64)>), SaleError> {
        let keys = self.core.keys(product);
        self.core
            .call(|mut c| async move { clock::sale_clock(&mut c, &keys).await })
            .await
    }

    /// The sales listed in the registry.
    pub async fn open_sales(&self) -> Result<Vec<ProductId>, SaleError> {
        self.core.open_sales().await
    }

    /// The streams to drain: every open sale's, and its stock shards'
    /// (`<pid>~<k>`).
    pub async fn open_streams(&self) -> Result<Vec<ProductId>, SaleError> {
        self.core.open_streams().await
    }

    /// Whether no sale has this id, by this process's last read of the
    /// registry (no Redis call); false when it cannot say.
    pub fn is_no_sale(&self, product: &ProductId) -> bool {
        self.core.is_no_sale(product)
    }

    /// For each sale: an id of the Redis master serving it, which changes
    /// when its data may have changed under us (a failover, a restart).
    pub async fn master_epochs(&self, products: &[ProductId]) -> Result<Vec<String>, SaleError> {
        let tags: Vec<&str> = products.iter().map(ProductId::as_str).collect();
        self.core.redis.master_epochs(&tags).await
    }

    /// Deletes every key of a sale and drops it from the registry: the sale
    /// is gone from Redis (its orders must be in the books first).
    pub async fn remove(&self, product: &ProductId) -> Result<(), SaleError> {
        self.unlink(product).await?;
        self.forget(product).await
    }

    /// Drops a sale from the registry (its keys stay).
    pub async fn forget(&self, product: &ProductId) -> Result<(), SaleError> {
        self.forget_all(std::slice::from_ref(product)).await
    }

    /// Drops sales from the registry, in one command (their keys stay).
    pub async fn forget_all(&self, products: &[ProductId]) -> Result<(), SaleError> {
        if products.is_empty() {
            return Ok(());
        }
        // The sales' shards k >= 1 with them.
        let listed = self.core.open_streams().await?;
        let ids: Vec<&str> = products
            .iter()
            .chain(
                listed
                    .iter()
                    .filter(|s| s.is_shard() && products.contains(&s.sale())),
            )
            .map(ProductId::as_str)
            .collect();
        let registry = self.core.registry();
        self.core
            .call(|mut c| async move { c.srem::<_, _, ()>(&registry, &ids).await })
            .await?;
        for product in products {
            self.core.memory.removed(product);
            self.core.shards.forget(product);
        }
        Ok(())
    }

    /// Deletes every key of the sale, `UNLINK`: Redis frees a large sale's
    /// memory (a million order records) in the background, never stalling
    /// the orders of other sales. The registry is not touched.
    pub async fn unlink(&self, product: &ProductId) -> Result<(), SaleError> {
        // Shards k >= 1 first: shard 0 names the count.
        let n = super::shards::count(&self.core, product).await?;
        for k in (0..n).rev() {
            let keys = self.core.keys(&product.shard(k, n));
            self.core
                .call(|mut c| async move { c.unlink::<_, ()>(&keys.all()[..]).await })
                .await?;
        }
        self.core.shards.forget(product);
        self.core.memory.forget(product);
        self.room.forget(product);
        Ok(())
    }
}
