//! What this process remembers of Redis's answers, to answer the orders
//! that cannot change the books without asking Redis again: a sale's Redis
//! core is the ceiling of that sale, so it should spend its time on the
//! orders that can be accepted, not on the crowd around them.
//!
//! Every answer from memory is a refusal that Redis gave (or would give)
//! too, and each has a bound on how stale it can be:
//!
//! | answer | remembered from | answered while | stale at most |
//! |---|---|---|---|
//! | `product_not_found` | the registry, read every `unknown_ttl` ([`known`]) | the id is not in a fresh read | `unknown_ttl` after a sale opened elsewhere |
//! | `sale_not_started` / `sale_ended` | the sale's window, and Redis's clock ([`clock`]) | Redis's time is certainly outside the window, by `window_margin` | never (a clock bound, not a cache) |
//! | `sold_out` | the script's `sold_out` ([`soldout`]) | `sold_out_ttl` | `sold_out_ttl` after units came back elsewhere |
//! | `limit_exceeded` | the buyer's allowance after an accept or a `limit` ([`buyers`]) | `limit_ttl` | `limit_ttl` after a cancel elsewhere |
//!
//! Orders with an `Idempotency-Key` are answered from memory only when no
//! order can exist yet (unknown product, sale not started): a retry must get
//! its order back, and only Redis has it.

mod buyers;
pub mod clock;
mod known;
mod maps;
mod soldout;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

pub use buyers::BuyerMarks;
pub use clock::{LocalClock, Reading, Sample};
pub use known::{Known, KnownSales};
pub use soldout::{Marked, SoldOutMarks};

use super::rejection::Rejection;
use crate::config::MemorySettings;
use crate::domain::ProductId;
use maps::Map;

/// Open sales remembered at most (more are asked about in Redis).
const MAX_SALES: usize = 10_000;
/// A sale's clock sample is renewed when it is this old and orders come.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One sale, as remembered.
#[derive(Debug)]
struct SaleMemory {
    /// The window and the reading of Redis's clock it is judged by.
    window: RwLock<Window>,
    /// A background read of the window and clock is under way.
    refreshing: AtomicBool,
    buyers: BuyerMarks,
}

/// A sale's window, and Redis's clock, as learned.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// `[start_ms, end_ms)` by Redis's clock (it never changes while the
    /// sale exists).
    bounds: Option<(i64, i64)>,
    sample: Option<Sample>,
}

impl Window {
    /// Redis's time at `now` as `(earliest, latest)`, when a usable sample says.
    fn redis_time(&self, now: Reading) -> Option<(i64, i64)> {
        self.sample?.bounds(now)
    }

    /// Due for a background read: nothing known yet, or the sample is old
    /// or no longer usable (`redis_time` is its bounds now).
    fn due(&self, now: Reading, redis_time: Option<(i64, i64)>) -> bool {
        self.bounds.is_none()
            || redis_time.is_none()
            || self.sample.is_none_or(|s| s.age(now) >= SAMPLE_EVERY)
    }
}

/// What memory says about one order.
#[derive(Debug, Default)]
pub struct Recall {
    /// The answer, when memory can give it.
    pub answer: Option<Rejection>,
    /// Read the registry again (in the background).
    pub refresh_known: bool,
    /// Read the sale's window and Redis's clock (in the background).
    pub refresh_sale: bool,
    /// Read the sale's stock to renew its sold-out mark (in the background).
    pub renew_sold_out: bool,
}

/// What `place_order.lua` answered, for memory to learn from.
#[derive(Debug, Clone, Copy)]
pub enum Heard {
    NoSale,
    /// Redis's time (`now_ms`) was outside the window.
    OutsideWindow {
        start_ms: i64,
        end_ms: i64,
        now_ms: i64,
    },
    Accepted {
        now_ms: i64,
        allowance_left: u64,
    },
    SoldOut,
    Limit {
        allowance: u64,
    },
    Other,
}

