//! A payment as the payment side reports it, and what the books made of it.

use super::valid::{Invalid, invalid};

/// What the payment side says happened (the notification's `type`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
pub enum PaymentKind {
    /// The buyer paid.
    #[serde(rename = "payment.succeeded")]
    Succeeded,
    /// The attempt failed: the order stays `confirmed` until its timeout.
    #[serde(rename = "payment.failed")]
    Failed,
    /// The payment side gave a payment back (in full): a paid order is
    /// cancelled and its units return to the sale.
    #[serde(rename = "payment.refunded")]
    Refunded,
}

impl PaymentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "payment.succeeded",
            Self::Failed => "payment.failed",
            Self::Refunded => "payment.refunded",
        }
    }
}

impl TryFrom<String> for PaymentKind {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
        match s.as_str() {
            "payment.succeeded" => Ok(Self::Succeeded),
            "payment.failed" => Ok(Self::Failed),
            "payment.refunded" => Ok(Self::Refunded),
            other => Err(invalid(format!("{other:?} is no payment kind"))),
        }
    }
}

/// What the books made of a notification (`tb_payment.result`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PaymentResult {
    /// The order was `confirmed` and is now `paid`.
    Paid,
    /// The order had been cancelled by its payment timeout; the sale still
    /// had its units for this buyer, so it took them again and is `paid`.
    PaidAgain,
    /// Money taken for an order that cannot have it (cancelled by its
    /// payment timeout before the payment came, or paid already by
    /// another payment): owed back to the buyer, never dropped.
    RefundDue,
    /// The amount or currency is not the order's: recorded, the order
    /// unchanged.
    AmountMismatch,
    /// A failed attempt, recorded; the order unchanged.
    Failed,
    /// A refund of the payment that paid the order: the order is
    /// `cancelled` and its units go back to the sale.
    Refunded,
    /// A refund of a payment that was owed back (`refund_due`): settled,
    /// the order unchanged.
    RefundSettled,
    /// A refund of a payment the books do not hold as taken for this
    /// order: recorded, nothing changed.
    Unmatched,
}

impl PaymentResult {
    /// A refusal: the notification changed nothing because of what it said
    /// (a wrong amount, a refund of a payment not held). A corrected
    /// notification of the same payment (another message) is decided
    /// anew; a refusal is never the idempotent answer to it.
    pub fn is_refusal(self) -> bool {
        matches!(self, Self::AmountMismatch | Self::Unmatched)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::PaidAgain => "paid_again",
            Self::RefundDue => "refund_due",
            Self::AmountMismatch => "amount_mismatch",
            Self::Failed => "failed",
            Self::Refunded => "refunded",
            Self::RefundSettled => "refund_settled",
            Self::Unmatched => "unmatched",
        }
    }
}

impl TryFrom<String> for PaymentResult {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
        match s.as_str() {
            "paid" => Ok(Self::Paid),
            "paid_again" => Ok(Self::PaidAgain),
            "refunded" => Ok(Self::Refunded),
            "refund_settled" => Ok(Self::RefundSettled),
            "unmatched" => Ok(Self::Unmatched),
            "refund_due" => Ok(Self::RefundDue),
            "amount_mismatch" => Ok(Self::AmountMismatch),
            "failed" => Ok(Self::Failed),
            other => Err(invalid(format!("{other:?} is no payment result"))),
        }
    }
}

/// An ISO 4217 currency code: three capital letters (`CNY`, `USD`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency([u8; 3]);

impl std::fmt::Debug for Currency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Currency {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        match s.as_bytes() {
            &[a, b, c] if [a, b, c].iter().all(u8::is_ascii_uppercase) => Ok(Self([a, b, c])),
            _ => Err(invalid(format!(
                "{s:?} is not a currency code (three capital letters, ISO 4217)"
            ))),
        }
    }

    pub fn as_str(&self) -> &str {
        // Three ASCII capitals, checked in `parse`.
        std::str::from_utf8(&self.0).unwrap_or("???")
    }
}

impl std::fmt::Display for Currency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Currency {
    type Err = Invalid;

    fn from_str(s: &str) -> Result<Self, Invalid> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn currencies_are_three_capitals() {
        assert_eq!(
            Currency::parse("CNY").map(|c| c.to_string()),
            Ok("CNY".into())
        );
        for bad in ["cny", "CN", "CNYY", "C1Y", "", "人民币"] {
            assert!(Currency::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kinds_and_results_read_back_as_written() {
        for k in [
            PaymentKind::Succeeded,
            PaymentKind::Failed,
            PaymentKind::Refunded,
        ] {
            assert_eq!(PaymentKind::try_from(k.as_str().to_owned()), Ok(k));
        }
        for r in [
            PaymentResult::Paid,
            PaymentResult::PaidAgain,
            PaymentResult::RefundDue,
            PaymentResult::AmountMismatch,
            PaymentResult::Failed,
            PaymentResult::Refunded,
            PaymentResult::RefundSettled,
            PaymentResult::Unmatched,
        ] {
            assert_eq!(PaymentResult::try_from(r.as_str().to_owned()), Ok(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
