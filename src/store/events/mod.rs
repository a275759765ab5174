//! `tb_event`, the outbox: each change of an order written as an event in
//! the transaction that makes the change (an order persisted, paid,
//! cancelled; a payment owed back), and the sale's own (sold out, ended,
//! retired), so an event exists exactly when its change does, and readers
//! take them in `id` order.

mod delivery;
mod feed;
mod stored;

pub use delivery::{DeadEvent, Deliveries, Delivery};
pub use feed::Events;
pub use stored::{EVENTS_PER_ROW, EventKind, EventRow, SKIP_AHEAD_ROWS};
pub(crate) use stored::{record, record_sale, sold_out_if_none_left};
