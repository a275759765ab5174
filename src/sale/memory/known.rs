//! The sales that exist, as this process last read the registry: an order
//! for any other product id is answered `product_not_found` without asking
//! Redis, so made-up ids (random or not) never reach it.
//!
//! The snapshot is the registry's members (`SMEMBERS`), read again at most
//! once per `ttl` when orders come (by a background task: no order waits
//! for it). It is trusted for `ttl` after the read was *sent*, so a sale
//! opened through another instance is found within `ttl`; one opened
//! through this process is added at once. A stale snapshot says nothing
//! (the order goes to Redis), and so does a registry larger than `cap`.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ProductId;

#[derive(Debug)]
pub struct KnownSales {
    ttl: Duration,
    cap: usize,
    state: RwLock<State>,
    refreshing: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    snapshot: Option<Snapshot>,
    /// Sales opened through this process, and when: kept over a snapshot
    /// whose read was sent before them.
    opened_here: super::maps::Map<ProductId, Instant>,
    /// The registry was over the cap at the last read (logged once).
    over_cap: bool,
}

/// The registry as read, and its deadlines from when the read was sent
/// (reckoned once, at the read:
/// an order compares instants, where subtracting them cost more).
#[derive(Debug)]
struct Snapshot {
    ids: super::maps::Set<ProductId>,
    /// Trusted until then (`sent + ttl`).
    stale_at: Instant,
    /// Read again from then on (`sent + ttl / 2`).
    refresh_at: Instant,
}

/// `at + d`, or a moment decades away when that is past the clock's end
/// (a ttl that large never runs out).
pub(super) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(30 * 365 * 86_400))
}

/// What the snapshot says about a product id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    Open,
    /// Not in a fresh snapshot: no sale.
    Unknown,
    /// No fresh snapshot: ask Redis.
    CannotSay,
}

