//! The orders of a sale, in Redis: placing one (the order path: memory
//! first, then `place_order.lua`, where stock is deducted and the order
//! enqueued in one atomic step), taking back one its replicas did not
//! confirm, the workers' claim of a batch, an order's record and progress,
//! cancel requests, and giving an order's units back.

use std::sync::Arc;

use redis::AsyncCommands;

use super::conn::{Conn, Wait};
use super::core::{Calls, Core};
use super::keys::SaleKeys;
use super::line::{Joined, Lines, Sent, Waiting};
use super::memory::Heard;
use super::memory::clock::Reading;
use super::room::Room;
use super::scripts::{self, OrderCall, PlaceReply, Retake, Voided};
use super::types::{
    AcceptedRecord, AnsweredBy, Decision, Keyed, Placed, Progress, Rejection, SaleError, Vouched,
};
use crate::domain::{Chain, OrderId, PendingOrder, ProductId, Quantity, UserId};

/// The orders handle.
#[derive(Clone)]
pub struct Orders {
    core: Arc<Core>,
    /// The waiting rooms: an order without an admission is refused from them.
    room: Room,
    /// The sales' order lines in this process.
    lines: Arc<Lines>,
}

/// Hands a sale's line on when a call of it is done (or abandoned: the
/// caller's request ended mid-call): the orders that queued meanwhile go in
/// the next call, on a task of their own.
struct Handoff<'a> {
    orders: &'a Orders,
    product: &'a ProductId,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let Some(next) = self.orders.lines.next(self.product) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.orders.clone().drive(self.product.clone(), next));
            }
            // Outside a runtime (it is shutting down): the waiting orders
            // are dropped, unsent (their callers answer 503), and the line
            // freed.
            Err(_) => while self.orders.lines.next(self.product).is_some() {},
        }
    }
}

/// One order to decide.
#[derive(Debug, Clone, Copy)]
pub struct NewOrder<'a> {
    pub product: &'a ProductId,
    pub user_id: UserId,
    pub quantity: Quantity,
    pub idempotency_key: Option<&'a str>,
    pub vouched: Vouched,
}

impl Orders {
    pub(super) fn new(core: Arc<Core>, room: Room) -> Self {
        Self {
            core,
            room,
            lines: Arc::default(),
        }
    }

    /// Decides one order atomically; see `lua/place_order.lua`. A refusal
    /// is a [`Decision`], with who gave it (memory or the script); an
    /// error is a failure to get an answer.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %order.product))]
    pub async fn place(&self, order: NewOrder<'_>) -> Result<Decision, SaleError> {
        let core = &self.core;
        let product = order.product;
        let recall = core.memory.recall(
            product,
            order.user_id.get(),
            order.quantity.get(),
            Keyed::of(order.idempotency_key),
        );
        if recall.refresh_known {
            core.refresh_known_sales();
        }
        if recall.refresh_sale {
            core.refresh_sale_clock(product);
        }
        if recall.renew_sold_out {
            core.renew_sold_out(product);
        }
        if let Some(answer) = recall.answer {
            return Ok(Decision::remembered(answer));
        }
        // A keyed order may be the retry of an accepted one: only the script
        // can answer it.
        if order.vouched == Vouched::No
            && order.idempotency_key.is_none()
            && let Some(refusal) = self.room.refusal_without_admission(product)
        {
            return Ok(Decision::remembered(refusal));
        }
        // Boxed: the Redis call's future is most of this one's size, which
        // every caller's future would otherwise carry and copy, for the
        // answers from memory above too (BENCHMARKS.md, "The order path
        // against the floor").
        Box::pin(self.place_in_redis(order)).await
    }

    /// The order through its sale's line (see [`super::line`]): sent at
    /// once when no call of the sale is in flight, else in the next call.
    async fn place_in_redis(&self, order: NewOrder<'_>) -> Result<Decision, SaleError> {
        let product = order.product;
        let call = OrderCall {
            order_id: OrderId::generate(product),
            user_id: order.user_id,
            quantity: order.quantity,
            idempotency_key: order.idempotency_key.map(str::to_owned),
            vouched: order.vouched,
        };
        // The order comes back with its answer: its id and key become the
        // accepted order's, with no copy.
        let (call, sent) = match self.lines.join(product, call) {
            Joined::First(call) => {
                let _next = Handoff {
                    orders: self,
                    product,
                };
                let mut sent = self.send(product, std::slice::from_ref(&call)).await;
                (call, sent.pop().ok_or(SaleError::Dropped)?)
            }
            Joined::Queued(answer) => {
                // The call in flight, then this order's: each bounded by
                // the Redis timeout.
                let bound = 2 * self.core.redis.timeout();
                match tokio::time::timeout(bound, answer).await {
                    Ok(Ok(answered)) => answered,
                    Ok(Err(_)) => return Err(SaleError::Dropped),
                    Err(_) => return Err(SaleError::Timeout(bound)),
                }
            }
        };
        self.decide(sent.reply?, &order, call, (sent.sent, sent.received))
    }

