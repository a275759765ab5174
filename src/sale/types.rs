//! The types every part of `sale` shares: its error, the order path's
//! decision, a sale's settings, and what the books and Redis say of an
//! order.

use std::time::Duration;

use rust_decimal::Decimal;
use serde::Deserialize;

use crate::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId};

/// A failure to get an answer from Redis. `Clone`: the orders that shared
/// a call share its failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SaleError {
    #[error("redis")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis pool")]
    Pool(#[from] bb8::RunError<redis::RedisError>),
    /// The order was accepted, but fewer replicas than asked confirmed it
    /// within the WAIT timeout: it could be lost in a failover.
    #[error("order not confirmed by {wanted} replicas ({acked} did)")]
    NotReplicated { acked: u32, wanted: u32 },
    /// A script or key held something this code did not write: a bug or a
    /// foreign writer, never the caller's fault.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
    /// The task sending the order's call ended without an answer (the
    /// process is shutting down): the order may or may not be placed.
    #[error("the order's call ended without an answer")]
    Dropped,
}

impl SaleError {
    /// True when Redis is down, slow or refusing service (a 503, not a bug).
    pub fn is_unavailable(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            Self::Timeout(_) | Self::Pool(_) | Self::NotReplicated { .. } | Self::Dropped => true,
            Self::Redis(e) => match e.kind() {
                ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::AuthenticationFailed
                | ErrorKind::Extension => true,
                // Moved/Ask surface only when the client's own retries ran out
                // (a slot whose master is gone, mid-failover).
                ErrorKind::Server(kind) => matches!(
                    kind,
                    ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::NoPerm
                ),
                _ => e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout(),
            },
            Self::Corrupt(_) => false,
        }
    }
}

/// What the order path decided: a refusal is an answer, not a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Accepted (or the first order of its Idempotency-Key, answered again).
    Placed(Placed),
    /// Refused by the sale's rules; nothing changed.
    Refused { why: Rejection, by: AnsweredBy },
}

/// Who decided a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// This process's memory of Redis's answers (see `sale::memory`),
    /// without asking Redis.
    Memory,
    /// The order script.
    Redis,
}

impl Decision {
    pub(super) fn remembered(why: Rejection) -> Self {
        Self::Refused {
            why,
            by: AnsweredBy::Memory,
        }
    }
}

/// Whether the caller checked the buyer's admission from the sale's
/// waiting room: a sale with a room refuses every order not vouched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vouched {
    /// The API checked a valid admission for this buyer and sale.
    Admitted,
    /// No admission (none needed, or none valid: the script decides).
    No,
}

/// Whether an order carries an Idempotency-Key: its retry must get its
/// order back, which only the script can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyed {
    Yes,
    No,
}

impl Keyed {
    pub fn of<T>(key: Option<T>) -> Self {
        match key {
            Some(_) => Self::Yes,
            None => Self::No,
        }
    }
}

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

/// The settings a sale is opened with (from its `tb_product` row).
#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub stock: u64,
    pub start_ms: i64,
    pub end_ms: i64,
    pub limit_per_user: u64,
    pub price: Decimal,
    pub waiting_room: Option<crate::domain::WaitingRoom>,
}

/// How far an accepted order got, as far as Redis knows (`order_state.lua`).
/// MySQL knows more (paid, cancelled before the units came back): this is
/// for answering while it is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// In the stream, not yet persisted.
    Queued,
    /// Persisted (acked by a worker): `confirmed` or later in MySQL.
    Persisted,
    /// A cancel waits for the order to be persisted.
    CancelRequested,
    /// Cancelled, and its units are back on sale.
    Released,
    /// In dead letters: never persisted, waiting for an operator.
    DeadLettered,
}

/// What `place_order` did with an order it did not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub order: PendingOrder,
    /// True when the idempotency key had been seen: this is the first order, and
    /// nothing was deducted this time.
    pub replayed: bool,
}

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
    /// When the last repair was made (Redis time, epoch ms).
    pub last_ms: Option<i64>,
}

/// The `accepted` record of an order restored from the books: no stream
/// entry (it is persisted), marked `booked`.
pub(super) fn booked_record(o: &PendingOrder) -> String {
    serde_json::json!({
        "user_id": o.user_id,
        "quantity": o.quantity,
        "price": o.price.to_string(),
        "created_ms": o.created_ms,
        "booked": true,
    })
    .to_string()
}

/// Orders per `restore_booked.lua` call (bounded script run time).
pub(super) const RESTORE_CHUNK: usize = 200;

/// An order's record in the `accepted` hash, as `place_order.lua` writes it.
#[derive(Debug, Deserialize)]
pub(super) struct AcceptedRecord {
    #[serde(default)]
    idempotency_key: Option<String>,
    user_id: u64,
    quantity: u64,
    price: Decimal,
    created_ms: i64,
}

impl AcceptedRecord {
    pub(super) fn parse(
        json: &str,
        order_id: OrderId,
        product_id: ProductId,
    ) -> Result<PendingOrder, SaleError> {
        let r: Self = serde_json::from_str(json)
            .map_err(|e| SaleError::Corrupt(format!("order record {order_id}: {e}")))?;
        let corrupt =
            |e: crate::domain::Invalid| SaleError::Corrupt(format!("order record: {}", e.0));
        Ok(PendingOrder {
            order_id,
            user_id: UserId::new(r.user_id).map_err(corrupt)?,
            product_id,
            quantity: Quantity::new(r.quantity).map_err(corrupt)?,
            price: r.price,
            created_ms: r.created_ms,
            idempotency_key: r.idempotency_key,
        })
    }
}
