//! One sale's drain: a step (read a batch, persist it in one transaction, ack)
//! and a loop around it (waiting, back-off, reclaiming, trimming, shutdown).
//!
//! The invariant: an entry is acked only after its row is committed (or after
//! its dead letter is written). A crash anywhere leaves the entry pending, to
//! be re-read by this consumer or reclaimed by another; the UNIQUE order id
//! makes the second insert a no-op.

mod consumer;
mod run;
mod settle;

pub use consumer::SaleWorker;
pub use run::run_sale;
pub use settle::Outcome;
