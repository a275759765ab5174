//! Trying again: the waits between attempts, as `backon`'s exponential
//! back-off (an iterator of waits: doubling from a first wait up to a last,
//! without end, with or without jitter), and [`retrying`], a few attempts
//! at once for a failure that changed nothing. The one place the project's
//! retries are shaped.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Waits doubling from `first` up to `last`, then `last` again and again.
pub fn doubling(first: Duration, last: Duration) -> ExponentialBackoff {
    builder(first, last).build()
}

/// Waits whose ceiling doubles from `first` up to `last`, each drawn at
/// random from the upper half of its ceiling (jitter): the first in
/// `[first/2, first)`, the next in `[first, 2*first)`, ..., at most
/// `[last/2, last)`. backon's jitter adds up to one more wait to each, so
/// its waits start from half.
pub fn jittered(first: Duration, last: Duration) -> ExponentialBackoff {
    builder(first / 2, last / 2).with_jitter().build()
}

/// The wait after the `failures`-th failure in a row (1: the first) of
/// [`jittered`], for a caller that keeps the count rather than the
/// iterator (the deliverer keeps it in MySQL).
pub fn jittered_after(failures: u32, first: Duration, last: Duration) -> Duration {
    // 64 doublings pass any `last` from any `first` (2^64 ns: 584 years).
    let skip = failures.saturating_sub(1).min(64) as usize;
    jittered(first, last).nth(skip).unwrap_or(last)
}

fn builder(first: Duration, last: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first.min(last))
        .with_max_delay(last)
        .without_max_times()
}

/// `op`, tried again at once while it fails with an error `retry` calls
/// safe to try again (nothing changed: a deadlock's victim, a lost insert
/// race), `attempts` tries in all; the last answer as it is.
pub async fn retrying<T, E, Fut>(
    attempts: usize,
    retry: impl Fn(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Err(e) if attempt < attempts && retry(&e) => {
                tracing::debug!(error = %super::chain::Chain(&e), attempt, "trying again");
            }
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Within a few nanoseconds (backon doubles in `f32` seconds).
    fn near(d: Duration, want: Duration) -> bool {
        d.abs_diff(want) < Duration::from_micros(1)
    }

    #[test]
    fn doubling_waits_double_up_to_the_last_and_stay_there() {
        let waits: Vec<_> = doubling(100 * MS, 500 * MS).take(6).collect();
        for (d, want) in waits.iter().zip([100, 200, 400, 500, 500, 500]) {
            assert!(near(*d, want * MS), "{waits:?}");
        }
    }

    #[test]
    fn jittered_waits_come_from_the_upper_half_of_a_doubling_ceiling() {
        for _ in 0..200 {
            let waits: Vec<_> = jittered(200 * MS, 1_000 * MS).take(6).collect();
            for (d, ceiling) in waits.iter().zip([200, 400, 800, 1_000, 1_000, 1_000]) {
                let ceiling = ceiling * MS;
                assert!(
                    *d + Duration::from_micros(1) >= ceiling / 2 && *d <= ceiling,
                    "{waits:?}"
                );
            }
        }
        // Drawn, not fixed.
        let firsts: std::collections::BTreeSet<_> = (0..20)
            .filter_map(|_| jittered(200 * MS, MS * 1_000).next())
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }

    #[test]
    fn the_wait_after_a_count_of_failures_is_the_iterators() {
        let after = |n| jittered_after(n, 200 * MS, 300_000 * MS);
        assert!((100 * MS..=200 * MS).contains(&after(1)), "{:?}", after(1));
        assert!((200 * MS..=400 * MS).contains(&after(2)), "{:?}", after(2));
        assert!(after(0) <= 200 * MS, "no failure yet: as the first");
        // 200 ms doubled 11 times passes 5 minutes: the cap's upper half.
        assert!((150_000 * MS..=300_000 * MS).contains(&after(12)));
        assert!((150_000 * MS..=300_000 * MS).contains(&after(100)));
        // A first wait above the last is the last.
        assert!(jittered_after(1, 10 * MS, 4 * MS) <= 4 * MS);
    }
}
