//! What a sale's Redis keys say of its books, for the audit and for
//! putting them right: the stock; a snapshot of the stock, the accepted
//! orders and the dead letters; restoring orders Redis lost
//! (reconciliation, recovery: [`restore`]); what reconciliation restored so
//! far; a reset before a rebuild.

pub(crate) mod restore;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use redis::AsyncCommands;

use super::core::Core;
use super::error::SaleError;
use super::shards;
use super::stream::entry::Entry;
use crate::domain::ProductId;
use restore::{Booked, RESTORE_CHUNK, Repairs, Restore, Restored};

/// The ledger handle.
#[derive(Clone)]
pub struct Ledger {
    core: Arc<Core>,
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

/// Fields one HSCAN step asks for.
const SCAN_STEP: usize = 1000;

impl Ledger {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// Units left, or `None` when the sale is not open in Redis (a sale
    /// of several stock shards: all of them, moves in flight counted).
    pub async fn stock(&self, product: &ProductId) -> Result<Option<u64>, SaleError> {
        let stock = self.units_left(product).await?;
        Ok(stock.map(|s| s.max(0) as u64))
    }

    async fn units_left(&self, product: &ProductId) -> Result<Option<i64>, SaleError> {
        let n = shards::count(&self.core, product).await?;
        if n > 1 {
            return shards::total_stock(&self.core, product, n).await;
        }
        let stock_key = self.core.keys(product).stock;
        self.core
            .call(|mut c| async move { c.get(&stock_key).await })
            .await
    }

    /// A sale's stock, accepted records, dead letters and repairs; of all
    /// its stock shards for a sale of several (the units left and moving
    /// between them summed, each shard's records and dead letters).
    pub async fn snapshot(&self, product: &ProductId) -> Result<SaleSnapshot, SaleError> {
        let n = shards::count(&self.core, product).await?;
        let mut whole = self.snapshot_of(product).await?;
        if n > 1 {
            whole.stock = shards::total_stock(&self.core, product, n).await?;
            for k in 1..n {
                let part = self.snapshot_of(&product.shard(k, n)).await?;
                whole.accepted.extend(part.accepted);
                whole.dead_letters.extend(part.dead_letters);
                whole.repairs.add(&part.repairs);
            }
        }
        Ok(whole)
    }

