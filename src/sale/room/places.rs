//! Places in the line, computed where they are asked, from a ticket's
//! number and a few figures of the room (no per-buyer state anywhere):
//!
//! - the `n`-th of `N` early joiners stands at `draw(n) + 1`, where `draw`
//!   is a pseudorandom permutation of `0..N` keyed by the sale's secret
//!   draw seed: a uniformly random order that no buyer can predict or
//!   improve (joining 5 minutes or 5 ms early is the same), fixed once `N`
//!   is known, at the start;
//! - the `n`-th late joiner stands at `N + n`.
//!
//! The permutation is a balanced Feistel network (4 rounds, SHA-256 as its
//! round function) over the smallest power of 4 at least `N`, walked until
//! it lands in `0..N` (cycle walking: still a permutation of `0..N`).

use sha2::{Digest, Sha256};

use super::pass::Number;

/// Rounds of the Feistel network (4: a strong pseudorandom permutation).
const ROUNDS: u8 = 4;

/// The count of the buyers who joined before the start: final once the
/// draw is done (a reading taken after the start), still counting before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Early {
    Counting(u64),
    Final(u64),
}

/// The place (from 1) in the line of a buyer with `number`, once the draw is
/// done (`None` before it: the count is not final). A late joiner's
/// ticket with a reading from before the draw (the instance read the room
/// before the start, the buyer joined after it) waits for a reading from
/// after it too: the count as last read may be short of the final one, and
/// the place would come out too near the front.
pub fn place(number: Number, early: Early, seed: &[u8; 32]) -> Option<u64> {
    match (number, early) {
        (Number::Early(n), Early::Final(total)) if n <= total => Some(draw(n - 1, total, seed) + 1),
        (Number::Late(n), Early::Final(total)) => Some(total + n),
        (_, _) => None,
    }
}

/// The image of `i` (in `0..n`) under the sale's permutation of `0..n`.
pub fn draw(i: u64, n: u64, seed: &[u8; 32]) -> u64 {
    if n <= 1 {
        return 0;
    }
    // Halves of `half` bits each: a domain of 4^half >= n.
    let bits = 64 - (n - 1).leading_zeros();
    let half = bits.div_ceil(2).max(1);
    let mask = (1u64 << half) - 1;
    let mut x = i;
    loop {
        let (mut left, mut right) = (x >> half, x & mask);
        for round in 0..ROUNDS {
            let f = round_function(seed, round, right) & mask;
            (left, right) = (right, left ^ f);
        }
        x = (left << half) | right;
        if x < n {
            return x;
        }
    }
}

fn round_function(seed: &[u8; 32], round: u8, value: u64) -> u64 {
    let digest = Sha256::new()
        .chain_update(seed)
        .chain_update([round])
        .chain_update(value.to_le_bytes())
        .finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; 32] = [7; 32];

    #[test]
    fn the_draw_is_a_permutation_for_every_size() {
        for n in [1, 2, 3, 4, 5, 15, 16, 17, 100, 1000, 4097] {
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let p = draw(i, n, &SEED);
                assert!(p < n, "{p} of {n}");
                assert!(!seen[p as usize], "{p} twice in {n}");
                seen[p as usize] = true;
            }
        }
    }

    /// With a fixed seed: the place drawn is independent of the join order
    /// (Spearman's rank correlation near 0), and the first tenth to join
    /// spreads evenly over the line (chi-square over ten deciles).
    #[test]
    fn the_draw_does_not_favour_the_early_early_joiners() {
        let n = 10_000u64;
        let places: Vec<u64> = (0..n).map(|i| draw(i, n, &SEED)).collect();
        let mean = (n - 1) as f64 / 2.0;
        let (mut cov, mut var) = (0.0, 0.0);
        for (i, p) in places.iter().enumerate() {
            cov += (i as f64 - mean) * (*p as f64 - mean);
            var += (i as f64 - mean).powi(2);
        }
        let rho = cov / var;
        assert!(rho.abs() < 0.03, "rank correlation {rho}");

        let first_tenth = &places[..(n / 10) as usize];
        let mut deciles = [0f64; 10];
        for p in first_tenth {
            deciles[(p * 10 / n) as usize] += 1.0;
        }
        let expected = first_tenth.len() as f64 / 10.0;
        let chi2: f64 = deciles
            .iter()
            .map(|o| (o - expected).powi(2) / expected)
            .sum();
        // 9 degrees of freedom: 21.67 is the 99th percentile.
        assert!(chi2 < 21.67, "chi-square {chi2} over {deciles:?}");
        // Another seed, another order.
        let other: Vec<u64> = (0..n).map(|i| draw(i, n, &[8; 32])).collect();
        assert_ne!(places, other);
    }

    #[test]
    fn late_joiners_stand_after_every_early_joiner_in_arrival_order() {
        assert_eq!(place(Number::Late(1), Early::Final(50), &SEED), Some(51));
        assert_eq!(
            place(Number::Late(3), Early::Counting(50), &SEED),
            None,
            "a count read before the draw may be short of the final one"
        );
        assert_eq!(
            place(Number::Early(3), Early::Counting(50), &SEED),
            None,
            "before the draw"
        );
        let p = place(Number::Early(3), Early::Final(50), &SEED).unwrap();
        assert!((1..=50).contains(&p));
    }
}
