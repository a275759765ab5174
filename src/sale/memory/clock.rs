//! Redis's clock, as seen from this process: the sale window is decided by
//! Redis `TIME` (in `place_order.lua`), so answering "not started" or
//! "ended" from memory needs Redis's time, not this machine's.
//!
//! A [`Sample`] is one reading of Redis `TIME` and the local clock readings
//! just before the call was sent and just after its answer came back: Redis
//! read its clock somewhere in between, so its time now is known to within
//! half that round trip (plus the millisecond `TIME` is truncated to, plus
//! how far the two clocks may drift apart since). [`Sample::bounds`] gives
//! that interval; a caller answers from memory only when the whole interval,
//! widened by a safety margin, is on one side of a boundary.
//!
//! The local clock is the wall clock plus an offset (`skew`) that tests use
//! to play a machine whose clock is off: a constant skew cancels out (the
//! sample measures it). A wall clock that *steps* (an NTP correction) is
//! caught by comparing its advance with the monotonic clock's since the
//! sample: a sample that disagrees is not used until the next one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// How much the local and Redis clocks may drift apart per second of a
/// sample's age: 1 ms/s, ten times what unsynchronised quartz does.
const DRIFT_PER_SEC_MS: f64 = 1.0;
/// A wall clock and the monotonic clock that disagree by more than this
/// since a sample: the wall clock stepped.
const STEP_TOLERANCE_MS: i64 = 5;
/// A sample older than this is not used at all.
pub const MAX_SAMPLE_AGE: Duration = Duration::from_secs(30);

/// This process's clock: the wall clock, plus `skew`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalClock {
    skew_ms: i64,
}

/// A reading of the local clock: wall time (ms) and the monotonic instant.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub wall_ms: i64,
    pub at: Instant,
}

impl LocalClock {
    /// A clock `skew_ms` ahead of the wall clock (behind when negative).
    pub fn skewed(skew_ms: i64) -> Self {
        Self { skew_ms }
    }

    pub fn now(&self) -> Reading {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Reading {
            wall_ms: wall + self.skew_ms,
            at: Instant::now(),
        }
    }
}

/// One reading of Redis's clock, placed on the local one.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Redis `TIME` minus the local clock at the call's midpoint (ms).
    offset_ms: i64,
    /// The local reading at the call's midpoint.
    mid: Reading,
    /// Half the round trip, plus `TIME`'s truncation (ms).
    error_ms: i64,
}

impl Sample {
    /// Redis answered `redis_ms` to a call sent at `sent` and answered at `received`.
    pub fn new(redis_ms: i64, sent: Reading, received: Reading) -> Self {
        let rtt = received.at.saturating_duration_since(sent.at);
        let half = rtt / 2;
        let mid = Reading {
            wall_ms: sent.wall_ms + half.as_millis() as i64,
            at: sent.at + half,
        };
        Self {
            offset_ms: redis_ms - mid.wall_ms,
            mid,
            // Round up, and `TIME` in ms is up to 1 ms behind the true time.
            error_ms: half.as_micros().div_ceil(1000) as i64 + 1,
        }
    }

    /// How far Redis's clock is ahead of the local one (ms; negative: behind).
    #[cfg(test)]
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// Redis's time at local reading `now`, as `(earliest, latest)` in ms;
    /// `None` when this sample cannot say (too old, or the wall clock
    /// stepped since it was taken).
    pub fn bounds(&self, now: Reading) -> Option<(i64, i64)> {
        let age = now.at.checked_duration_since(self.mid.at)?;
        if age > MAX_SAMPLE_AGE {
            return None;
        }
        let wall_advance = now.wall_ms - self.mid.wall_ms;
        if (wall_advance - age.as_millis() as i64).abs() > STEP_TOLERANCE_MS {
            return None;
        }
        let estimate = now.wall_ms + self.offset_ms;
        let drift = (age.as_secs_f64() * DRIFT_PER_SEC_MS).ceil() as i64;
        let error = self.error_ms + drift;
        Some((estimate - error, estimate + error))
    }

    /// Whether `other` pins Redis's time down more tightly now than this one.
    pub fn is_tighter(&self, other: &Sample, now: Reading) -> bool {
        match (self.bounds(now), other.bounds(now)) {
            (Some((lo, hi)), Some((olo, ohi))) => hi - lo < ohi - olo,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// How long ago it was taken.
    pub fn age(&self, now: Reading) -> Duration {
        now.at.saturating_duration_since(self.mid.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(wall_ms: i64, at: Instant) -> Reading {
        Reading { wall_ms, at }
    }

    #[test]
    fn a_sample_places_redis_time_within_half_the_round_trip() {
        let t0 = Instant::now();
        // Local clock 5 s behind Redis; a 10 ms round trip.
        let sent = reading(1_000_000, t0);
        let received = reading(1_000_010, t0 + Duration::from_millis(10));
        let s = Sample::new(1_005_007, sent, received);
        assert_eq!(s.offset_ms(), 5_002);
        let (lo, hi) = s.bounds(received).unwrap();
        // Redis read its clock between the send and the answer: now it is
        // between 1_005_007 and 1_005_017 (+1 ms truncation).
        assert!(lo <= 1_005_007 && hi >= 1_005_018, "{lo}..{hi}");
        assert!(hi - lo <= 14, "{lo}..{hi}");
    }

    #[test]
    fn the_bounds_widen_with_age_and_vanish_when_old() {
        let t0 = Instant::now();
        let s = Sample::new(500, reading(0, t0), reading(0, t0));
        let (lo, hi) = s.bounds(reading(0, t0)).unwrap();
        let later = t0 + Duration::from_secs(10);
        let (llo, lhi) = s.bounds(reading(10_000, later)).unwrap();
        assert!(lhi - llo >= hi - lo + 20, "{llo}..{lhi} vs {lo}..{hi}");
        assert!(llo <= 10_500 && lhi >= 10_500);
        let too_old = t0 + MAX_SAMPLE_AGE + Duration::from_secs(1);
        assert!(s.bounds(reading(31_000, too_old)).is_none());
    }

    #[test]
    fn a_wall_clock_step_since_the_sample_makes_it_unusable() {
        let t0 = Instant::now();
        let s = Sample::new(500, reading(0, t0), reading(0, t0));
        let one_sec = t0 + Duration::from_secs(1);
        assert!(s.bounds(reading(1_000, one_sec)).is_some());
        assert!(s.bounds(reading(3_000, one_sec)).is_none(), "stepped ahead");
        assert!(s.bounds(reading(-1_000, one_sec)).is_none(), "stepped back");
    }

    #[test]
    fn a_constant_skew_cancels_out() {
        for skew in [-7_000, 0, 7_000] {
            let clock = LocalClock::skewed(skew);
            let redis_now = LocalClock::default().now().wall_ms;
            let (sent, received) = (clock.now(), clock.now());
            let s = Sample::new(redis_now, sent, received);
            let (lo, hi) = s.bounds(clock.now()).unwrap();
            let truth = LocalClock::default().now().wall_ms;
            assert!(
                lo <= truth && truth <= hi + 1,
                "skew {skew}: {lo}..{hi} vs {truth}"
            );
        }
    }
}