    /// One shard's (or a sale's of one shard) snapshot.
    async fn snapshot_of(&self, product: &ProductId) -> Result<SaleSnapshot, SaleError> {
        let keys = self.core.keys(product);
        let stock_key = keys.stock.clone();
        let stock: Option<i64> = self
            .core
            .call(|mut c| async move { c.get(&stock_key).await })
            .await?;
        // HSCAN in steps rather than one HGETALL: a sale of a million
        // orders would hold Redis (and every other sale's orders) for a
        // second; each step is short.
        let mut accepted = BTreeMap::new();
        let mut cursor: u64 = 0;
        loop {
            let scan = redis::cmd("HSCAN")
                .arg(&keys.accepted)
                .arg(cursor)
                .arg("COUNT")
                .arg(SCAN_STEP)
                .clone();
            let (next, page): (u64, Vec<(String, String)>) = self
                .core
                .call(|mut c| async move { scan.query_async(&mut c).await })
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
        Ok(SaleSnapshot {
            stock,
            accepted,
            dead_letters: self.dead_letters(product).await?,
            repairs: self.repairs(product).await?,
        })
    }

    /// Finishes the moves between the sale's stock shards left in flight,
    /// and mends those a failover cut in two (see
    /// `sale::shards::repair_moves`); how many.
    pub async fn repair_moves(&self, product: &ProductId) -> Result<usize, SaleError> {
        let n = shards::count(&self.core, product).await?;
        if n <= 1 {
            return Ok(0);
        }
        shards::repair_moves(&self.core, product, n).await
    }

    /// The orders in a sale's dead letters.
    pub async fn dead_letters(&self, product: &ProductId) -> Result<Vec<DeadLetter>, SaleError> {
        let dead = self.core.keys(product).dead;
        let entries: redis::Value = self
            .core
            .call(|mut c| async move { c.xrange_all(&dead).await })
            .await?;
        Ok(Entry::decode_list(entries)
            .map_err(redis::RedisError::from)?
            .iter()
            .map(|e| {
                let (order_id, quantity) = e.names();
                DeadLetter {
                    order_id,
                    quantity: quantity.unwrap_or(0),
                }
            })
            .collect())
    }

    /// Every entry in the sale's stream, acked or not (`XRANGE`; read-only).
    pub async fn stream_entries(&self, product: &ProductId) -> Result<Vec<Entry>, SaleError> {
        let orders = self.core.keys(product).orders;
        let stream: redis::Value = self
            .core
            .call(|mut c| async move { c.xrange_all(&orders).await })
            .await?;
        Ok(Entry::decode_list(stream).map_err(redis::RedisError::from)?)
    }

    /// Whether Redis has the sale (its hash, which lets orders in).
    pub async fn has_sale(&self, product: &ProductId) -> Result<bool, SaleError> {
        let sale = self.core.keys(product).sale;
        self.core
            .call(|mut c| async move { c.exists(&sale).await })
            .await
    }

    /// Orders in the sale's stream that are neither in `persisted` nor
    /// voided (taken back, never to be persisted): the orders a rebuild of
    /// the sale from MySQL would forget.
    pub async fn unpersisted_orders(
        &self,
        product: &ProductId,
        persisted: &HashSet<&str>,
    ) -> Result<usize, SaleError> {
        let void = self.core.keys(product).void;
        let voided: HashMap<String, String> = self
            .core
            .call(|mut c| async move { c.hgetall(&void).await })
            .await?;
        Ok(self
            .stream_entries(product)
            .await?
            .iter()
            .filter_map(|e| e.names().0)
            .filter(|id| {
                !persisted.contains(id.as_str())
                    && voided.get(id).is_none_or(|state| state != "void")
            })
            .count())
    }

    /// Brings the sale's Redis state in line with orders the books hold (see
    /// `lua/restore_booked.lua`): orders Redis lost come back with their
    /// units, buyer counts and idempotency records; releases it lost are
    /// done again. Idempotent, chunk by chunk atomic, safe while the sale
    /// takes orders. A [`Restore::Repair`] is recorded in the sale's repaired hash.
    pub async fn restore_booked(
        &self,
        product: &ProductId,
        booked: &[Booked],
        why: Restore,
    ) -> Result<Restored, SaleError> {
        let mut total = Restored::default();
        // Each order where it was decided: its id names its stock shard
        // (the sale itself for a sale of one).
        let mut by_shard: BTreeMap<String, Vec<Booked>> = BTreeMap::new();
        for b in booked {
            let shard = crate::domain::OrderId::parse(b.order.order_id.as_str())
                .map_or_else(|| product.clone(), |(_, of)| of);
            by_shard
                .entry(shard.into_string())
                .or_default()
                .push(b.clone());
        }
        for (shard, booked) in &by_shard {
            let shard = crate::domain::ProductId::parse_sale_or_shard(shard)
                .unwrap_or_else(|| product.clone());
            let keys = self.core.keys(&shard);
            for chunk in booked.chunks(RESTORE_CHUNK) {
                let keys = keys.clone();
                let done = self
                    .core
                    .call(|mut c| async move {
                        restore::restore_booked(&mut c, &keys, chunk, why).await
                    })
                    .await?;
                total = total.add(done);
            }
        }
        if by_shard.len() > 1 || by_shard.keys().any(|k| k.contains('~')) {
            // The sale's stock is all of its shards'.
            total.stock = self.units_left(product).await?.unwrap_or(0);
        }
        if booked.is_empty() {
            // No chunk sent, no stock read back: the stock as it stands (a
            // sale rebuilt with no order in the books kept 0 units here).
            total.stock = self.stock(product).await?.map_or(0, |s| s as i64);
        }
        if !total.is_empty() {
            self.core.memory.released(product, None);
        }
        Ok(total)
    }

    /// What reconciliation has restored in this sale so far (zeros: nothing).
    pub async fn repairs(&self, product: &ProductId) -> Result<Repairs, SaleError> {
        let repaired = self.core.keys(product).repaired;
        let h: HashMap<String, i64> = self
            .core
            .call(|mut c| async move { c.hgetall(&repaired).await })
            .await?;
        let get = |k: &str| h.get(k).copied().unwrap_or(0).max(0) as u64;
        Ok(Repairs {
            orders: get("orders"),
            units: get("units"),
            releases: get("releases"),
            idempotency_records: get("idempotency_records"),
            restocks: get("restocks"),
            restock_units: h.get("restock_units").copied().unwrap_or(0),
            last_ms: h.get("last_ms").copied(),
        })
    }

    /// Before `flashsale recover` rebuilds a sale from the books: drops what
    /// Redis has left of its state and sets the stock to `initial` (the
    /// sale hash stays away, so every order is refused until it is open).
    /// A sale of several stock shards (`shards`, as the books say): each
    /// shard's state dropped, shard 0 holding the stock (each shard's
    /// share is set when the sale is opened again).
    pub async fn reset(
        &self,
        product: &ProductId,
        initial: u64,
        shards: u16,
    ) -> Result<(), SaleError> {
        for k in (0..shards.max(1)).rev() {
            let keys = self.core.keys(&product.shard(k, shards.max(1)));
            let mut pipe = redis::pipe();
            pipe.atomic()
                .del(&[
                    &keys.sale,
                    &keys.stock,
                    &keys.bought,
                    &keys.released,
                    &keys.retaken,
                    &keys.accepted,
                    &keys.idem,
                    &keys.void,
                    &keys.moves,
                    &keys.gave,
                    &keys.moved_in,
                ])
                .ignore()
                .set(&keys.stock, if k == 0 { initial } else { 0 })
                .ignore();
            self.core
                .call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
                .await?;
        }
        self.core.memory.forget(product);
        self.core.shards.forget(product);
        Ok(())
    }
}

/// The quantity in an `accepted` record (see `place_order.lua`).
fn record_quantity(record: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(record)
        .ok()
        .and_then(|v| v["quantity"].as_i64())
        .unwrap_or(0)
}