    /// Sends the line's next call: the orders that waited, their answers
    /// to their callers, then the line handed on.
    async fn drive(self, product: ProductId, waiting: Vec<Waiting>) {
        let _next = Handoff {
            orders: &self,
            product: &product,
        };
        let (orders, answers): (Vec<OrderCall>, Vec<_>) =
            waiting.into_iter().map(|w| (w.order, w.answer)).unzip();
        let sent = self.send(&product, &orders).await;
        for ((answer, order), sent) in answers.into_iter().zip(orders).zip(sent) {
            // A caller that stopped waiting meanwhile drops its answer.
            let _ = answer.send((order, sent));
        }
    }

    /// One `place_order.lua` call for `orders` (with its WAIT when
    /// configured): an answer for each, in their order.
    async fn send(&self, product: &ProductId, orders: &[OrderCall]) -> Vec<Sent> {
        let core = &self.core;
        Calls::count(&core.calls.orders);
        Calls::add(&core.calls.orders_sent, orders.len());
        let sent = core.memory.now();
        let replies = match core.wait {
            None => self.place_orders(product, orders).await,
            Some(wait) => self.place_and_wait(product, orders, wait).await,
        };
        let received = core.memory.now();
        let sent_as = |reply| Sent {
            reply,
            sent,
            received,
        };
        match replies {
            Ok(replies) => replies.into_iter().map(sent_as).collect(),
            Err(e) => orders.iter().map(|_| sent_as(Err(e.clone()))).collect(),
        }
    }

    async fn place_orders(
        &self,
        product: &ProductId,
        orders: &[OrderCall],
    ) -> Result<Vec<Result<PlaceReply, SaleError>>, SaleError> {
        let core = &self.core;
        let mut conn = core.redis.shared().await?;
        let replies = core
            .redis
            .bounded(scripts::place_orders(
                &mut conn,
                &core.prefix,
                product,
                orders,
            ))
            .await?;
        Ok(replies.into_iter().map(Ok).collect())
    }

    /// What the script's reply means for the order, learnt by this
    /// process's memory of the sale (`heard`: when the call was sent and
    /// its reply received).
    fn decide(
        &self,
        reply: PlaceReply,
        order: &NewOrder<'_>,
        call: OrderCall,
        (sent, received): (Reading, Reading),
    ) -> Result<Decision, SaleError> {
        let core = &self.core;
        let product = order.product;
        let learn = |heard| {
            core.memory
                .learn(product, order.user_id.get(), heard, sent, received);
        };
        let placed = |order, replayed| Decision::Placed(Placed { order, replayed });
        Ok(match reply {
            PlaceReply::Accepted {
                price,
                created_ms,
                allowance_left,
            } => {
                learn(Heard::Accepted {
                    now_ms: created_ms,
                    allowance_left,
                });
                let accepted = PendingOrder {
                    order_id: call.order_id,
                    user_id: order.user_id,
                    product_id: product.clone(),
                    quantity: order.quantity,
                    price,
                    created_ms,
                    idempotency_key: call.idempotency_key,
                };
                placed(accepted, false)
            }
            PlaceReply::Replayed { order_id, record } => {
                learn(Heard::Other);
                placed(
                    AcceptedRecord::parse(&record, order_id, product.clone())?,
                    true,
                )
            }
            PlaceReply::OutsideWindow {
                start_ms,
                end_ms,
                now_ms,
            } => {
                learn(Heard::OutsideWindow {
                    start_ms,
                    end_ms,
                    now_ms,
                });
                refused(Rejection::outside_window(start_ms, now_ms))
            }
            PlaceReply::Rejected(why) => {
                if why == Rejection::AdmissionRequired {
                    // The next orders without an admission are refused here.
                    self.room.renew(product);
                }
                learn(Heard::of(&why));
                refused(why)
            }
        })
    }