impl KnownSales {
    /// `ttl` zero disables the snapshot.
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            ttl,
            cap,
            state: RwLock::default(),
            refreshing: AtomicBool::new(false),
        }
    }

    pub fn lookup(&self, product: &ProductId) -> Known {
        self.look_at(Some(product), Instant::now()).0
    }

    /// True when the snapshot is due for a read and no read is under way;
    /// the caller then reads the registry and calls [`Self::replace`] or
    /// [`Self::refresh_failed`].
    pub fn claim_refresh(&self) -> bool {
        let (_, due) = self.look_at(None, Instant::now());
        due && !self.refresh_claimed()
    }

    /// [`Self::lookup`] and [`Self::claim_refresh`] at `now`, under one
    /// read of the state: what the id is, and whether this caller is to
    /// read the registry.
    pub fn look(&self, product: &ProductId, now: Instant) -> (Known, bool) {
        let (known, due) = self.look_at(Some(product), now);
        (known, due && !self.refresh_claimed())
    }

    fn look_at(&self, product: Option<&ProductId>, now: Instant) -> (Known, bool) {
        if self.ttl.is_zero() {
            return (Known::CannotSay, false);
        }
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        // Refreshed a little before it goes stale, so that steady traffic
        // always finds a fresh one.
        let due = state.snapshot.as_ref().is_none_or(|s| now >= s.refresh_at);
        let known = match (&state.snapshot, product) {
            (Some(s), Some(product)) if now < s.stale_at => {
                if s.ids.contains(product) || state.opened_here.contains_key(product) {
                    Known::Open
                } else {
                    Known::Unknown
                }
            }
            _ => Known::CannotSay,
        };
        (known, due)
    }

    fn refresh_claimed(&self) -> bool {
        self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// The registry's members, as read by a call sent at `sent`.
    pub fn replace(&self, ids: Vec<ProductId>, sent: Instant) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if ids.len() > self.cap {
            if !state.over_cap {
                state.over_cap = true;
                tracing::warn!(
                    sales = ids.len(),
                    cap = self.cap,
                    "too many open sales to keep in memory: unknown product ids are asked about in Redis"
                );
            }
            state.snapshot = None;
        } else {
            state.over_cap = false;
            state.snapshot = Some(Snapshot {
                ids: ids.into_iter().collect(),
                stale_at: after(sent, self.ttl),
                refresh_at: after(sent, self.ttl / 2),
            });
        }
        state.opened_here.retain(|_, at| *at >= sent);
        drop(state);
        self.refreshing.store(false, Ordering::Release);
    }

    pub fn refresh_failed(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// A sale was opened through this process.
    pub fn opened(&self, product: &ProductId) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        state.opened_here.insert(product.clone(), Instant::now());
    }

    /// A sale was removed from the registry through this process.
    pub fn removed(&self, product: &ProductId) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        state.opened_here.remove(product);
        if let Some(s) = &mut state.snapshot {
            s.ids.remove(product);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(n: usize) -> ProductId {
        ProductId::parse(&format!("sku-{n}")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_snapshot_answers_for_every_id_and_a_stale_one_for_none() {
        let known = KnownSales::new(Duration::from_millis(50), 100);
        assert_eq!(known.lookup(&sku(1)), Known::CannotSay);
        assert!(known.claim_refresh());
        assert!(!known.claim_refresh(), "one read at a time");
        known.replace(vec![sku(1)], Instant::now());
        assert_eq!(known.lookup(&sku(1)), Known::Open);
        assert_eq!(known.lookup(&sku(2)), Known::Unknown);
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(known.lookup(&sku(2)), Known::CannotSay);
        assert!(known.claim_refresh());
    }

    #[tokio::test(start_paused = true)]
    async fn one_look_answers_and_claims_the_read_once_and_a_lookup_claims_none() {
        let known = KnownSales::new(Duration::from_millis(50), 100);
        assert_eq!(known.lookup(&sku(1)), Known::CannotSay);
        assert_eq!(
            known.look(&sku(1), Instant::now()),
            (Known::CannotSay, true)
        );
        assert_eq!(
            known.look(&sku(1), Instant::now()),
            (Known::CannotSay, false),
            "one read at a time"
        );
        known.replace(vec![sku(1)], Instant::now());
        assert_eq!(known.look(&sku(1), Instant::now()), (Known::Open, false));
        // Past half its life: it still answers, and asks for one read.
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(known.lookup(&sku(2)), Known::Unknown);
        assert_eq!(known.look(&sku(2), Instant::now()), (Known::Unknown, true));
        assert!(!known.claim_refresh(), "claimed by the look");
    }

    #[test]
    fn a_sale_opened_here_is_known_at_once_even_across_an_older_read() {
        let known = KnownSales::new(Duration::from_secs(60), 100);
        let sent = Instant::now();
        known.replace(vec![], sent);
        known.opened(&sku(3));
        assert_eq!(known.lookup(&sku(3)), Known::Open);
        // A read sent before the open, answered after it, does not hide it.
        known.replace(vec![], sent);
        assert_eq!(known.lookup(&sku(3)), Known::Open);
        // A read sent after it has it from the registry.
        known.replace(vec![sku(3)], Instant::now());
        assert_eq!(known.lookup(&sku(3)), Known::Open);
        known.removed(&sku(3));
        assert_eq!(known.lookup(&sku(3)), Known::Unknown);
    }

    #[test]
    fn a_registry_over_the_cap_is_not_kept() {
        let known = KnownSales::new(Duration::from_secs(60), 2);
        known.replace((0..3).map(sku).collect(), Instant::now());
        assert_eq!(known.lookup(&sku(9)), Known::CannotSay);
    }

    #[test]
    fn a_zero_ttl_disables_it() {
        let known = KnownSales::new(Duration::ZERO, 2);
        assert!(!known.claim_refresh());
        known.replace(vec![], Instant::now());
        assert_eq!(known.lookup(&sku(9)), Known::CannotSay);
    }
}
