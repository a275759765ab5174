//! Why the order path refuses an order: the order script's answers, which
//! this process's memory (`sale::memory`) and the waiting room also give
//! without asking Redis.

/// Why the order script refused an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The sale is not open in Redis (unknown product, or created but not opened).
    NoSale,
    /// The sale opens at `starts_at_ms` (epoch ms), in about `in_ms` by Redis's clock.
    NotStarted {
        starts_at_ms: i64,
        in_ms: u64,
    },
    Ended,
    SoldOut,
    /// Some stock is left, but less than the order asks for.
    InsufficientStock {
        left: u64,
    },
    /// The order would take the buyer over the per-user limit.
    LimitExceeded {
        allowance: u64,
    },
    /// The sale has a waiting room, and the buyer brought no valid admission.
    AdmissionRequired,
    /// An operator paused the sale (since `since_ms`, epoch ms).
    Paused {
        since_ms: i64,
    },
}

impl Rejection {
    /// The refusal of an order Redis's clock (`now_ms`) puts outside the
    /// sale's window, which starts at `start_ms`.
    pub fn outside_window(start_ms: i64, now_ms: i64) -> Self {
        if now_ms < start_ms {
            Self::NotStarted {
                starts_at_ms: start_ms,
                in_ms: (start_ms - now_ms) as u64,
            }
        } else {
            Self::Ended
        }
    }
}
