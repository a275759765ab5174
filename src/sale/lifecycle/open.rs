//! Opening a sale in Redis (`open_sale.lua`): its hash, stock, stream and
//! consumer group, and its waiting room, unless it is open already.

use redis::{RedisResult, aio::ConnectionLike};
use rust_decimal::Decimal;

use crate::sale::keys::{GROUP, SaleKeys};
use crate::sale::lua::script;

/// The settings a sale is opened with (from its `tb_product` row).
#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub stock: u64,
    pub start_ms: i64,
    pub end_ms: i64,
    pub limit_per_user: u64,
    pub price: Decimal,
    pub waiting_room: Option<crate::domain::WaitingRoom>,
    /// Paused since (epoch ms): the sale opens paused (`None`: live).
    pub paused_ms: Option<i64>,
    /// Stock shards (1: one, the keys a sale always had; see
    /// `sale::shards`).
    pub shards: u16,
}

impl SaleSpec {
    /// Shard `k`'s share of `stock` units: an even split, the first shards
    /// taking one more each until the rest is placed.
    pub fn share(&self, stock: u64, k: u16) -> u64 {
        let n = u64::from(self.shards.max(1));
        stock / n + u64::from(u64::from(k) < stock % n)
    }
}

script!(OPEN_SALE, "open_sale");

/// `open_sale.lua`: returns `(opened_now, stock_left)`. `room_key`: the
/// waiting room's key (hex), kept only if this call loads the sale.
pub async fn open_sale(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    spec: &SaleSpec,
    room_key: &str,
    (shard, stock): (u16, u64),
) -> RedisResult<(bool, u64)> {
    let room = spec.waiting_room.as_ref();
    OPEN_SALE
        .key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.orders)
        .key(&keys.room)
        .key(&keys.room_log)
        .key(&keys.room_used)
        .arg(stock)
        .arg(spec.start_ms)
        .arg(spec.end_ms)
        .arg(spec.limit_per_user)
        .arg(spec.price.to_string())
        .arg(GROUP)
        .arg(room.map_or(String::new(), |r| r.ceiling_per_sec.to_string()))
        .arg(room.map_or(0, |r| u64::from(r.admission_secs) * 1000))
        .arg(room.map_or(0, |r| u64::from(r.join_early_secs) * 1000))
        .arg(room_key)
        .arg(room.map_or(0, |r| r.floor()))
        .arg(room.map_or(0, |r| r.active_cap.unwrap_or(0)))
        .arg(room.map_or(0, |r| r.join_difficulty.unwrap_or(0)))
        .arg(spec.paused_ms.map_or(String::new(), |ms| ms.to_string()))
        .arg(spec.shards.max(1))
        .arg(shard)
        .invoke_async(conn)
        .await
}