impl Heard {
    /// What a refusal by the order script tells the memory.
    pub fn of(why: &Rejection) -> Self {
        match *why {
            Rejection::NoSale => Self::NoSale,
            Rejection::SoldOut => Self::SoldOut,
            Rejection::LimitExceeded { allowance } => Self::Limit { allowance },
            // Nothing the memory keeps: the window comes with the script's
            // answer whole (`OutsideWindow`); a pause, an admission and the
            // units left change under it.
            Rejection::NotStarted { .. }
            | Rejection::Ended
            | Rejection::InsufficientStock { .. }
            | Rejection::AdmissionRequired
            | Rejection::Paused { .. } => Self::Other,
        }
    }
}

#[derive(Debug)]
pub struct Memory {
    settings: MemorySettings,
    clock: LocalClock,
    sold_out: SoldOutMarks,
    known: KnownSales,
    sales: RwLock<Map<ProductId, Arc<SaleMemory>>>,
}

impl Memory {
    pub fn new(settings: MemorySettings) -> Self {
        Self {
            clock: LocalClock::skewed(settings.clock_skew_ms),
            sold_out: SoldOutMarks::new(settings.sold_out_ttl),
            known: KnownSales::new(settings.unknown_ttl, MAX_SALES),
            sales: RwLock::default(),
            settings,
        }
    }

    pub fn now(&self) -> Reading {
        self.clock.now()
    }

    pub fn known(&self) -> &KnownSales {
        &self.known
    }

