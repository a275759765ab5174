//! The Redis side of a sale's end of life (see `books::retire`): an early
//! close, the clock that says a sale has ended, leaving the registry, and
//! deleting its keys. (Why a sale cannot retire yet is recorded beside the
//! books' verdict: [`super::watch`].)

use redis::AsyncCommands;

use super::{SaleError, Sales, scripts};
use crate::domain::ProductId;

impl Sales {
    /// Ends an open sale now, by its Redis node's clock: every order from
    /// the next on is refused `sale_ended`. Its end (epoch ms), or `None`
    /// when Redis does not have the sale.
    pub async fn close(&self, product: &ProductId) -> Result<Option<i64>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let end = self
            .redis
            .bounded(scripts::close_sale(&mut conn, &keys))
            .await?;
        // This instance learns the new window at its next order.
        self.memory.forget(product);
        Ok(end)
    }

    /// The clock of the Redis node that decides the sale's orders (epoch
    /// ms), and the sale's window (`None` when Redis does not have it).
    pub async fn clock(&self, product: &ProductId) -> Result<(i64, Option<(i64, i64)>), SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(scripts::sale_clock(&mut conn, &keys))
            .await
    }

    /// Drops sales from the registry, in one command (their keys stay).
    pub async fn forget_all(&self, products: &[ProductId]) -> Result<(), SaleError> {
        if products.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = products.iter().map(ProductId::as_str).collect();
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(conn.srem::<_, _, ()>(super::keys::registry(&self.prefix), &ids))
            .await?;
        for product in products {
            self.memory.removed(product);
        }
        Ok(())
    }

    /// Deletes every key of the sale, `UNLINK`: Redis frees a large sale's
    /// memory (a million order records) in the background, never stalling
    /// the orders of other sales. The registry is not touched.
    pub async fn unlink(&self, product: &ProductId) -> Result<(), SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(conn.unlink::<_, ()>(&keys.all()[..]))
            .await?;
        self.memory.forget(product);
        self.forget_room(product);
        Ok(())
    }
}
