//! The books the operators' side works with.

use crate::bookkeeping::{Audit, Catalog, Outbox, Reports};

/// What the operators' side runs on across both stores: a sale's admin,
/// its audit, its report, its events.
#[derive(Clone)]
pub struct SaleDesk {
    /// Sales as an admin runs them.
    pub catalog: Catalog,
    /// Each sale's books, checked.
    pub audit: Audit,
    /// How each sale went (its timeline and its books).
    pub reports: Reports,
    /// The events, pulled in order, and their dead letters.
    pub outbox: Outbox,
}
