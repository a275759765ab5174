//! The in-process sold-out marker. After a sale sells out, most of its
//! traffic is for stock that is gone; answering those from memory saves a
//! Redis round trip each (BENCHMARKS.md, "Redis calls per request").
//!
//! It must not undersell: stock can come back (a cancellation, another
//! instance's release), so a mark expires after `ttl` and is then no longer
//! believed. While orders keep coming, a mark past half its life is renewed
//! in the background by a read of the stock (one `GET` per sale per instance
//! per `ttl / 2`, instead of every order in flight at the expiry asking the
//! script): renewed, counted from when the read was *sent*, if the stock is
//! still 0, dropped otherwise. A release through this process clears the
//! mark at once; in the worst case an instance claims "sold out" for `ttl`
//! after stock returned elsewhere.
//!
//! Memory is bounded by the sales that sold out (a mark is only set on the
//! script's `sold_out`, which needs a real, open sale); expired marks are
//! dropped whenever the map grows past `PRUNE_AT`.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::known::after;

use crate::domain::ProductId;

const PRUNE_AT: usize = 1024;

#[derive(Debug)]
pub struct SoldOutMarks {
    ttl: Duration,
    // A std RwLock: held for a hash lookup only, never across an await.
    marks: RwLock<super::maps::Map<ProductId, Mark>>,
}

#[derive(Debug)]
struct Mark {
    /// Believed until then: `ttl` after the answer it stands on was asked
    /// for (reckoned once, when marked: an order compares instants).
    stale_at: Instant,
    /// Renewed from then on (half its life).
    renew_at: Instant,
    /// A background read of the stock is under way.
    renewing: AtomicBool,
}

/// What the marker says about a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    No,
    /// Sold out; `renew`: the caller should read the stock in the
    /// background and report with [`SoldOutMarks::renewed`].
    Yes {
        renew: bool,
    },
}

impl SoldOutMarks {
    /// `ttl` zero disables the marker.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            marks: RwLock::default(),
        }
    }

    /// True while a fresh mark says the sale is sold out.
    #[cfg(test)]
    pub fn is_marked(&self, product: &ProductId) -> bool {
        matches!(self.check(product), Marked::Yes { .. })
    }

    /// Whether a fresh mark says the sale is sold out, and whether it is due
    /// for renewal (claimed by this caller: one read at a time).
    pub fn check(&self, product: &ProductId) -> Marked {
        self.check_at(product, Instant::now())
    }

    /// [`Self::check`] at `now`.
    pub fn check_at(&self, product: &ProductId, now: Instant) -> Marked {
        if self.ttl.is_zero() {
            return Marked::No;
        }
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        let Some(mark) = marks.get(product) else {
            return Marked::No;
        };
        if now >= mark.stale_at {
            return Marked::No;
        }
        let renew = now >= mark.renew_at && !mark.renewing.swap(true, Ordering::AcqRel);
        Marked::Yes { renew }
    }

    /// Redis said sold out to a call sent at `since`: remember it for `ttl` from then.
    pub fn mark_since(&self, product: &ProductId, since: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
        if marks.len() >= PRUNE_AT {
            let now = Instant::now();
            marks.retain(|_, m| now < m.stale_at);
        }
        marks.insert(
            product.clone(),
            Mark {
                stale_at: after(since, self.ttl),
                renew_at: after(since, self.ttl / 2),
                renewing: AtomicBool::new(false),
            },
        );
    }

    /// Redis said sold out just now.
    #[cfg(test)]
    pub fn mark(&self, product: &ProductId) {
        self.mark_since(product, Instant::now());
    }

    /// A background read of the stock, sent at `sent`, found `sold_out`
    /// (true) or units left (false).
    pub fn renewed(&self, product: &ProductId, sent: Instant, sold_out: bool) {
        if sold_out {
            self.mark_since(product, sent);
        } else {
            self.clear(product);
        }
    }

    /// A background read failed: the mark stays until it expires.
    pub fn renewal_failed(&self, product: &ProductId) {
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        if let Some(mark) = marks.get(product) {
            mark.renewing.store(false, Ordering::Release);
        }
    }

    /// Stock came back through this process.
    pub fn clear(&self, product: &ProductId) {
        let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
        marks.remove(product);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(n: usize) -> ProductId {
        ProductId::parse(&format!("sku-{n}")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_mark_expires_after_its_ttl() {
        let marks = SoldOutMarks::new(Duration::from_millis(30));
        assert!(!marks.is_marked(&sku(1)));
        marks.mark(&sku(1));
        assert!(marks.is_marked(&sku(1)));
        assert!(!marks.is_marked(&sku(2)));
        tokio::time::advance(Duration::from_millis(40)).await;
        assert!(!marks.is_marked(&sku(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn past_half_its_life_a_mark_asks_for_one_renewal_which_extends_or_drops_it() {
        let marks = SoldOutMarks::new(Duration::from_millis(60));
        marks.mark(&sku(1));
        assert_eq!(marks.check(&sku(1)), Marked::Yes { renew: false });
        tokio::time::advance(Duration::from_millis(35)).await;
        assert_eq!(marks.check(&sku(1)), Marked::Yes { renew: true });
        assert_eq!(
            marks.check(&sku(1)),
            Marked::Yes { renew: false },
            "one renewal at a time"
        );
        // Still sold out, read just now: good for another ttl.
        marks.renewed(&sku(1), Instant::now(), true);
        tokio::time::advance(Duration::from_millis(35)).await;
        assert!(marks.is_marked(&sku(1)), "renewed");
        // Units found: the mark goes.
        marks.renewed(&sku(1), Instant::now(), false);
        assert!(!marks.is_marked(&sku(1)));
        // A failed read lets the next order try again.
        marks.mark_since(&sku(2), Instant::now() - Duration::from_millis(40));
        assert_eq!(marks.check(&sku(2)), Marked::Yes { renew: true });
        marks.renewal_failed(&sku(2));
        assert_eq!(marks.check(&sku(2)), Marked::Yes { renew: true });
    }

    #[test]
    fn a_zero_ttl_disables_the_marker_and_clear_removes_a_mark() {
        let off = SoldOutMarks::new(Duration::ZERO);
        off.mark(&sku(1));
        assert!(!off.is_marked(&sku(1)));
        let on = SoldOutMarks::new(Duration::from_secs(60));
        on.mark(&sku(1));
        on.clear(&sku(1));
        assert!(!on.is_marked(&sku(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_marks_are_pruned_so_memory_stays_bounded() {
        let marks = SoldOutMarks::new(Duration::from_millis(1));
        for n in 0..5 * PRUNE_AT {
            marks.mark(&sku(n));
            if n % PRUNE_AT == 0 {
                tokio::time::advance(Duration::from_millis(2)).await;
            }
        }
        assert!(marks.marks.read().unwrap().len() <= PRUNE_AT + 1);
    }
}
