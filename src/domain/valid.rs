//! The bounds of every value, and the checks of values that need no type.

use rust_decimal::Decimal;

/// The longest product id accepted (the `tb_product.product_id` column).
pub const MAX_PRODUCT_ID_LEN: usize = 128;
/// The most units one order may ask for; anything larger is a malformed request.
pub const MAX_QUANTITY: u64 = 1_000_000;
/// The most units a product may be created with.
pub const MAX_STOCK: u64 = 1_000_000_000;
/// Latest accepted timestamp: 9999-12-31T23:59:59.999Z in epoch milliseconds.
pub const MAX_TIME_MS: i64 = 253_402_300_799_999;
/// Longest accepted `Idempotency-Key` header.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// Why a value was refused; the text names the field, for the 400 message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

pub(super) fn invalid(msg: impl Into<String>) -> Invalid {
    Invalid(msg.into())
}

/// Now, in epoch milliseconds (the clock of every layer).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A unit price: non-negative, at most 18 decimal places (the column's scale).
pub fn price(v: Decimal) -> Result<Decimal, Invalid> {
    if v.is_sign_negative() && !v.is_zero() {
        return Err(invalid("price must not be negative"));
    }
    if v.scale() > 18 {
        return Err(invalid("price must have at most 18 decimal places"));
    }
    Ok(v.normalize())
}

/// An epoch-millisecond timestamp: 0..=MAX_TIME_MS.
pub fn time_ms(field: &str, v: i64) -> Result<i64, Invalid> {
    if !(0..=MAX_TIME_MS).contains(&v) {
        return Err(invalid(format!(
            "{field} must be epoch milliseconds between 0 and {MAX_TIME_MS}"
        )));
    }
    Ok(v)
}

/// An `Idempotency-Key`: 1..=128 visible ASCII characters.
pub fn idempotency_key(v: &str) -> Result<&str, Invalid> {
    if v.is_empty() || v.len() > MAX_IDEMPOTENCY_KEY_LEN || !v.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(invalid(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        )));
    }
    Ok(v)
}
