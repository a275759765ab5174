//! What the order path is asked ([`NewOrder`]) and what it decides
//! ([`Decision`]).

use crate::domain::{PendingOrder, ProductId, Quantity, UserId};
use crate::sale::rejection::Rejection;

/// One order to decide.
#[derive(Debug, Clone, Copy)]
pub struct NewOrder<'a> {
    pub product: &'a ProductId,
    pub user_id: UserId,
    pub quantity: Quantity,
    pub idempotency_key: Option<&'a str>,
    pub vouched: Vouched,
}

/// What the order path decided: a refusal is an answer, not a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Accepted (or the first order of its Idempotency-Key, answered again).
    Placed(Placed),
    /// Refused by the sale's rules; nothing changed.
    Refused { why: Rejection, by: DecidedBy },
}

/// Who decided a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// This process's memory of Redis's answers (see `sale::memory`),
    /// without asking Redis.
    Memory,
    /// The order script.
    Redis,
}

impl Decision {
    /// A refusal this process's memory gave.
    pub(super) fn remembered(why: Rejection) -> Self {
        Self::Refused {
            why,
            by: DecidedBy::Memory,
        }
    }

    /// A refusal the order script gave.
    pub(super) fn refused(why: Rejection) -> Self {
        Self::Refused {
            why,
            by: DecidedBy::Redis,
        }
    }
}

/// Whether the caller checked the buyer's admission from the sale's
/// waiting room: a sale with a room refuses every order not vouched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vouched {
    /// The API checked a valid admission for this buyer and sale.
    /// `counted_in`: with an active cap, the bucket of its expiry, where
    /// the order script counts the place as used (`room_used`).
    Admitted { counted_in: Option<i64> },
    /// No admission (none needed, or none valid: the script decides).
    No,
}

/// What `place_order` did with an order it did not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub order: PendingOrder,
    /// True when the idempotency key had been seen: this is the first order, and
    /// nothing was deducted this time.
    pub replayed: bool,
}
