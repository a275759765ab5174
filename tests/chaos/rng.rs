//! A tiny seeded PRNG (SplitMix64). The fault schedule, its pauses and the
//! order plan all follow from one seed, so a failing run can be replayed with
//! `CHAOS_SEED` (process scheduling still varies, so a replay is close, not exact).

use std::time::Duration;

/// The seed when `CHAOS_SEED` is not set: a fixed one, so plain `cargo test`
/// runs the same schedule every time.
pub const DEFAULT_SEED: u64 = 0x5EED_F1A5_05A1_E000;

/// `CHAOS_SEED` (decimal, or hex with `0x`), else [`DEFAULT_SEED`].
pub fn seed_from_env() -> u64 {
    let Ok(text) = std::env::var("CHAOS_SEED") else {
        return DEFAULT_SEED;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|_| panic!("CHAOS_SEED={text:?} is not a u64"))
}

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// A random index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration between `lo_ms` and `hi_ms` milliseconds, both included.
    pub fn millis(&mut self, lo_ms: u64, hi_ms: u64) -> Duration {
        Duration::from_millis(lo_ms + self.below(hi_ms - lo_ms + 1))
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.index(i + 1));
        }
    }

    /// An independent stream for another task, drawn from this one.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}