    /// The order script and its WAIT on a connection to themselves (WAIT
    /// blocks it, and counts that connection's own writes). A 202, first
    /// answer or replay, only once the replicas have the order: a failover
    /// must not lose an acknowledged one.
    async fn place_and_wait(
        &self,
        product: &ProductId,
        orders: &[OrderCall],
        wait: Wait,
    ) -> Result<Vec<Result<PlaceReply, SaleError>>, SaleError> {
        let core = &self.core;
        let mut pooled = core.alone().await?;
        let (replies, acked) = core
            .redis
            .bounded(scripts::place_orders_and_wait(
                &mut pooled,
                &core.prefix,
                product,
                orders,
                wait,
            ))
            .await?;
        let confirmed = wait.confirmed(acked);
        let keys = core.keys(product);
        let mut answers = Vec::with_capacity(replies.len());
        for (reply, order) in replies.into_iter().zip(orders) {
            answers.push(match (&reply, &confirmed) {
                (PlaceReply::Rejected(_) | PlaceReply::OutsideWindow { .. }, _) | (_, Ok(())) => {
                    Ok(reply)
                }
                (PlaceReply::Replayed { .. }, Err(e)) => Err(e.clone()),
                // A 503 for a new order: take it back, so that it never
                // reaches the books unless a later answer is a 202. (Unless
                // a worker claimed it meanwhile, after its own WAIT: then
                // the replicas have it after all.)
                (PlaceReply::Accepted { .. }, Err(e)) => {
                    match self.void(&mut pooled, &keys, product, order).await {
                        Some(Voided::Claimed) => Ok(reply),
                        _ => Err(e.clone()),
                    }
                }
            });
        }
        Ok(answers)
    }

    /// Takes back an order whose WAIT failed (see `lua/void_order.lua`), on
    /// the connection that placed it; `None` when Redis did not answer (the
    /// order then stands, like one a keyed retry answered: see the docs).
    async fn void(
        &self,
        conn: &mut Conn,
        keys: &SaleKeys,
        product: &ProductId,
        order: &OrderCall,
    ) -> Option<Voided> {
        let order_id = &order.order_id;
        let field = order.idempotency_field();
        let voided = self
            .core
            .redis
            .bounded(scripts::void_order(conn, keys, order_id, field.as_deref()))
            .await;
        match voided {
            Ok(Voided::Void) => {
                self.core
                    .memory
                    .released(product, Some(order.user_id.get()));
                tracing::info!(order_id = %order_id, "order not confirmed by the replicas: voided");
            }
            Ok(Voided::Claimed) => {}
            Ok(other) => {
                tracing::warn!(order_id = %order_id, outcome = ?other, "unconfirmed order not voided; it stands");
            }
            Err(ref e) => {
                tracing::warn!(order_id = %order_id, error = %Chain(e), "unconfirmed order not voided; it stands");
            }
        }
        voided.ok()
    }

    /// Before a worker persists a batch: raises the sale's claimed mark to
    /// `last_entry` (no order up to it can be voided from now on) and
    /// returns the batch's orders that were voided, to be acked without a
    /// row. Call it after [`Orders::confirm_replicated`].
    pub async fn claim(
        &self,
        product: &ProductId,
        last_entry: &str,
        order_ids: &[&str],
    ) -> Result<Vec<String>, SaleError> {
        let keys = self.core.keys(product);
        self.core
            .call(|mut c| async move {
                scripts::claim_batch(&mut c, &keys, last_entry, order_ids).await
            })
            .await
    }

