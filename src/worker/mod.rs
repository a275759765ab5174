//! The stream workers: move each sale's accepted orders from its Redis Stream
//! into MySQL, with the stream's consumer group as the only broker.
//!
//! A supervisor ([`Workers::run`], `supervisor.rs`) reads the registry of open sales every few
//! seconds and runs one drain task per sale ([`drain`]): `XREADGROUP` a batch,
//! one MySQL transaction, then `XACK`; `XAUTOCLAIM` for entries a crashed
//! consumer left pending; dead letters for entries that can never be
//! persisted; trimming of acked entries past their retention. Every command
//! touches one sale's keys only. Beside them, a periodic pass of the books'
//! [`Sweeper`] (payment timeouts, interrupted cancels), the [`reconciler`]
//! (what a failover lost in Redis, restored from the books) and the
//! retirement passes (`bookkeeping::retire`: ended, settled sales leave the
//! registry, so their drains stop).

pub mod activity;
pub mod deliver;
pub mod drain;
mod error;
pub mod every;
mod parts;
mod periodic;
pub mod reconciler;
pub mod repair;
mod supervisor;

pub use drain::{Outcome, SaleWorker};
pub use error::WorkerError;
pub use parts::Workers;
pub use supervisor::Drains;
