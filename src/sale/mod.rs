//! The Redis side of a flash sale: where stock is deducted.
//!
//! A sale lives in Redis under keys that share the product id as hash tag
//! ([`keys`]); the Lua scripts in `lua/` change it ([`scripts`], each with
//! its contract). This module is the only code that reads or writes a
//! sale's keys, and it never talks to MySQL. [`Sales`] hands out one handle
//! per role, all over one private core ([`core`]: the connection, the key
//! prefix, the memory, one bounded `call`):
//!
//! | handle | what it does | where |
//! |---|---|---|
//! | [`Orders`] | the order path (memory first, then `place_order.lua`: check, deduct, enqueue in one step, for the orders of the sale that arrived together: `line.rs`); voids; the workers' claim; an order's record and progress; cancel requests; giving units back | `orders.rs` |
//! | [`Room`] | the waiting room: join, where a ticket stands, admissions, the pace (`room_tick.lua`) | `room/` |
//! | [`Lifecycle`] | open, close, the clock, the registry, a sale's end | `lifecycle.rs` |
//! | [`Queue`] | the one read model of a sale's queue (dashboard, metrics, `flashsale streams`, the workers' checks) | `queue.rs` |
//! | [`Ledger`] | what the audit reads; restoring what Redis lost; a reset before a rebuild | `ledger.rs` |
//! | [`SaleStream`] | the consumer group's side of one sale's stream | `stream.rs` |
//! | [`Bells`] | what wakes a quiet sale's sleeping drains: its first order's `PUBLISH` | `bells.rs` |
//!
//! [`memory`] answers the orders that cannot change the books (outside the
//! window, sold out, at the limit, unknown product) from Redis's earlier
//! answers, without a round trip. Shared types are in `types.rs`.

pub mod bells;
mod conn;
mod core;
pub mod durability;
mod entry;
pub mod keys;
mod ledger;
mod lifecycle;
mod line;
pub mod memory;
mod orders;
pub mod queue;
pub mod room;
mod scripts;
mod stream;
mod types;

use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use bells::Bells;
pub use conn::{Conn, Pool, Redis, RedisTarget, Wait};
pub use entry::Entry;
pub use keys::SaleKeys;
pub use ledger::{DeadLetter, Ledger, SaleSnapshot};
pub use lifecycle::Lifecycle;
pub use memory::{Memory, MemorySettings};
pub use orders::{NewOrder, Orders};
pub use queue::{Queue, QueueView};
pub use room::Room;
pub use scripts::Retake;
#[cfg(feature = "bench")]
pub use scripts::{OrderCall, PlaceReply, place_orders as place_orders_on};
pub use stream::{Claimed, SaleStream};
pub use types::*;

use crate::domain::ProductId;

/// The sales of this deployment, as seen in Redis: a handle per role over
/// one private core. Cheap to clone; a consumer keeps the handles it needs.
#[derive(Clone)]
pub struct Sales {
    pub orders: Orders,
    pub room: Room,
    pub lifecycle: Lifecycle,
    pub queue: Queue,
    pub ledger: Ledger,
    /// What wakes this process's sleeping drains (see [`bells`]).
    pub bells: Bells,
    core: Arc<core::Core>,
}

impl Sales {
    /// The handles over `redis`, keys under `prefix`, answering from memory
    /// as `memory` says and confirming writes on replicas as `wait` says.
    pub fn new(
        redis: Redis,
        prefix: impl Into<String>,
        memory: MemorySettings,
        wait: Option<Wait>,
    ) -> Self {
        let core = Arc::new(core::Core {
            redis,
            prefix: prefix.into(),
            memory: Memory::new(memory),
            wait: wait.filter(|w| w.replicas > 0),
            calls: core::Calls::default(),
        });
        let room = Room::new(core.clone());
        Self {
            bells: Bells::new(&core.prefix),
            orders: Orders::new(core.clone(), room.clone()),
            lifecycle: Lifecycle::new(core.clone(), room.clone()),
            queue: Queue::new(core.clone()),
            ledger: Ledger::new(core.clone()),
            room,
            core,
        }
    }

    /// One sale's stream, for consumer `consumer` of its group.
    pub fn stream(&self, product: &ProductId, consumer: &str) -> SaleStream {
        SaleStream::new(self.core.redis.clone(), self.keys(product), consumer)
    }

    /// The keys' prefix (`REDIS_KEY_PREFIX`).
    pub fn prefix(&self) -> &str {
        &self.core.prefix
    }

    /// The sale's keys (for operators' tools and tests; handles build their own).
    pub fn keys(&self, product: &ProductId) -> SaleKeys {
        self.core.keys(product)
    }

    /// Holds this process's bell subscription until `shutdown` (see [`bells`]).
    pub async fn listen_for_bells(&self, shutdown: tokio_util::sync::CancellationToken) {
        self.bells.listen(&self.core.redis, shutdown).await
    }

    /// Redis answers a `PING` (the service's readiness).
    pub async fn ping(&self) -> Result<(), SaleError> {
        self.core.redis.ping().await
    }

    /// Logs the risks of Redis's persistence settings once Redis answers
    /// (asked again with back-off while it does not): see [`durability`].
    pub async fn check_persistence_when_up(&self) {
        durability::check_persistence_when_up(&self.core.redis).await
    }

    /// `place_order.lua` calls this process has sent.
    pub fn script_calls(&self) -> u64 {
        self.core.calls.orders.load(Ordering::Relaxed)
    }

    /// The orders those calls carried.
    pub fn script_orders(&self) -> u64 {
        self.core.calls.orders_sent.load(Ordering::Relaxed)
    }

    /// Background reads that keep the memory fresh (a sale's window and
    /// clock, the registry), sent by this process.
    pub fn memory_reads(&self) -> u64 {
        self.core.calls.memory_reads.load(Ordering::Relaxed)
    }

    /// Waiting-room scripts (`room_tick.lua`, `room_join.lua`) this
    /// process has sent.
    pub fn room_calls(&self) -> u64 {
        self.core.calls.rooms.load(Ordering::Relaxed)
    }
}