    /// With WAIT configured: returns once the replicas hold everything
    /// written to the sale so far (its stream entries included), else
    /// `NotReplicated`. A write to the sale's slot and a WAIT behind it, on
    /// a connection of their own. The workers call it before persisting a
    /// batch: MySQL must never hold an order that a promoted replica would
    /// not know (it would sell the units again).
    pub async fn confirm_replicated(&self, product: &ProductId) -> Result<(), SaleError> {
        let Some(wait) = self.core.wait else {
            return Ok(());
        };
        let keys = self.core.keys(product);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.replicated)
            .arg(crate::domain::now_ms())
            .arg("PX")
            .arg(60_000);
        let mut pooled = self.core.alone().await?;
        let (_, acked) = self
            .core
            .redis
            .bounded(super::conn::then_wait(
                &mut pooled,
                &keys.orders,
                pipe,
                wait,
            ))
            .await?;
        wait.confirmed(acked)
    }

    /// Units left, or `None` when the sale is not open in Redis.
    pub async fn stock(&self, product: &ProductId) -> Result<Option<u64>, SaleError> {
        let stock_key = self.core.keys(product).stock;
        let stock: Option<i64> = self
            .core
            .call(|mut c| async move { c.get(&stock_key).await })
            .await?;
        Ok(stock.map(|s| s.max(0) as u64))
    }

    /// An accepted order's record, if the sale still holds it.
    pub async fn find(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<PendingOrder>, SaleError> {
        let accepted = self.core.keys(product).accepted;
        let record: Option<String> = self
            .core
            .call(|mut c| async move { c.hget(&accepted, order_id.as_str()).await })
            .await?;
        record
            .map(|r| AcceptedRecord::parse(&r, order_id.clone(), product.clone()))
            .transpose()
    }

    /// An accepted order's record and how far it got, if the sale still holds it.
    pub async fn progress(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<(PendingOrder, Progress)>, SaleError> {
        let keys = self.core.keys(product);
        let found = self
            .core
            .call(|mut c| async move { scripts::order_state(&mut c, &keys, order_id).await })
            .await?;
        found
            .map(|(record, progress)| {
                let order = AcceptedRecord::parse(&record, order_id.clone(), product.clone())?;
                Ok((order, progress))
            })
            .transpose()
    }

    /// Remembers a cancel asked while the order is still pending (in the
    /// stream, not yet in MySQL); it is applied once the order is persisted.
    pub async fn request_cancel(&self, order: &PendingOrder) -> Result<(), SaleError> {
        let cancels = self.core.keys(&order.product_id).cancels;
        self.core
            .call(|mut c| async move {
                c.hset::<_, _, _, ()>(&cancels, order.order_id.as_str(), order.user_id)
                    .await
            })
            .await
    }

    /// The cancels asked for `product`'s pending orders: (order id, user id).
    pub async fn cancel_requests(
        &self,
        product: &ProductId,
    ) -> Result<Vec<(String, u64)>, SaleError> {
        let cancels = self.core.keys(product).cancels;
        self.core
            .call(|mut c| async move { c.hgetall(&cancels).await })
            .await
    }

    /// A cancel request was applied (or is moot).
    pub async fn drop_cancel_request(
        &self,
        product: &ProductId,
        order_id: &str,
    ) -> Result<(), SaleError> {
        let cancels = self.core.keys(product).cancels;
        self.core
            .call(|mut c| async move { c.hdel::<_, _, ()>(&cancels, order_id).await })
            .await
    }

    /// Returns an order's units to the sale, at most once per order, and
    /// only if this Redis took them; returns `(released_now, stock_left)`.
    /// See `lua/release_stock.lua`.
    ///
    /// With WAIT configured, only once the replicas have the release (else
    /// `NotReplicated`): the caller marks the order released after this, and
    /// a release a failover lost must stay unmarked, for the sweeper to redo.
    pub async fn release(
        &self,
        order: &PendingOrder,
        cancelled_ms: i64,
    ) -> Result<(bool, u64), SaleError> {
        let keys = self.core.keys(&order.product_id);
        let call = scripts::release_stock_call(&keys, order, cancelled_ms);
        let (released, replicated) = self.write(&keys.stock, call).await?;
        // The units are back on the master either way.
        self.core
            .memory
            .released(&order.product_id, Some(order.user_id.get()));
        replicated?;
        Ok(released)
    }

    /// A late payment's order (cancelled, its units released) takes its
    /// units again if the sale can still sell them to its buyer
    /// (`retake_order.lua`; once per order). With `REDIS_WAIT_REPLICAS`,
    /// confirmed on the replicas before the books record the payment.
    pub async fn retake(
        &self,
        order: &PendingOrder,
        cancelled_ms: i64,
    ) -> Result<Retake, SaleError> {
        let keys = self.core.keys(&order.product_id);
        let call = scripts::retake_order_call(&keys, order, cancelled_ms);
        let (retake, replicated) = self.write(&keys.retaken, call).await?;
        replicated?;
        Ok(retake)
    }

    /// A script that writes: its reply, and with `REDIS_WAIT_REPLICAS`
    /// whether the replicas have its write (the script and `WAIT` as one
    /// pipeline to the node holding `key`, one of its keys).
    async fn write<T: redis::FromRedisValue>(
        &self,
        key: &str,
        call: redis::ScriptInvocation<'static>,
    ) -> Result<(T, Result<(), SaleError>), SaleError> {
        let core = &self.core;
        match core.wait {
            None => {
                let reply = core
                    .call(|mut c| async move { call.invoke_async(&mut c).await })
                    .await?;
                Ok((reply, Ok(())))
            }
            Some(wait) => {
                let mut pooled = core.alone().await?;
                let (reply, acked) = core
                    .redis
                    .bounded(scripts::invoke_and_wait(&mut pooled, key, &call, wait))
                    .await?;
                Ok((reply, wait.confirmed(acked)))
            }
        }
    }
}

fn refused(why: Rejection) -> Decision {
    Decision::Refused {
        why,
        by: AnsweredBy::Redis,
    }
}
