//! The books: an order's life after its 202, across MySQL and Redis, and the
//! checks that nothing was lost.
//!
//! A cancel has two halves, in this order: (1) one MySQL transaction moves the
//! order `confirmed` → `cancelled` (guarded, so it happens once) and gives the
//! units back to `available_qty`, with `released = 0`; (2) `release_stock.lua`
//! gives them back to the Redis stock and the buyer's allowance, at most once
//! per order (its released set), then `released = 1`. A crash between the two
//! leaves `cancelled` + `released = 0`, which the workers' sweeper finds and
//! finishes; since the Redis half is idempotent, finishing it twice counts once.
//!
//! [`Sweeper`] is the workers' periodic pass (payment timeouts, unfinished
//! cancels); [`audit`] proves the books balance; [`reconcile`] restores in
//! Redis what a failover lost of a sale; [`recover`] rebuilds a sale in Redis
//! from MySQL after Redis lost it entirely; [`retire`] ends a sale's life
//! once it is over and settled (its final audit recorded, its keys gone).

pub mod audit;
pub mod live;
pub mod reconcile;
pub mod recover;
pub mod retire;
mod sweeper;

use std::time::Duration;

pub use sweeper::{Sweeper, Swept};

use crate::domain::Chain;
use crate::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId, now_ms};
use crate::sale::{SaleError, SaleSpec, Sales};
use crate::store::{Db, OrderRow, Product, StoreError, Transition};

#[derive(Debug, thiserror::Error)]
pub enum BooksError {
    #[error("no order with this id")]
    NotFound,
    #[error("the order belongs to another user")]
    Forbidden,
    #[error("the order is {0}")]
    InvalidTransition(String),
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

/// The settings a product's sale is opened with in Redis, with `stock` units.
pub fn sale_spec(product: &Product, stock: u64) -> SaleSpec {
    SaleSpec {
        stock,
        // A sale closed before its planned start keeps that start in the
        // books; its window in Redis is empty at its end.
        start_ms: product.start_time.min(product.end_time),
        end_ms: product.end_time,
        limit_per_user: product.limit_per_user.max(1) as u64,
        price: product.price,
        waiting_room: product.waiting_room(),
    }
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// The order is cancelled (by this call or an earlier one).
    Done(OrderRow),
    /// The order is still pending in its stream: the cancel is recorded and
    /// applied as soon as a worker has persisted it.
    Requested(PendingOrder),
}

/// Pay and cancel, across MySQL and Redis.
#[derive(Clone)]
pub struct Books {
    sales: Sales,
    db: Db,
}

impl Books {
    pub fn new(sales: Sales, db: Db) -> Self {
        Self { sales, db }
    }

    /// `confirmed` → `paid` (payment itself happens elsewhere; this records it).
    pub async fn pay(
        &self,
        id: &OrderId,
        product: &ProductId,
        user: UserId,
    ) -> Result<OrderRow, BooksError> {
        match self.db.pay(id, user).await? {
            Transition::Done(row) | Transition::Already(row) if row.user_id == user.as_i64() => {
                Ok(row)
            }
            Transition::Done(row) | Transition::Already(row) | Transition::Refused(row) => {
                Err(refusal(&row, Some(user)))
            }
            Transition::NotFound => Err(self.pending_refusal(id, product, user).await?),
        }
    }

    /// Cancels an order for its owner (`user`), or for the system (`None`:
    /// the payment timeout); see the module docs for the two halves.
    pub async fn cancel(
        &self,
        id: &OrderId,
        product: &ProductId,
        user: Option<UserId>,
    ) -> Result<Cancelled, BooksError> {
        match self.db.cancel(id, user).await? {
            Transition::Done(row) => {
                self.release_logged(&row).await;
                Ok(Cancelled::Done(row))
            }
            Transition::Already(row) if user.is_none_or(|u| row.user_id == u.as_i64()) => {
                if !row.released {
                    self.release_logged(&row).await;
                }
                Ok(Cancelled::Done(row))
            }
            Transition::Already(row) | Transition::Refused(row) => Err(refusal(&row, user)),
            Transition::NotFound => {
                let Some(order) = self.sales.orders.find(id, product).await? else {
                    return Err(BooksError::NotFound);
                };
                if user.is_some_and(|u| order.user_id != u) {
                    return Err(BooksError::Forbidden);
                }
                self.sales.orders.request_cancel(&order).await?;
                // Persisted meanwhile? Then cancel it now (the request is moot).
                if self.db.order(id).await?.is_some() {
                    let done = Box::pin(self.cancel(id, product, user)).await?;
                    self.sales
                        .orders
                        .drop_cancel_request(product, id.as_str())
                        .await?;
                    return Ok(done);
                }
                Ok(Cancelled::Requested(order))
            }
        }
    }

