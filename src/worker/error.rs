//! The one error of `worker`: a failure of Redis, MySQL or the books.

use crate::sale::SaleError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Redis(#[from] SaleError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    OrderLife(#[from] crate::bookkeeping::BookkeepingError),
}
