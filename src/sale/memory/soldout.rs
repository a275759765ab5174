//! The in-process sold-out marker. After a sale sells out, most of its
//! traffic is for stock that is gone; answering those from memory saves a
//! Redis round trip each (see BENCHMARKS.md).
//!
//! It must not undersell: stock can come back (a cancellation, another
//! instance's release), so a mark expires after `ttl` and the next order goes
//! to Redis again, which either renews it or sells the returned units. A
//! release through this process clears the mark at once; in the worst case an
//! instance claims "sold out" for `ttl` after stock returned elsewhere.
//!
//! Memory is bounded by the sales that sold out (a mark is only set on the
//! script's `sold_out`, which needs a real, open sale); expired marks are
//! dropped whenever the map grows past `PRUNE_AT`.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::domain::ProductId;

const PRUNE_AT: usize = 1024;

#[derive(Debug)]
pub struct SoldOutMarks {
    ttl: Duration,
    // A std RwLock: held for a hash lookup only, never across an await.
    marks: RwLock<HashMap<ProductId, Instant>>,
}

impl SoldOutMarks {
    /// `ttl` zero disables the marker.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            marks: RwLock::default(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// True while a fresh mark says the sale is sold out.
    pub fn is_marked(&self, product: &ProductId) -> bool {
        if self.ttl.is_zero() {
            return false;
        }
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        marks
            .get(product)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Redis said sold out: remember it for `ttl`.
    pub fn mark(&self, product: &ProductId) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
        if marks.len() >= PRUNE_AT {
            marks.retain(|_, until| now < *until);
        }
        marks.insert(product.clone(), now + self.ttl);
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

    #[test]
    fn a_mark_expires_after_its_ttl() {
        let marks = SoldOutMarks::new(Duration::from_millis(30));
        assert!(!marks.is_marked(&sku(1)));
        marks.mark(&sku(1));
        assert!(marks.is_marked(&sku(1)));
        assert!(!marks.is_marked(&sku(2)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!marks.is_marked(&sku(1)));
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

    #[test]
    fn expired_marks_are_pruned_so_memory_stays_bounded() {
        let marks = SoldOutMarks::new(Duration::from_millis(1));
        for n in 0..5 * PRUNE_AT {
            marks.mark(&sku(n));
            if n % PRUNE_AT == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert!(marks.marks.read().unwrap().len() <= PRUNE_AT + 1);
    }
}
