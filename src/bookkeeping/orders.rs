//! [`OrderLife`]: an order's life after its 202 (pay, cancel, payment timeout,
//! lookups), across MySQL and Redis.

use std::time::Duration;

use super::error::BookkeepingError;
use crate::domain::{Chain, OrderId, PendingOrder, ProductId, Quantity, UserId, now_ms};
use crate::sale::{self, Progress};
use crate::store::{self, OrderRow, Transition};

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// The order is cancelled, by this call.
    Done(OrderRow),
    /// The order was cancelled by an earlier call (a retry answers as the
    /// first did).
    Again(OrderRow),
    /// The order is still pending in its stream: the cancel is recorded and
    /// applied as soon as a worker has persisted it.
    Requested(PendingOrder),
}

/// Where an order was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// In the books (MySQL): persisted.
    Booked(OrderRow),
    /// Still in its sale's stream: accepted, not persisted yet.
    Pending(PendingOrder),
    /// MySQL is unavailable: the order as Redis last knew it.
    Provisional(PendingOrder, Progress),
}

/// Pay and cancel, across MySQL and Redis.
#[derive(Clone)]
pub struct OrderLife {
    /// What Redis holds of the accepted orders.
    pub(super) accepted: sale::Accepted,
    /// Whether Redis still has a sale (a refund's units go back only then).
    pub(super) ledger: sale::Ledger,
    /// The persisted orders.
    pub(super) orders: store::Orders,
    pub(super) payments: store::Payments,
}

impl OrderLife {
    pub fn new(
        (accepted, ledger): (sale::Accepted, sale::Ledger),
        (orders, payments): (store::Orders, store::Payments),
    ) -> Self {
        Self {
            accepted,
            ledger,
            orders,
            payments,
        }
    }

    /// Whether Redis and MySQL answer (the service's readiness).
    pub async fn ping(&self) -> (Result<(), sale::SaleError>, Result<(), store::StoreError>) {
        tokio::join!(self.accepted.ping(), self.orders.ping())
    }

    /// Whether the books were reached and migrated once since this process
    /// started (however they answer now).
    pub fn books_migrated(&self) -> bool {
        self.orders.is_ready()
    }