    fn sale(&self, product: &ProductId) -> Option<Arc<SaleMemory>> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        sales.get(product).cloned()
    }

    fn sale_or_new(&self, product: &ProductId) -> Option<Arc<SaleMemory>> {
        if let Some(sale) = self.sale(product) {
            return Some(sale);
        }
        let mut sales = self.sales.write().unwrap_or_else(|e| e.into_inner());
        if sales.len() >= MAX_SALES && !sales.contains_key(product) {
            return None;
        }
        let sale = sales.entry(product.clone()).or_insert_with(|| {
            Arc::new(SaleMemory {
                window: RwLock::default(),
                refreshing: AtomicBool::new(false),
                buyers: BuyerMarks::new(self.settings.limit_ttl, self.settings.limit_entries),
            })
        });
        Some(sale.clone())
    }

    /// Answers an order from memory if it can; says which reads are due.
    pub fn recall(&self, product: &ProductId, user: u64, quantity: u64, keyed: Keyed) -> Recall {
        // One reading of the clock for every check (each read its own: a
        // quarter of what recalling cost, BENCHMARKS.md "What does the
        // report cost?").
        let now = self.clock.now();
        let (known, refresh_known) = self.known.look(product, now.at);
        let mut recall = Recall {
            refresh_known,
            ..Recall::default()
        };
        match known {
            Known::Unknown => {
                recall.answer = Some(Rejection::NoSale);
                return recall;
            }
            Known::Open | Known::CannotSay => {}
        }
        let Some(sale) = self.sale(product) else {
            return recall;
        };
        let window = *sale.window.read().unwrap_or_else(|e| e.into_inner());
        let redis_time = window.redis_time(now);
        recall.refresh_sale = self.settings.window_margin.is_some()
            && window.due(now, redis_time)
            && !sale.refreshing.swap(true, Ordering::AcqRel);
        if let Some(r) = self.outside_window(window.bounds, redis_time, keyed) {
            recall.answer = Some(r);
        } else if keyed == Keyed::Yes {
            // Only Redis knows the key's order.
        } else if let Marked::Yes { renew } = self.sold_out.check_at(product, now.at) {
            recall.answer = Some(Rejection::SoldOut);
            recall.renew_sold_out = renew;
        } else if let Some(allowance) = sale.buyers.allowance_at(user, now.at)
            && quantity > allowance
        {
            recall.answer = Some(Rejection::LimitExceeded { allowance });
        }
        recall
    }

    /// `sale_not_started` while Redis's time is certainly before the start,
    /// `sale_ended` (unkeyed orders only) while certainly after the end.
    fn outside_window(
        &self,
        window: Option<(i64, i64)>,
        redis_time: Option<(i64, i64)>,
        keyed: Keyed,
    ) -> Option<Rejection> {
        let margin = self.settings.window_margin?.as_millis() as i64;
        let ((start, end), (earliest, latest)) = (window?, redis_time?);
        if latest + margin < start {
            let estimate = (earliest + latest) / 2;
            return Some(Rejection::NotStarted {
                starts_at_ms: start,
                in_ms: (start - estimate).max(0) as u64,
            });
        }
        (keyed == Keyed::No && earliest - margin >= end).then_some(Rejection::Ended)
    }

    /// Learns from the order script's answer to a call sent at `sent` and
    /// answered at `received`.
    pub fn learn(
        &self,
        product: &ProductId,
        user: u64,
        heard: Heard,
        sent: Reading,
        received: Reading,
    ) {
        match heard {
            Heard::NoSale => self.forget(product),
            Heard::OutsideWindow {
                start_ms,
                end_ms,
                now_ms,
            } => {
                if let Some(sale) = self.sale_or_new(product) {
                    sale.learn_window(start_ms, end_ms);
                    sale.learn_clock(Sample::new(now_ms, sent, received), received);
                }
            }
            Heard::Accepted {
                now_ms,
                allowance_left,
            } => {
                if let Some(sale) = self.sale_or_new(product) {
                    sale.buyers.mark(user, allowance_left);
                    sale.learn_clock(Sample::new(now_ms, sent, received), received);
                }
            }
            Heard::Limit { allowance } => {
                if let Some(sale) = self.sale_or_new(product) {
                    sale.buyers.mark(user, allowance);
                }
            }
            Heard::SoldOut => {
                self.sold_out.mark_since(product, sent.at);
                // Known to exist: its window and clock are read in the background.
                self.sale_or_new(product);
            }
            Heard::Other => {
                self.sale_or_new(product);
            }
        }
    }

    /// A background read of a sale's window and Redis's time: `window` is
    /// `None` when the sale does not exist.
    pub fn refreshed(
        &self,
        product: &ProductId,
        window: Option<(i64, i64)>,
        redis_ms: i64,
        sent: Reading,
        received: Reading,
    ) {
        let Some(sale) = self.sale(product) else {
            return;
        };
        match window {
            Some((start, end)) => {
                sale.learn_window(start, end);
                sale.learn_clock(Sample::new(redis_ms, sent, received), received);
            }
            None => self.forget(product),
        }
        sale.refreshing.store(false, Ordering::Release);
    }

    /// A background read of the stock, sent at `sent`, for a sold-out mark
    /// (`None`: the read failed).
    pub fn stock_read(&self, product: &ProductId, sent: Instant, stock: Option<Option<i64>>) {
        match stock {
            Some(stock) => self
                .sold_out
                .renewed(product, sent, stock.is_some_and(|s| s <= 0)),
            None => self.sold_out.renewal_failed(product),
        }
    }

    /// A background read failed: the next order may try again.
    pub fn refresh_failed(&self, product: &ProductId) {
        if let Some(sale) = self.sale(product) {
            sale.refreshing.store(false, Ordering::Release);
        }
    }

    /// Units came back to `user`'s sale through this process.
    pub fn released(&self, product: &ProductId, user: Option<u64>) {
        self.sold_out.clear(product);
        if let (Some(user), Some(sale)) = (user, self.sale(product)) {
            sale.buyers.clear(user);
        }
    }

    /// A sale was opened through this process.
    pub fn opened(&self, product: &ProductId) {
        self.known.opened(product);
    }

    /// Drops everything remembered of a sale (removed, reset, or gone).
    pub fn forget(&self, product: &ProductId) {
        let mut sales = self.sales.write().unwrap_or_else(|e| e.into_inner());
        sales.remove(product);
        drop(sales);
        self.sold_out.clear(product);
    }

    /// The registry as a read sent at `sent` found it: its sales are
    /// known; what was remembered of sales no longer in it (retired, or
    /// removed through another instance) is dropped, so that memory holds
    /// the sales that run, not every sale ever run.
    pub fn registry_read(&self, ids: Vec<ProductId>, sent: Instant) {
        self.known.replace(ids, sent);
        let gone: Vec<ProductId> = {
            let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
            sales
                .keys()
                .filter(|p| self.known.lookup(p) == Known::Unknown)
                .cloned()
                .collect()
        };
        for product in &gone {
            self.forget(product);
        }
    }

    /// A sale left the registry through this process.
    pub fn removed(&self, product: &ProductId) {
        self.forget(product);
        self.known.removed(product);
    }
}

