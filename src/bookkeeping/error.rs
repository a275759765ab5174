//! The books' one error: what an operation across MySQL and Redis refuses,
//! or which store failed.

use crate::sale::SaleError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BookkeepingError {
    #[error("no order with this id")]
    NotFound,
    /// Accepted, not in the books yet: asked again shortly, it will be.
    #[error("the order is still pending")]
    Pending,
    #[error("this payment id was recorded for another order")]
    PaymentIdReused,
    #[error("no product with this id")]
    NoProduct,
    /// Closed early or retired: the sale cannot be opened again.
    #[error("the sale is closed")]
    SaleClosed,
    #[error("the order belongs to another user")]
    Forbidden,
    #[error("the order is {0}")]
    InvalidTransition(String),
    /// A restock taking away more units than are left.
    #[error("only {0} units left")]
    TooFewLeft(u64),
    #[error("the sale has ended")]
    SaleEnded,
    /// An operation refused for a reason an operator can fix.
    #[error("{0}")]
    Refused(String),
    /// MySQL holds what the service never writes (a bug, or a hand edit).
    #[error("unexpected data in mysql: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Sale(#[from] SaleError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
