//! The background reads that keep the memory of the order path fresh (no
//! order waits for them): a sale's window and its Redis node's clock
//! (`sale_clock.lua`), and its stock, to renew a sold-out mark.

use std::sync::Arc;

use redis::AsyncCommands;
use tokio::time::Instant;

use crate::domain::{Chain, ProductId};
use crate::sale::core::Core;
use crate::sale::lifecycle::clock::sale_clock;

/// Reads a sale's stock, to renew its sold-out mark.
pub(super) fn renew_sold_out(core: &Arc<Core>, product: &ProductId) {
    let product = product.clone();
    core.in_background(|core| async move {
        let stock_key = core.keys(&product).stock;
        let sent = Instant::now();
        // A sale of several stock shards: all of them, moves in flight
        // counted (units a cancel gave back to one shard are the sale's).
        let read = async {
            match core.shards.known(&product).unwrap_or(1) {
                1 => core.call(|mut c| async move { c.get::<_, Option<i64>>(&stock_key).await }).await,
                n => crate::sale::shards::total_stock(&core, &product, n).await,
            }
        };
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
pub(super) fn refresh_sale_clock(core: &Arc<Core>, product: &ProductId) {
    let product = product.clone();
    core.in_background(|core| async move {
        let keys = core.keys(&product);
        let sent = core.memory.now();
        let read = core.call(|mut c| async move { sale_clock(&mut c, &keys).await });
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