impl SaleMemory {
    fn learn_window(&self, start_ms: i64, end_ms: i64) {
        self.window
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .bounds = Some((start_ms, end_ms));
    }

    /// Keeps whichever sample says more about Redis's time now.
    fn learn_clock(&self, sample: Sample, now: Reading) {
        let mut window = self.window.write().unwrap_or_else(|e| e.into_inner());
        let keep_old = window
            .sample
            .is_some_and(|old| old.age(now) < SAMPLE_EVERY && old.is_tighter(&sample, now));
        if !keep_old {
            window.sample = Some(sample);
        }
    }
}

/// Whether an order carries an Idempotency-Key: its retry must get its
/// order back, which only the script can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyed {
    Yes,
    No,
}

impl Keyed {
    pub fn of<T>(key: Option<T>) -> Self {
        match key {
            Some(_) => Self::Yes,
            None => Self::No,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(n: usize) -> ProductId {
        ProductId::parse(&format!("mem-{n}")).unwrap()
    }

    /// A memory that heard "not started" from a Redis whose clock reads
    /// `redis_ms` now, for a sale `[start, end)`.
    fn heard_outside(memory: &Memory, product: &ProductId, start: i64, end: i64, redis_ms: i64) {
        let now = memory.now();
        memory.learn(
            product,
            1,
            Heard::OutsideWindow {
                start_ms: start,
                end_ms: end,
                now_ms: redis_ms,
            },
            now,
            now,
        );
    }

    fn answer(memory: &Memory, product: &ProductId, keyed: Keyed) -> Option<Rejection> {
        memory.recall(product, 1, 1, keyed).answer
    }

    #[test]
    fn the_window_is_answered_only_while_certainly_outside_it() {
        let memory = Memory::new(MemorySettings::default());
        let p = sku(1);
        let redis_now = 1_000_000_000;
        // Starts in 10 s: certainly not started.
        heard_outside(
            &memory,
            &p,
            redis_now + 10_000,
            redis_now + 20_000,
            redis_now,
        );
        match answer(&memory, &p, Keyed::No) {
            Some(Rejection::NotStarted {
                starts_at_ms,
                in_ms,
            }) => {
                assert_eq!(starts_at_ms, redis_now + 10_000);
                assert!((9_900..=10_000).contains(&in_ms), "{in_ms}");
            }
            other => panic!("{other:?}"),
        }
        // Starts within the margin: ask Redis.
        let q = sku(2);
        heard_outside(&memory, &q, redis_now + 30, redis_now + 20_000, redis_now);
        assert_eq!(answer(&memory, &q, Keyed::No), None);
        // Ended 10 s ago: ended, but not for a keyed retry.
        let r = sku(3);
        heard_outside(
            &memory,
            &r,
            redis_now - 20_000,
            redis_now - 10_000,
            redis_now,
        );
        assert_eq!(answer(&memory, &r, Keyed::No), Some(Rejection::Ended));
        assert_eq!(answer(&memory, &r, Keyed::Yes), None);
        // Ended 30 ms ago (within the margin): ask Redis.
        let s = sku(4);
        heard_outside(&memory, &s, redis_now - 20_000, redis_now - 30, redis_now);
        assert_eq!(answer(&memory, &s, Keyed::No), None);
    }

    #[test]
    fn a_skewed_local_clock_does_not_move_the_window() {
        // Redis's clock is the truth; this process's is 5 s off either way.
        for skew in [-5_000, 5_000] {
            let memory = Memory::new(MemorySettings {
                clock_skew_ms: skew,
                ..MemorySettings::default()
            });
            let truth = LocalClock::default().now().wall_ms;
            // Started 1 s ago by Redis's clock: ask Redis.
            let p = sku(10);
            let now = memory.now();
            memory.learn(&p, 1, Heard::Other, now, now);
            memory.refreshed(&p, Some((truth - 1_000, truth + 60_000)), truth, now, now);
            assert_eq!(answer(&memory, &p, Keyed::No), None, "skew {skew}");
            // Starts in 3 s: not started.
            let q = sku(11);
            heard_outside(&memory, &q, truth + 3_000, truth + 60_000, truth);
            assert!(
                matches!(
                    answer(&memory, &q, Keyed::No),
                    Some(Rejection::NotStarted { .. })
                ),
                "skew {skew}"
            );
            // Ended 1 s ago: ended.
            let r = sku(12);
            heard_outside(&memory, &r, truth - 60_000, truth - 1_000, truth);
            assert_eq!(
                answer(&memory, &r, Keyed::No),
                Some(Rejection::Ended),
                "skew {skew}"
            );
        }
    }

    #[test]
    fn limits_and_sold_out_are_remembered_for_unkeyed_orders_only() {
        let memory = Memory::new(MemorySettings::default());
        let p = sku(20);
        let now = memory.now();
        memory.learn(
            &p,
            7,
            Heard::Accepted {
                now_ms: now.wall_ms,
                allowance_left: 0,
            },
            now,
            now,
        );
        assert_eq!(
            memory.recall(&p, 7, 1, Keyed::No).answer,
            Some(Rejection::LimitExceeded { allowance: 0 })
        );
        assert_eq!(memory.recall(&p, 7, 1, Keyed::Yes).answer, None);
        assert_eq!(
            memory.recall(&p, 8, 1, Keyed::No).answer,
            None,
            "another buyer"
        );
        memory.released(&p, Some(7));
        assert_eq!(memory.recall(&p, 7, 1, Keyed::No).answer, None);
        memory.learn(&p, 7, Heard::SoldOut, now, now);
        assert_eq!(
            memory.recall(&p, 9, 1, Keyed::No).answer,
            Some(Rejection::SoldOut)
        );
        assert_eq!(memory.recall(&p, 9, 1, Keyed::Yes).answer, None);
    }

    #[test]
    fn switched_off_it_answers_nothing() {
        let memory = Memory::new(MemorySettings::off());
        let p = sku(30);
        let now = memory.now();
        heard_outside(
            &memory,
            &p,
            now.wall_ms + 60_000,
            now.wall_ms + 90_000,
            now.wall_ms,
        );
        memory.learn(&p, 7, Heard::SoldOut, now, now);
        memory.learn(&p, 7, Heard::Limit { allowance: 0 }, now, now);
        memory.known.replace(vec![], Instant::now());
        let recall = memory.recall(&p, 7, 1, Keyed::No);
        assert_eq!(recall.answer, None);
        assert!(!recall.refresh_known && !recall.refresh_sale);
    }

    #[test]
    fn a_sale_gone_from_the_registry_is_forgotten() {
        let memory = Memory::new(MemorySettings::default());
        let (kept, retired) = (sku(40), sku(41));
        for p in [&kept, &retired] {
            heard_outside(&memory, p, 10_000, 20_000, 5_000);
        }
        assert_eq!(memory.sales.read().unwrap().len(), 2);
        memory.registry_read(vec![kept.clone()], Instant::now());
        let sales = memory.sales.read().unwrap();
        assert!(sales.contains_key(&kept) && !sales.contains_key(&retired));
    }
}
