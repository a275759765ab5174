//! Per sale: what each recent buyer may still buy, as Redis last said (an
//! accept's remaining allowance, or a `limit` refusal's). An order for more
//! is refused from memory while the mark is fresh.
//!
//! A mark can only be too low when units came back to the buyer (a cancel):
//! a release through this process clears the buyer's mark at once; through
//! another instance, this one may refuse the buyer for up to `ttl`. A mark
//! that is too high (the buyer bought through another instance) costs one
//! trip to Redis, which refuses.
//!
//! Bounded: at most `cap` buyers per sale. A full table drops its expired
//! marks (at most once per `ttl / 8`, so a table full of fresh marks costs
//! no scan per order); if it is still full, new buyers are not remembered
//! (they are asked about in Redis, as without the table).

use std::sync::RwLock;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct BuyerMarks {
    ttl: Duration,
    cap: usize,
    // A std RwLock: held for a hash lookup only, never across an await.
    marks: RwLock<Table>,
}

#[derive(Debug, Default)]
struct Table {
    marks: super::maps::Map<u64, Mark>,
    pruned: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    allowance: u64,
    until: Instant,
}

impl BuyerMarks {
    /// `ttl` zero or `cap` zero disables the table.
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            ttl,
            cap,
            marks: RwLock::default(),
        }
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.cap > 0
    }

    /// The units `user` may still buy, if a fresh mark says so.
    pub fn allowance(&self, user: u64) -> Option<u64> {
        self.allowance_at(user, Instant::now())
    }

    /// [`Self::allowance`] at `now`.
    pub fn allowance_at(&self, user: u64, now: Instant) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        let table = self.marks.read().unwrap_or_else(|e| e.into_inner());
        table
            .marks
            .get(&user)
            .filter(|m| now < m.until)
            .map(|m| m.allowance)
    }

    /// Redis said `user` may buy `allowance` more units.
    pub fn mark(&self, user: u64, allowance: u64) {
        if !self.enabled() {
            return;
        }
        let now = Instant::now();
        let mut table = self.marks.write().unwrap_or_else(|e| e.into_inner());
        if table.marks.len() >= self.cap && !table.marks.contains_key(&user) {
            let due = table
                .pruned
                .is_none_or(|at| now.duration_since(at) >= self.ttl / 8);
            if due {
                table.marks.retain(|_, m| now < m.until);
                table.pruned = Some(now);
            }
            if table.marks.len() >= self.cap {
                return;
            }
        }
        table.marks.insert(
            user,
            Mark {
                allowance,
                until: now + self.ttl,
            },
        );
    }

    /// Units came back to `user` through this process.
    pub fn clear(&self, user: u64) {
        let mut table = self.marks.write().unwrap_or_else(|e| e.into_inner());
        table.marks.remove(&user);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .marks
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_mark_holds_the_allowance_until_it_expires_or_is_cleared() {
        let marks = BuyerMarks::new(Duration::from_millis(40), 10);
        assert_eq!(marks.allowance(7), None);
        marks.mark(7, 0);
        marks.mark(8, 2);
        assert_eq!(marks.allowance(7), Some(0));
        assert_eq!(marks.allowance(8), Some(2));
        marks.clear(8);
        assert_eq!(marks.allowance(8), None);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(marks.allowance(7), None, "expired");
    }

    #[test]
    fn a_million_buyers_never_grow_the_table_past_its_cap() {
        let marks = BuyerMarks::new(Duration::from_secs(60), 10_000);
        for user in 1..=1_000_000 {
            marks.mark(user, 0);
        }
        assert_eq!(marks.len(), 10_000);
        // The first ones stay remembered; the rest go to Redis.
        assert_eq!(marks.allowance(1), Some(0));
        assert_eq!(marks.allowance(1_000_000), None);
        // A remembered buyer's mark is still updated when the table is full.
        marks.mark(1, 3);
        assert_eq!(marks.allowance(1), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_makes_room_by_dropping_expired_marks() {
        let marks = BuyerMarks::new(Duration::from_millis(5), 100);
        for user in 1..=100 {
            marks.mark(user, 0);
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        marks.mark(1_000, 0);
        assert_eq!(marks.allowance(1_000), Some(0));
        assert_eq!(marks.len(), 1);
    }

    #[test]
    fn a_zero_ttl_or_cap_disables_the_table() {
        for marks in [
            BuyerMarks::new(Duration::ZERO, 10),
            BuyerMarks::new(Duration::from_secs(1), 0),
        ] {
            marks.mark(1, 0);
            assert_eq!(marks.allowance(1), None);
        }
    }
}
