//! The sweeper: the workers' periodic pass over the books. It cancels orders
//! unpaid past the payment timeout (each by one process: `SKIP LOCKED`),
//! finishes cancels interrupted between their MySQL and Redis halves, and
//! applies cancels asked while an order was still pending.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::WorkerConfig;
use crate::books::{Books, BooksError};
use crate::sale::Sales;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub expired: usize,
    pub repaired: usize,
    pub requests_applied: usize,
}

/// Orders handled per query, so a pass stays short.
const BATCH: u32 = 200;

pub struct Sweeper {
    books: Books,
    sales: Sales,
    payment_timeout: Duration,
    release_grace: Duration,
}

impl Sweeper {
    pub fn new(books: Books, sales: Sales, cfg: &WorkerConfig) -> Self {
        Self {
            books,
            sales,
            payment_timeout: cfg.payment_timeout,
            release_grace: cfg.release_grace,
        }
    }

    /// One pass.
    pub async fn sweep(&self) -> Result<Swept, BooksError> {
        let expired = self
            .books
            .cancel_expired(self.payment_timeout, BATCH)
            .await?;
        let repaired = self
            .books
            .repair_releases(self.release_grace, BATCH)
            .await?;
        let mut requests_applied = 0;
        for product in self.sales.open_sales().await? {
            requests_applied += self.books.apply_cancel_requests(&product).await?;
        }
        Ok(Swept {
            expired,
            repaired,
            requests_applied,
        })
    }
}

/// Sweeps every `every` until `shutdown`.
pub async fn run(sweeper: Sweeper, every: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = sweeper.sweep().await {
            tracing::warn!(error = %e, "sweep failed; next pass retries");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
