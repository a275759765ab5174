//! What every setting's bounds share.

/// The longest a timeout may be set to (a day).
pub(crate) const DAY_MS: u64 = 86_400_000;
