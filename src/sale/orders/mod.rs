//! The order path, where an order is decided: this process's memory first
//! (`sale::memory`: the refusals Redis gave before, without a round trip),
//! then `place_order.lua` ([`place`]: it checks the sale, deducts the stock
//! and appends the order to the sale's stream in one atomic step), through
//! the sale's shared call ([`sharing`]: the orders that arrive while one of
//! their sale's calls is in flight go together in its next one). With
//! `REDIS_WAIT_REPLICAS`, an order its replicas did not confirm is taken
//! back ([`void`]).
//!
//! What Redis holds of an order once it is accepted (its record, how far it
//! got, cancel requests, its units given back) is [`Accepted`]'s.

mod accepted;
mod decision;
pub(crate) mod place;
mod recall;
pub(crate) mod record;
mod release;
mod sharing;
mod void;

use std::borrow::Cow;
use std::sync::Arc;

pub use accepted::Accepted;
pub use decision::{DecidedBy, Decision, NewOrder, Placed, Vouched};
pub use place::{OrderCall, PlaceReply};
pub use record::Progress;
pub use release::Retake;

use super::core::{Core, Counter};
use super::error::SaleError;
use super::memory::clock::Reading;
use super::memory::{Heard, Keyed};
use super::rejection::Rejection;
use super::room::Room;
use super::shards::Refill;
use crate::domain::{OrderId, ProductId, UserId};
use record::AcceptedRecord;
use sharing::{Sent, Sharing, Turn, Waiting};

/// How many searches for units on other shards one order may make
/// (each that finds units asks the home shard again; other buyers may take
/// them first).
const MAX_SEARCHES: usize = 16;

/// The order path's handle.
#[derive(Clone)]
pub struct OrderPath {
    core: Arc<Core>,
    /// The waiting rooms: an order without an admission is refused from them.
    room: Room,
    /// The sales' shared calls in this process.
    sharing: Arc<Sharing>,
}

/// Hands a sale's shared call on when a call of it is done (or abandoned:
/// the caller's request ended mid-call): the orders that came meanwhile go
/// in the next call, on a task of their own.
struct Handoff<'a> {
    orders: &'a OrderPath,
    product: &'a ProductId,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let Some(next) = self.orders.sharing.next(self.product) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.orders.clone().drive(self.product.clone(), next));
            }
            // Outside a runtime (it is shutting down): the waiting orders
            // are dropped, unsent (their callers answer 503), and the sale
            // freed.
            Err(_) => while self.orders.sharing.next(self.product).is_some() {},
        }
    }
}

impl OrderPath {
    pub(super) fn new(core: Arc<Core>, room: Room) -> Self {
        Self {
            core,
            room,
            sharing: Arc::default(),
        }
    }

    /// Decides one order atomically; see `lua/place_order.lua`. A refusal
    /// is a [`Decision`], with who gave it (memory or the script); an
    /// error is a failure to get an answer.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %order.product))]
    pub async fn place(&self, order: NewOrder<'_>) -> Result<Decision, SaleError> {
        if let Some(answer) = self.recall(&order) {
            return Ok(Decision::remembered(answer));
        }
        // A keyed order may be the retry of an accepted one: only the script
        // can answer it.
        if order.vouched == Vouched::No
            && order.idempotency_key.is_none()
            && let Some(refusal) = self.room.refusal_without_admission(order.product)
        {
            return Ok(Decision::remembered(refusal));
        }
        // Boxed: the Redis call's future is most of this one's size, which
        // every caller's future would otherwise carry and copy, for the
        // answers from memory above too (BENCHMARKS.md, "What does a
        // refusal cost?").
        let shards = self.core.shards.known(order.product).unwrap_or(1);
        Box::pin(self.place_in_redis(order, shards, 0, None)).await
    }

