//! Where an order (`OrderStatus`) and a sale (`SaleState`) stand.

use super::valid::{Invalid, invalid};

/// Where an order stands, as clients see it. The books (`tb_order.status`)
/// hold the last three; `pending` is an order still in its sale's stream,
/// `cancelling` one whose cancel waits for it to be persisted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Pending,
    Cancelling,
    /// In the books, awaiting payment.
    Confirmed,
    Paid,
    Cancelled,
}

impl OrderStatus {
    /// As written in `tb_order.status` and in answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Cancelling => "cancelling",
            Self::Confirmed => "confirmed",
            Self::Paid => "paid",
            Self::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status as the books hold it (`tb_order.status`).
impl TryFrom<String> for OrderStatus {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
        match s.as_str() {
            "confirmed" => Ok(Self::Confirmed),
            "paid" => Ok(Self::Paid),
            "cancelled" => Ok(Self::Cancelled),
            other => Err(invalid(format!("{other:?} is no status of the books"))),
        }
    }
}

/// Where a sale is in its life (`docs/end-of-life.md`): `created` (not
/// opened), `closed` (closed before it opened), `upcoming`, `live`,
/// `ended` (not retired yet), `unsettled` (ended, and something other than
/// time holds it: `flashsale sales` says what), `retired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SaleState {
    Created,
    Closed,
    Upcoming,
    Live,
    Ended,
    Unsettled,
    Retired,
}

impl SaleState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Closed => "closed",
            Self::Upcoming => "upcoming",
            Self::Live => "live",
            Self::Ended => "ended",
            Self::Unsettled => "unsettled",
            Self::Retired => "retired",
        }
    }
}

impl std::fmt::Display for SaleState {
    /// Padded as asked (`{:<10}`), for tables.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}