    /// An order, wherever it is: Redis first, then MySQL (a worker persists
    /// an order before it may forget it in Redis, so an accepted order is
    /// always in one of the two). While MySQL is unavailable, an order Redis
    /// holds is answered from Redis rather than with the store's error.
    pub async fn find(&self, id: &OrderId, product: &ProductId) -> Result<Found, BookkeepingError> {
        let pending = self.accepted.find(id, product).await?;
        match self.orders.order(id).await {
            Ok(Some(row)) => Ok(Found::Booked(row)),
            Ok(None) => pending
                .map(Found::Pending)
                .ok_or(BookkeepingError::NotFound),
            Err(e) if e.is_unavailable() && pending.is_some() => {
                match self.accepted.progress(id, product).await? {
                    Some((order, progress)) => Ok(Found::Provisional(order, progress)),
                    None => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The order `user` placed with Idempotency-Key `key` for a sale Redis
    /// no longer has (retired: its keys are gone), from the books.
    pub async fn keyed_order(
        &self,
        user: UserId,
        product: &ProductId,
        key: &str,
    ) -> Result<Option<OrderRow>, BookkeepingError> {
        Ok(self.orders.order_by_key(user, product, key).await?)
    }

    /// A buyer's orders in the books, newest first: up to `limit` placed
    /// before `before` (epoch ms; `None`: from the newest).
    pub async fn orders_of_user(
        &self,
        user: UserId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<OrderRow>, BookkeepingError> {
        Ok(self.orders.orders_of_user(user, before, limit).await?)
    }

    /// `confirmed` → `paid` (payment itself happens elsewhere; this records it).
    pub async fn pay(
        &self,
        id: &OrderId,
        product: &ProductId,
        user: UserId,
    ) -> Result<OrderRow, BookkeepingError> {
        match self.orders.pay(id, user).await? {
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
    ) -> Result<Cancelled, BookkeepingError> {
        match self.orders.cancel(id, user).await? {
            Transition::Done(row) => {
                self.release_logged(&row).await;
                Ok(Cancelled::Done(row))
            }
            Transition::Already(row) if user.is_none_or(|u| row.user_id == u.as_i64()) => {
                if !row.released {
                    self.release_logged(&row).await;
                }
                Ok(Cancelled::Again(row))
            }
            Transition::Already(row) | Transition::Refused(row) => Err(refusal(&row, user)),
            Transition::NotFound => {
                let Some(order) = self.accepted.find(id, product).await? else {
                    return Err(BookkeepingError::NotFound);
                };
                if user.is_some_and(|u| order.user_id != u) {
                    return Err(BookkeepingError::Forbidden);
                }
                self.accepted.request_cancel(&order).await?;
                // Persisted meanwhile? Then cancel it now (the request is moot).
                if self.orders.order(id).await?.is_some() {
                    let done = Box::pin(self.cancel(id, product, user)).await?;
                    self.accepted
                        .drop_cancel_request(product, id.as_str())
                        .await?;
                    return Ok(done);
                }
                Ok(Cancelled::Requested(order))
            }
        }
    }

    /// The Redis half of a cancel, then `released = 1`.
    pub async fn release(&self, row: &OrderRow) -> Result<(), BookkeepingError> {
        let order = pending_of(row)?;
        self.accepted.release(&order, row.updated).await?;
        self.orders.mark_released(&row.order_id).await?;
        Ok(())
    }

    /// The Redis half of a refund's cancel: as [`OrderLife::release`] while
    /// Redis holds the sale; a retired sale's keys are gone (nothing to
    /// give back to), so the units are only marked released.
    pub(super) async fn release_refunded(&self, row: &OrderRow) -> Result<(), BookkeepingError> {
        let product = pending_of(row)?.product_id;
        if self.ledger.has_sale(&product).await? {
            self.release_logged(row).await;
        } else {
            self.orders.mark_released(&row.order_id).await?;
        }
        Ok(())
    }

    /// A failed Redis half is logged, not returned: the cancel itself is
    /// committed, and the sweeper finishes the release.
    async fn release_logged(&self, row: &OrderRow) {
        if let Err(e) = self.release(row).await {
            tracing::warn!(order_id = %row.order_id, error = %Chain(&e), "units not yet back in Redis; the sweeper will retry");
        }
    }

    /// Cancels orders unpaid for longer than `timeout`; returns the sale
    /// of each.
    pub async fn cancel_expired(
        &self,
        timeout: Duration,
        limit: u32,
    ) -> Result<Vec<String>, BookkeepingError> {
        let rows = self
            .orders
            .cancel_expired(now_ms() - timeout.as_millis() as i64, limit)
            .await?;
        for row in &rows {
            tracing::info!(order_id = %row.order_id, "unpaid past the payment timeout: cancelled");
            self.release_logged(row).await;
        }
        Ok(rows.into_iter().map(|r| r.product_id).collect())
    }

    /// Finishes cancels whose Redis half is missing (older than `grace`, so a
    /// cancel in progress is left alone); returns how many.
    pub async fn repair_releases(
        &self,
        grace: Duration,
        limit: u32,
    ) -> Result<usize, BookkeepingError> {
        let rows = self
            .orders
            .unreleased(now_ms() - grace.as_millis() as i64, limit)
            .await?;
        for row in &rows {
            self.release(row).await?;
            tracing::info!(order_id = %row.order_id, "finished an interrupted cancel");
        }
        Ok(rows.len())
    }

    /// Applies the cancels asked while `product`'s orders were pending, for
    /// the orders persisted since; returns how many were applied, and how
    /// many of those cancelled their order (the others found it done).
    pub async fn apply_cancel_requests(
        &self,
        product: &ProductId,
    ) -> Result<(usize, u64), BookkeepingError> {
        let (mut applied, mut cancelled) = (0, 0);
        for (id, user) in self.accepted.cancel_requests(product).await? {
            let (Some((order_id, _)), Ok(user)) = (OrderId::parse(&id), UserId::new(user)) else {
                self.accepted.drop_cancel_request(product, &id).await?;
                continue;
            };
            match self.cancel(&order_id, product, Some(user)).await {
                Ok(Cancelled::Done(_)) => {
                    self.accepted.drop_cancel_request(product, &id).await?;
                    applied += 1;
                    cancelled += 1;
                }
                Ok(Cancelled::Again(_))
                | Err(BookkeepingError::InvalidTransition(_) | BookkeepingError::NotFound) => {
                    self.accepted.drop_cancel_request(product, &id).await?;
                    applied += 1;
                }
                Ok(Cancelled::Requested(_)) => {} // still pending
                Err(e) => return Err(e),
            }
        }
        Ok((applied, cancelled))
    }

    /// Why an order that is not in MySQL cannot be paid: unknown, or pending.
    async fn pending_refusal(
        &self,
        id: &OrderId,
        product: &ProductId,
        user: UserId,
    ) -> Result<BookkeepingError, BookkeepingError> {
        Ok(match self.accepted.find(id, product).await? {
            None => BookkeepingError::NotFound,
            Some(o) if o.user_id != user => BookkeepingError::Forbidden,
            Some(_) => BookkeepingError::InvalidTransition("pending".into()),
        })
    }
}

/// Why `user` (`None`: the service itself) cannot take `row` where it asked.
fn refusal(row: &OrderRow, user: Option<UserId>) -> BookkeepingError {
    if user.is_none_or(|u| row.user_id != u.as_i64()) {
        BookkeepingError::Forbidden
    } else {
        BookkeepingError::InvalidTransition(row.status.to_string())
    }
}

/// The Redis view of a persisted order (what `release_stock.lua` needs).
pub fn pending_of(row: &OrderRow) -> Result<PendingOrder, BookkeepingError> {
    let corrupt = |what: &str| {
        BookkeepingError::Corrupt(format!("{what} of order {:?} in tb_order", row.order_id))
    };
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