    /// The order through its sale's shared call (see [`sharing`]): sent at
    /// once when no call of the sale is in flight, else in the next call.
    /// A sale of several stock shards: to the buyer's home shard (of
    /// `shards` as this process knows them), with units looked for on the
    /// others when it has too few ([`Self::search`], `searches` made).
    /// `settled`: the refusal a search for units settled on, for a keyed
    /// order asked once more of its home shard (see [`Self::search`]).
    async fn place_in_redis(
        &self,
        order: NewOrder<'_>,
        shards: u16,
        searches: usize,
        settled: Option<Rejection>,
    ) -> Result<Decision, SaleError> {
        let product = order.product;
        let target = self.target(product, order.user_id, shards);
        let call = OrderCall {
            order_id: OrderId::generate(&target),
            user_id: order.user_id,
            quantity: order.quantity,
            idempotency_key: order.idempotency_key.map(str::to_owned),
            vouched: order.vouched,
            shards,
        };
        // The order comes back with its answer: its id and key become the
        // accepted order's, with no copy.
        let (call, sent) = match self.sharing.join(&target, call) {
            Turn::Alone(call) => {
                let _next = Handoff {
                    orders: self,
                    product: &target,
                };
                let mut sent = self.send(&target, std::slice::from_ref(&call)).await;
                (call, sent.pop().ok_or(SaleError::Dropped)?)
            }
            Turn::Next(answer) => {
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
        let short = matches!(
            sent.reply,
            Ok(PlaceReply::Rejected(
                Rejection::SoldOut | Rejection::InsufficientStock { .. }
            ))
        );
        let misrouted = matches!(sent.reply, Ok(PlaceReply::Shards(_)));
        if short && let Some(verdict) = settled {
            let reply = PlaceReply::Rejected(verdict);
            return self.decide(reply, &order, call, (sent.sent, sent.received));
        }
        if misrouted || (short && (shards > 1 || self.core.shards.known(product) != Some(1))) {
            // Boxed: what the search holds is not carried by every order's
            // future (the one-shard order path's instructions, BENCHMARKS.md
            // "What does a hot sale cost?").
            return Box::pin(self.search(order, shards, searches, call, sent)).await;
        }
        self.decide(sent.reply?, &order, call, (sent.sent, sent.received))
    }

    /// An order whose answer (`sent`) sends it on: to its home shard of a
    /// sale of shards this process did not know of (or a call routed for
    /// another count), or, out of units on its shard, to look for units on
    /// the others (see [`super::shards`]); then it is placed again.
    async fn search(
        &self,
        order: NewOrder<'_>,
        shards: u16,
        searches: usize,
        call: OrderCall,
        sent: Sent,
    ) -> Result<Decision, SaleError> {
        let product = order.product;
        if searches == MAX_SEARCHES {
            return Err(SaleError::Contended(searches));
        }
        let shards = match &sent.reply {
            // Routed for another count of shards than the sale's (this
            // process did not know of them, or the order shared its call
            // with one routed before it learnt): to the buyer's home shard.
            Ok(PlaceReply::Shards(n)) => {
                self.core.shards.learn(product, *n);
                *n
            }
            Ok(PlaceReply::Rejected(Rejection::SoldOut | Rejection::InsufficientStock { .. }))
                if shards > 1 =>
            {
                let home = super::shards::home(order.user_id, shards);
                let need = order.quantity.get();
                match super::shards::refill(&self.core, product, shards, home, need).await? {
                    Refill::Again => shards,
                    // The search's verdict, not the home shard's first
                    // answer: units may have arrived there since.
                    Refill::Settled { left } => {
                        let refusal = match u64::try_from(left) {
                            Ok(left @ 1..) => Rejection::InsufficientStock { left },
                            _ => Rejection::SoldOut,
                        };
                        if order.idempotency_key.is_some() {
                            // Its key may have been accepted meanwhile (the
                            // same request sent twice at once, the other
                            // searching too): only the home shard's script,
                            // which looks at the key first, answers a keyed
                            // order; a refusal there is this one (seen in
                            // the chaos test: a key both accepted and told
                            // `sold_out`).
                            let again =
                                self.place_in_redis(order, shards, searches + 1, Some(refusal));
                            return Box::pin(again).await;
                        }
                        let reply = PlaceReply::Rejected(refusal);
                        return self.decide(reply, &order, call, (sent.sent, sent.received));
                    }
                }
            }
            // Out of units where this process thought the sale had one
            // shard, not knowing (its first orders, all at once): it asks
            // the sale (once: remembered, for a sale of one too). (Or it
            // learnt of the shards while this order was sent.)
            Ok(PlaceReply::Rejected(_)) => {
                let n = match self.core.shards.known(product) {
                    Some(n) => n,
                    None => super::shards::count(&self.core, product).await?,
                };
                if n == 1 {
                    return self.decide(sent.reply?, &order, call, (sent.sent, sent.received));
                }
                n
            }
            _ => return self.decide(sent.reply?, &order, call, (sent.sent, sent.received)),
        };
        Box::pin(self.place_in_redis(order, shards, searches + 1, None)).await
    }

    /// Where a buyer's orders of a sale of `shards` stock shards are
    /// decided (the sale itself, borrowed, for a sale of one: no copy on
    /// the common path).
    fn target<'p>(&self, product: &'p ProductId, user: UserId, shards: u16) -> Cow<'p, ProductId> {
        if shards > 1 {
            Cow::Owned(product.shard(super::shards::home(user, shards), shards))
        } else {
            Cow::Borrowed(product)
        }
    }

