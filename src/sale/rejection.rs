//! Why the order path refuses an order: the order script's answers, which
//! this process's memory (`sale::memory`) and the waiting room also give
//! without asking Redis.
//!
//! [`SCRIPT_REFUSALS`] is the one table between the order script's codes
//! and the API's: adding a refusal touches the script, this table and
//! [`Rejection`]; the compiler names every other place (the decoding in
//! `orders/place.rs`, the memory, the API's error, the dashboard).

use crate::domain::answer::Code;

/// The order script's refusals (`lua/place_order.lua`): the code the
/// script answers, and the API's code for it (docs/api.md). The script's
/// other answers are an acceptance, `repeat` (a keyed retry), `shard` (the
/// caller's shard count is stale) and `no_sale` (the API's
/// `product_not_found`).
pub const SCRIPT_REFUSALS: [(&str, Code); 7] = [
    ("not_started", Code::SaleNotStarted),
    ("ended", Code::SaleEnded),
    ("paused", Code::SalePaused),
    ("admission_required", Code::AdmissionRequired),
    ("sold_out", Code::SoldOut),
    ("limit", Code::LimitExceeded),
    ("insufficient", Code::InsufficientStock),
];

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
    /// The API's code for this refusal.
    pub fn code(&self) -> Code {
        match self {
            Self::NoSale => Code::ProductNotFound,
            Self::NotStarted { .. } => Code::SaleNotStarted,
            Self::Ended => Code::SaleEnded,
            Self::SoldOut => Code::SoldOut,
            Self::InsufficientStock { .. } => Code::InsufficientStock,
            Self::LimitExceeded { .. } => Code::LimitExceeded,
            Self::AdmissionRequired => Code::AdmissionRequired,
            Self::Paused { .. } => Code::SalePaused,
        }
    }

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
