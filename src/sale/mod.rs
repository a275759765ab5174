//! The Redis side of a flash sale: where stock is deducted.
//!
//! A sale lives in Redis under keys that share the product id as hash tag
//! ([`keys`]); the Lua scripts in `lua/` change it ([`lua`]), each called
//! and decoded beside the handle that owns it. This module is the only code
//! that reads or writes a sale's keys, and it never talks to MySQL.
//! [`Sales`] builds one handle per role over one private core (`core`: the
//! connection, the key prefix, the memory, one bounded call); a consumer
//! takes the handles it needs and nothing else:
//!
//! | handle | what it does | where |
//! |---|---|---|
//! | [`OrderPath`] | the order path: memory first, then `place_order.lua` (check, deduct, append to the stream in one step), the orders of a sale that arrive together sharing a call; voiding what the replicas did not confirm | `orders/` |
//! | [`Accepted`] | what Redis holds of an accepted order: its record and progress, cancel requests, giving its units back or taking them again | `orders/accepted.rs` |
//! | [`Room`] | the waiting room: join, where a ticket stands, admissions, the pace (`room_tick.lua`) | `room/` |
//! | [`Lifecycle`] | open, close, the clock, the registry of open sales, a sale's end | `lifecycle/` |
//! | [`Watch`] | the one read model of a sale's stream and consumer group (dashboard, metrics, `flashsale streams`, the workers' checks) | `watch.rs` |
//! | [`Ledger`] | what the audit reads; restoring what Redis lost; a reset before a rebuild | `ledger/` |
//! | [`Streams`] | the workers' side of each sale's stream: read, claim, ack, reclaim, dead letters, sleep | `stream/` |
//! | [`Shards`] | a sale's stock shards: how many, what each holds, moving units between them | `shards.rs` |
//! | [`Fleet`] | the roll of the deployment's processes and their releases, for the dashboard | `fleet.rs` |
//! | [`Bells`] | what wakes a quiet sale's sleeping drains: its first order's `PUBLISH` | `stream/bells.rs` |
//!
//! Underneath: the connection ([`conn`], [`wait`] for `WAIT`), the one
//! error ([`SaleError`]), why an order is refused ([`Rejection`]) and what
//! an instance answers from memory ([`memory`]).

pub mod conn;
mod core;
pub mod durability;
mod error;
pub mod fleet;
pub mod keys;
mod ledger;
mod lifecycle;
mod lua;
pub mod memory;
mod orders;
mod rejection;
pub mod room;
pub mod shards;
pub mod stream;
pub mod wait;
pub mod watch;

use std::sync::Arc;

pub use conn::{Conn, Pool, Redis};
pub use core::{Counter, Counts};
pub use error::SaleError;
pub use fleet::Fleet;
pub use keys::SaleKeys;
pub use ledger::restore::{Booked, BookedState, Repairs, Restore, Restored};
pub use ledger::{DeadLetter, Ledger, SaleSnapshot};
pub use lifecycle::{Lifecycle, Paused, RestockAnswer, RestockBy, SaleSpec};
pub use memory::{Keyed, Memory};
pub use orders::{
    Accepted, DecidedBy, Decision, NewOrder, OrderPath, Placed, Progress, Retake, Vouched,
};
#[cfg(feature = "bench")]
pub use orders::{OrderCall, PlaceReply, place::place_orders as place_orders_on};
pub use rejection::{Rejection, SCRIPT_REFUSALS};
pub use room::Room;
pub use shards::{Move, Route, ShardLook, Shards};
pub use stream::bells::Bells;
pub use stream::entry::Entry;
pub use stream::{Claimed, SaleStream, Streams};
pub use watch::{StreamView, Watch};

use crate::config::{MemorySettings, RedisSettings, ReplicaWait};
use crate::domain::ProductId;

/// The sales of this deployment, as seen in Redis: builds the handles,
/// each over one private core. Cheap to clone; held by what assembles the
/// service (`app`, the CLI), which gives each consumer its handles.
#[derive(Clone)]
pub struct Sales {
    orders: OrderPath,
    accepted: Accepted,
    room: Room,
    lifecycle: Lifecycle,
    watch: Watch,
    ledger: Ledger,
    streams: Streams,
    bells: Bells,
    shards: Shards,
    fleet: Fleet,
    core: Arc<core::Core>,
}

impl Sales {
    /// The sales over the Redis `settings` name, answering orders from
    /// memory as `memory` says: handles made without connecting (Redis need
    /// not answer yet).
    pub fn from_settings(
        settings: &RedisSettings,
        memory: MemorySettings,
    ) -> Result<Self, SaleError> {
        Ok(Self::new(
            Redis::from_settings(settings)?,
            settings.key_prefix.clone(),
            memory,
            settings.wait,
        ))
    }

    /// The handles over `redis`, keys under `prefix`, answering from memory
    /// as `memory` says and confirming writes on replicas as `wait` says.
    pub fn new(
        redis: Redis,
        prefix: impl Into<String>,
        memory: MemorySettings,
        wait: Option<ReplicaWait>,
    ) -> Self {
        let core = Arc::new(core::Core {
            redis,
            prefix: prefix.into(),
            memory: Memory::new(memory),
            wait: wait.filter(|w| w.replicas > 0),
            counts: Arc::default(),
            shards: Default::default(),
        });
        let room = Room::new(core.clone());
        Self {
            bells: Bells::new(core.redis.clone(), &core.prefix),
            orders: OrderPath::new(core.clone(), room.clone()),
            accepted: Accepted::new(core.clone()),
            lifecycle: Lifecycle::new(core.clone(), room.clone()),
            watch: Watch::new(core.clone()),
            ledger: Ledger::new(core.clone()),
            streams: Streams::new(core.clone()),
            shards: Shards::new(core.clone()),
            fleet: Fleet::new(core.clone()),
            room,
            core,
        }
    }

    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    pub fn orders(&self) -> &OrderPath {
        &self.orders
    }

    pub fn accepted(&self) -> &Accepted {
        &self.accepted
    }

    pub fn room(&self) -> &Room {
        &self.room
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    pub fn bells(&self) -> &Bells {
        &self.bells
    }

    /// What this process sent to Redis, by kind.
    pub fn counts(&self) -> Arc<Counts> {
        self.core.counts.clone()
    }

    /// Once Redis answers, logs what its persistence risks (see
    /// [`durability`]); Redis asked again with bounded back-off until then.
    pub async fn check_persistence_when_up(&self) {
        durability::check_persistence_when_up(&self.core.redis).await
    }

    /// The keys' prefix (`REDIS_KEY_PREFIX`).
    pub fn prefix(&self) -> &str {
        &self.core.prefix
    }

    /// The sale's keys (for operators' tools and tests; handles build their own).
    pub fn keys(&self, product: &ProductId) -> SaleKeys {
        self.core.keys(product)
    }
}