    /// Sends the sale's next shared call: the orders that waited, their
    /// answers to their callers, then the sale handed on.
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
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product, orders = orders.len()))]
    async fn send(&self, product: &ProductId, orders: &[OrderCall]) -> Vec<Sent> {
        let core = &self.core;
        core.counts.add(Counter::OrderCalls, 1);
        core.counts.add(Counter::OrdersSent, orders.len());
        let sent = core.memory.now();
        let replies = match core.wait {
            None => self.place_orders(product, orders).await,
            Some(wait) => void::place_and_wait(core, product, orders, wait).await,
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
        let call = place::place_orders(&mut conn, &core.prefix, product, orders);
        let replies = core.redis.bounded(call).await?;
        Ok(replies.into_iter().map(Ok).collect())
    }

    /// What the script's reply means for the order, learnt by this
    /// process's memory of the sale (`sent`, `received`: when the call was
    /// sent and its reply received).
    fn decide(
        &self,
        reply: PlaceReply,
        order: &NewOrder<'_>,
        call: OrderCall,
        (sent, received): (Reading, Reading),
    ) -> Result<Decision, SaleError> {
        let product = order.product;
        let learn = |heard| {
            self.core
                .memory
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
                placed(call.accepted(product, price, created_ms), false)
            }
            PlaceReply::Replayed { order_id, record } => {
                learn(Heard::Other);
                let first = AcceptedRecord::parse(&record, order_id, product.clone())?;
                placed(first, true)
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
                Decision::refused(Rejection::outside_window(start_ms, now_ms))
            }
            // (Not given: an order routed for another count of shards is
            // sent on by `search`.)
            PlaceReply::Shards(_) => {
                return Err(SaleError::Corrupt(format!(
                    "{product}: the buyer's home shard kept changing"
                )));
            }
            PlaceReply::Rejected(why) => {
                if why == Rejection::AdmissionRequired {
                    // The next orders without an admission are refused here.
                    self.room.renew(product);
                }
                learn(Heard::of(&why));
                Decision::refused(why)
            }
        })
    }

    /// The memory's answer to `order`, if it has one; the reads it asks
    /// for are started in the background (see [`recall`]).
    fn recall(&self, order: &NewOrder<'_>) -> Option<Rejection> {
        let product = order.product;
        let recall = self.core.memory.recall(
            product,
            order.user_id.get(),
            order.quantity.get(),
            Keyed::of(order.idempotency_key),
        );
        if recall.refresh_known {
            self.core.refresh_known_sales();
        }
        if recall.refresh_sale {
            recall::refresh_sale_clock(&self.core, product);
        }
        if recall.renew_sold_out {
            recall::renew_sold_out(&self.core, product);
        }
        recall.answer
    }
}