    /// The Redis half of a cancel, then `released = 1`.
    pub async fn release(&self, row: &OrderRow) -> Result<(), BooksError> {
        let order = pending_of(row)?;
        self.sales.orders.release(&order).await?;
        self.db.mark_released(&row.order_id).await?;
        Ok(())
    }

    /// A failed Redis half is logged, not returned: the cancel itself is
    /// committed, and the sweeper finishes the release.
    async fn release_logged(&self, row: &OrderRow) {
        if let Err(e) = self.release(row).await {
            tracing::warn!(order_id = %row.order_id, error = %Chain(&e), "units not yet back in Redis; the sweeper will retry");
        }
    }

    /// Cancels orders unpaid for longer than `timeout`; returns how many.
    pub async fn cancel_expired(&self, timeout: Duration, limit: u32) -> Result<usize, BooksError> {
        let rows = self
            .db
            .cancel_expired(now_ms() - timeout.as_millis() as i64, limit)
            .await?;
        for row in &rows {
            tracing::info!(order_id = %row.order_id, "unpaid past the payment timeout: cancelled");
            self.release_logged(row).await;
        }
        Ok(rows.len())
    }

    /// Finishes cancels whose Redis half is missing (older than `grace`, so a
    /// cancel in progress is left alone); returns how many.
    pub async fn repair_releases(&self, grace: Duration, limit: u32) -> Result<usize, BooksError> {
        let rows = self
            .db
            .unreleased(now_ms() - grace.as_millis() as i64, limit)
            .await?;
        for row in &rows {
            self.release(row).await?;
            tracing::info!(order_id = %row.order_id, "finished an interrupted cancel");
        }
        Ok(rows.len())
    }

    /// Applies the cancels asked while `product`'s orders were pending, for
    /// the orders persisted since; returns how many were applied.
    pub async fn apply_cancel_requests(&self, product: &ProductId) -> Result<usize, BooksError> {
        let mut applied = 0;
        for (id, user) in self.sales.orders.cancel_requests(product).await? {
            let (Some((order_id, _)), Ok(user)) = (OrderId::parse(&id), UserId::new(user)) else {
                self.sales.orders.drop_cancel_request(product, &id).await?;
                continue;
            };
            match self.cancel(&order_id, product, Some(user)).await {
                Ok(Cancelled::Done(_))
                | Err(BooksError::InvalidTransition(_) | BooksError::NotFound) => {
                    self.sales.orders.drop_cancel_request(product, &id).await?;
                    applied += 1;
                }
                Ok(Cancelled::Requested(_)) => {} // still pending
                Err(e) => return Err(e),
            }
        }
        Ok(applied)
    }

    /// Why an order that is not in MySQL cannot be paid: unknown, or pending.
    async fn pending_refusal(
        &self,
        id: &OrderId,
        product: &ProductId,
        user: UserId,
    ) -> Result<BooksError, BooksError> {
        Ok(match self.sales.orders.find(id, product).await? {
            None => BooksError::NotFound,
            Some(o) if o.user_id != user => BooksError::Forbidden,
            Some(_) => BooksError::InvalidTransition("pending".into()),
        })
    }
}

/// Why `user` (`None`: the service itself) cannot take `row` where it asked.
fn refusal(row: &OrderRow, user: Option<UserId>) -> BooksError {
    if user.is_none_or(|u| row.user_id != u.as_i64()) {
        BooksError::Forbidden
    } else {
        BooksError::InvalidTransition(row.status.to_string())
    }
}

/// The Redis view of a persisted order (what `release_stock.lua` needs).
fn pending_of(row: &OrderRow) -> Result<PendingOrder, BooksError> {
    let corrupt =
        |what: &str| BooksError::Corrupt(format!("{what} of order {:?} in tb_order", row.order_id));
    let (order_id, product_id) = OrderId::parse(&row.order_id).ok_or_else(|| corrupt("id"))?;
    Ok(PendingOrder {
        order_id,
        user_id: u64::try_from(row.user_id)
            .ok()
            .and_then(|u| UserId::new(u).ok())
            .ok_or_else(|| corrupt("user_id"))?,
        product_id,
        quantity: u64::try_from(row.quantity)
            .ok()
            .and_then(|q| Quantity::new(q).ok())
            .ok_or_else(|| corrupt("quantity"))?,
        price: row.price,
        created_ms: row.created,
        idempotency_key: row.idempotency_key.clone(),
    })
}
