//! Restoring in Redis what the books hold (`restore_booked.lua`): orders
//! Redis lost come back with their units, buyer counts and idempotency
//! records; releases it lost are done again.

use redis::{RedisResult, aio::ConnectionLike};

use crate::domain::PendingOrder;
use crate::sale::keys::SaleKeys;
use crate::sale::lua::script;
use crate::sale::orders::record::{booked_record, idempotency_field};

/// Why orders are restored from the books: a repair after Redis lost some
/// writes (counted in the sale's `repaired` hash, shown by the audit), or
/// the rebuild of a sale Redis lost whole (`flashsale recover`, not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    Repair,
    Rebuild,
}

/// An order as the books (MySQL) hold it, for `Ledger::restore_booked`.
#[derive(Debug, Clone)]
pub struct Booked {
    pub order: PendingOrder,
    pub state: BookedState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookedState {
    /// Confirmed or paid: its units are sold.
    Sold,
    /// Cancelled; its units are not yet back in Redis.
    Cancelled,
    /// Cancelled, and its units were given back to Redis.
    Returned,
}

/// What `Ledger::restore_booked` put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Restored {
    /// Orders Redis did not know.
    pub orders: u64,
    /// Units taken off the stock for them.
    pub units: u64,
    /// Releases Redis had lost, done again.
    pub releases: u64,
    /// Idempotency records restored.
    pub idempotency_records: u64,
    /// The sale's stock after the last chunk (negative: oversold by that much).
    pub stock: i64,
}

impl Restored {
    pub(super) fn add(self, o: Restored) -> Restored {
        Restored {
            orders: self.orders + o.orders,
            units: self.units + o.units,
            releases: self.releases + o.releases,
            idempotency_records: self.idempotency_records + o.idempotency_records,
            stock: o.stock,
        }
    }

    /// True when Redis had lost nothing.
    pub fn is_empty(&self) -> bool {
        self.orders == 0 && self.releases == 0 && self.idempotency_records == 0
    }
}

/// What reconciliation restored in a sale over its life (its `repaired` hash).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Repairs {
    pub orders: u64,
    pub units: u64,
    pub releases: u64,
    pub idempotency_records: u64,
    /// Restocks the books held and Redis had lost, made again, and the
    /// units they moved (signed).
    pub restocks: u64,
    pub restock_units: i64,
    /// When the last repair was made (Redis time, epoch ms).
    pub last_ms: Option<i64>,
}

impl Repairs {
    /// Another shard's repairs counted in.
    pub fn add(&mut self, other: &Repairs) {
        self.orders += other.orders;
        self.units += other.units;
        self.releases += other.releases;
        self.idempotency_records += other.idempotency_records;
        self.restocks += other.restocks;
        self.restock_units += other.restock_units;
        self.last_ms = self.last_ms.max(other.last_ms);
    }
}

/// Orders per `restore_booked.lua` call (bounded script run time).
pub(super) const RESTORE_CHUNK: usize = 200;

script!(RESTORE_BOOKED, "restore_booked");

/// `restore_booked.lua` for one chunk of orders.
pub async fn restore_booked(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    booked: &[Booked],
    why: Restore,
) -> RedisResult<Restored> {
    let mut call = RESTORE_BOOKED.prepare_invoke();
    call.key(&keys.accepted)
        .key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.released)
        .key(&keys.idem)
        .key(&keys.repaired)
        .key(&keys.retaken)
        .arg(match why {
            Restore::Repair => "1",
            Restore::Rebuild => "0",
        });
    for b in booked {
        let o = &b.order;
        let state = match b.state {
            BookedState::Sold => "sold",
            BookedState::Cancelled => "cancelled",
            BookedState::Returned => "returned",
        };
        let field = o
            .idempotency_key
            .as_ref()
            .map(|k| idempotency_field(o.user_id, k))
            .unwrap_or_default();
        call.arg(o.order_id.as_str())
            .arg(o.user_id)
            .arg(o.quantity)
            .arg(state)
            .arg(booked_record(o))
            .arg(field);
    }
    let (orders, units, releases, idempotency_records, stock): (u64, u64, u64, u64, i64) =
        call.invoke_async(conn).await?;
    Ok(Restored {
        orders,
        units,
        releases,
        idempotency_records,
        stock,
    })
}
