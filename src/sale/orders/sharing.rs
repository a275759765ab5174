//! Orders that share a call: in this process, the orders of a sale that
//! arrive while one of its `place_order.lua` calls is in flight go
//! together in its next call (group commit, with no timer: an order that
//! finds no call of its sale in flight is sent at once, alone).
//!
//! Redis does what a call's orders share once per call (the sale's `HMGET`,
//! `TIME`, the stock's `GET` and `DECRBY`, one `HSET` of their records, the
//! `EVALSHA` itself and its I/O), so an order costs less the more orders
//! share its call, and calls grow by themselves as orders come faster:
//! the busier the sale, the cheaper each order (BENCHMARKS.md, "What does
//! an accepted order cost?"). A sale's keys share one hash tag, so a call
//! is one command to one node, on a cluster too.
//!
//! The rule this module keeps: while a sale has a call in flight, exactly
//! one task sends its calls, one at a time, until no order waits; orders
//! are sent in their order of arrival, at most [`MAX_ORDERS_PER_CALL`] a
//! call. An order whose caller has stopped waiting (its request ended)
//! before its call left is never sent.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::place::{OrderCall, PlaceReply};
use crate::domain::ProductId;
use crate::sale::error::SaleError;
use crate::sale::memory::clock::Reading;

/// Most orders in one call: the script holds Redis for the call's orders
/// (a few microseconds each), so other sales on the node wait that long at
/// most.
pub(super) const MAX_ORDERS_PER_CALL: usize = 64;

/// What one order's call gave it: the script's answer for it, or why
/// there is none, and when the call was sent and answered (for the memory
/// of Redis's clock).
pub(super) struct Sent {
    pub(super) reply: Result<PlaceReply, SaleError>,
    pub(super) sent: Reading,
    pub(super) received: Reading,
}

/// An order waiting for its sale's next call, and where it goes back
/// with its answer.
pub(super) struct Waiting {
    pub(super) order: OrderCall,
    pub(super) answer: oneshot::Sender<(OrderCall, Sent)>,
}

/// The sales of this process with a call in flight, each with the orders
/// that arrived since.
#[derive(Default)]
pub(super) struct Sharing {
    // A std Mutex: held for a push or a take, never across an await.
    busy: Mutex<HashMap<ProductId, Vec<Waiting>, foldhash::fast::RandomState>>,
}

/// How an order joined its sale's calls.
pub(super) enum Turn {
    /// No call of the sale was in flight: now one is, and the caller sends
    /// this order alone, then hands the sale on ([`Sharing::next`]).
    Alone(OrderCall),
    /// A call is in flight: the order waits for the next one.
    Next(oneshot::Receiver<(OrderCall, Sent)>),
}

impl Sharing {
    pub(super) fn join(&self, product: &ProductId, order: OrderCall) -> Turn {
        let mut busy = self.lock();
        match busy.get_mut(product) {
            Some(waiting) => {
                let (answer, received) = oneshot::channel();
                waiting.push(Waiting { order, answer });
                Turn::Next(received)
            }
            None => {
                busy.insert(product.clone(), Vec::new());
                Turn::Alone(order)
            }
        }
    }

    /// After a call for `product` came back: the orders for the next call
    /// (the sale stays busy, its sender sends them), or `None` when none
    /// waits (the next order goes at once again). Orders nobody waits for any more
    /// are dropped here, unsent.
    pub(super) fn next(&self, product: &ProductId) -> Option<Vec<Waiting>> {
        let mut busy = self.lock();
        let waiting = busy.get_mut(product)?;
        waiting.retain(|w| !w.answer.is_closed());
        if waiting.is_empty() {
            busy.remove(product);
            return None;
        }
        let rest = waiting.len().saturating_sub(MAX_ORDERS_PER_CALL);
        let later = waiting.split_off(waiting.len() - rest);
        Some(std::mem::replace(waiting, later))
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ProductId, Vec<Waiting>, foldhash::fast::RandomState>>
    {
        // A panic while holding it leaves only a map of waiting orders behind.
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{OrderId, Quantity, UserId};
    use crate::sale::orders::Vouched;

    fn order(product: &ProductId, user: u64) -> OrderCall {
        OrderCall {
            order_id: OrderId::generate(product),
            user_id: UserId::new(user).unwrap(),
            quantity: Quantity::new(1).unwrap(),
            idempotency_key: None,
            vouched: Vouched::No,
            shards: 1,
        }
    }

    #[test]
    fn the_first_order_goes_alone_and_the_next_ones_together_in_arrival_order() {
        let sharing = Sharing::default();
        let sku = ProductId::parse("sku-1").unwrap();
        let other = ProductId::parse("sku-2").unwrap();
        assert!(matches!(sharing.join(&sku, order(&sku, 1)), Turn::Alone(_)));
        // Another sale's calls are its own.
        assert!(matches!(
            sharing.join(&other, order(&other, 1)),
            Turn::Alone(_)
        ));
        let mut receivers = Vec::new();
        for user in 2..=4 {
            match sharing.join(&sku, order(&sku, user)) {
                Turn::Next(rx) => receivers.push(rx),
                Turn::Alone(_) => panic!("a call is in flight"),
            }
        }
        // The caller of user 3 gave up: its order is not sent.
        drop(receivers.remove(1));
        let next = sharing.next(&sku).expect("two wait");
        let users: Vec<u64> = next.iter().map(|w| w.order.user_id.get()).collect();
        assert_eq!(users, [2, 4]);
        // Still busy (their call is in flight): a new order waits.
        let Turn::Next(_waits) = sharing.join(&sku, order(&sku, 5)) else {
            panic!("a call is in flight");
        };
        assert_eq!(sharing.next(&sku).map(|n| n.len()), Some(1));
        // Nobody waits: free again, the next order goes at once.
        assert!(sharing.next(&sku).is_none());
        assert!(matches!(sharing.join(&sku, order(&sku, 6)), Turn::Alone(_)));
        assert!(sharing.next(&other).is_none());
    }

    #[test]
    fn a_call_carries_at_most_its_maximum_the_rest_wait_their_turn() {
        let sharing = Sharing::default();
        let sku = ProductId::parse("sku-1").unwrap();
        assert!(matches!(sharing.join(&sku, order(&sku, 1)), Turn::Alone(_)));
        let extra = 10;
        let mut receivers = Vec::new();
        for user in 0..(MAX_ORDERS_PER_CALL + extra) as u64 {
            if let Turn::Next(rx) = sharing.join(&sku, order(&sku, user + 2)) {
                receivers.push(rx);
            }
        }
        let first = sharing.next(&sku).unwrap();
        assert_eq!(first.len(), MAX_ORDERS_PER_CALL);
        assert_eq!(first[0].order.user_id.get(), 2);
        let second = sharing.next(&sku).unwrap();
        assert_eq!(second.len(), extra);
        assert_eq!(
            second[0].order.user_id.get(),
            2 + MAX_ORDERS_PER_CALL as u64
        );
        assert!(sharing.next(&sku).is_none());
    }
}
