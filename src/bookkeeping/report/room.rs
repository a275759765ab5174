//! The waiting room's figures, from the timeline's readings of the places
//! admitted and its joins: when each place was admitted, the wait in line, and the
//! admissions that ran out unused (by buyer: the room's places against the
//! books' buyers).

use std::collections::{BTreeMap, HashSet};

use super::figures::{LineWait, SecondView, second_at};

/// When each buyer joined: the buyers who joined before the start (all
/// placed at it, by the draw), and the second each later one's join was
/// counted (the `n`-th late joiner holds place `early + n`).
struct Joins {
    early: u64,
    late: Vec<i64>,
    start_s: i64,
}

impl Joins {
    fn of(seconds: &[SecondView], start_s: i64) -> Self {
        let mut joins = Self {
            early: 0,
            late: Vec::new(),
            start_s,
        };
        for s in seconds {
            if s.t < start_s {
                joins.early += s.joins;
            } else {
                joins
                    .late
                    .extend(std::iter::repeat_n(s.t, s.joins as usize));
            }
        }
        joins
    }

    /// The second the buyer of `place` (from 1) could first be admitted.
    fn place_from(&self, place: u64) -> Option<i64> {
        if place <= self.early {
            return Some(self.start_s);
        }
        self.late.get((place - self.early - 1) as usize).copied()
    }
}

/// The wait in line, from the room's numbers a second at a time: the
/// `k`-th place was admitted in the first second the room had admitted `k`
/// or more; the buyers who joined before the start (drawn at it) waited from
/// the start, the later ones from the second their join was counted;
/// `admitted`: [`admitted_at`]'s.
pub(super) fn wait_in_line(
    seconds: &[SecondView],
    start_s: i64,
    admitted: &[i64],
) -> Option<LineWait> {
    let joins = Joins::of(seconds, start_s);
    let mut waits: Vec<i64> = admitted
        .iter()
        .enumerate()
        .filter_map(|(i, at)| {
            let from = joins.place_from(i as u64 + 1)?;
            Some((at - from).max(0) * 1000)
        })
        .collect();
    if waits.is_empty() {
        return None;
    }
    waits.sort_unstable();
    Some(LineWait {
        buyers: waits.len() as u64,
        p50_ms: pick(&waits, 0.5),
        p90_ms: pick(&waits, 0.9),
        max_ms: *waits.last().unwrap_or(&0),
    })
}

/// The second each place was admitted (from 1: index 0 is place 1), by
/// the timeline's readings of the places admitted. Readings are sparse
/// when nobody polls (an instance reads the room when asked). The places
/// admitted between two readings are dated as the room itself admits
/// them: at the pace read before, from the earlier reading, never before
/// their buyer joined nor after the later reading (the room stops
/// admitting when it catches up with the joiners, and goes on as they
/// come). Without a pace read, they are spread evenly over the seconds
/// between. (Given all the later reading's second, admissions told +13,
/// +14 and +15 s were all put at +15; spread evenly, places all admitted
/// at +10 were dated up to the next reading.)
pub(super) fn admitted_at(seconds: &[SecondView], joined: u64, start_s: i64) -> Vec<i64> {
    let joins = Joins::of(seconds, start_s);
    let mut dated = Vec::new();
    // The previous reading: its second, the places admitted and the pace then.
    let mut previous: Option<(i64, u64, Option<i64>)> = None;
    for s in seconds {
        let Some(l) = s.admitted else { continue };
        let l = (l.max(0) as u64).min(joined);
        let so_far = dated.len() as u64;
        let (t0, l0, pace) = match previous {
            Some((t0, l0, pace)) if t0 < s.t && l0 <= so_far => (t0, l0, pace),
            _ => (s.t, so_far, None),
        };
        for place in so_far + 1..=l {
            let to_go = (place - l0) as i64;
            let at = match pace {
                Some(pace) if pace > 0 => {
                    let paced = t0 + (to_go + pace - 1) / pace;
                    paced.max(joins.place_from(place).unwrap_or(t0))
                }
                _ => t0 + to_go * (s.t - t0) / (l - l0).max(1) as i64,
            };
            dated.push(at.clamp(t0, s.t));
        }
        previous = Some((s.t, l.max(so_far), s.pace));
    }
    dated
}

/// Admissions that ran out unused: of the places admitted, those
/// whose buyer has no order, each in the second its admission ran out
/// (the second it was admitted, plus the admission's window; a
/// pause's lengthening not counted).
#[derive(Debug, Default, PartialEq)]
pub(super) struct RanOut {
    /// Admitted buyers without an order (their admission ran out, or has
    /// not yet).
    pub unused: u64,
    /// Of them, those whose admission ran out, by the second it did.
    pub by_second: BTreeMap<i64, u64>,
}

impl RanOut {
    /// `places`: `(user, place)` of every buyer with a place; `admitted`:
    /// the second each place was admitted; `window`: the admission's
    /// window (s); `now`: the second now.
    pub fn of(
        places: &[(u64, u64)],
        admitted: &[i64],
        ordered: &HashSet<u64>,
        window: i64,
        now: i64,
    ) -> Self {
        let mut out = Self::default();
        for (user, place) in places {
            let Some(at) = place.checked_sub(1).and_then(|i| admitted.get(i as usize)) else {
                continue;
            };
            if ordered.contains(user) {
                continue;
            }
            out.unused += 1;
            let ends = at + window;
            if ends < now {
                *out.by_second.entry(ends).or_default() += 1;
            }
        }
        out
    }
}

/// Counts `expired` into the timeline's seconds: a second with nothing
/// else counted is added, the room's readings carried on into it.
pub(super) fn add_expired(seconds: &mut Vec<SecondView>, expired: &BTreeMap<i64, u64>) {
    for (t, n) in expired {
        second_at(seconds, *t).expired += n;
    }
}

/// The `q`-quantile of sorted values.
fn pick(sorted: &[i64], q: f64) -> i64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t: i64, admitted: Option<i64>) -> SecondView {
        SecondView {
            t,
            admitted,
            ..SecondView::default()
        }
    }

    #[test]
    fn an_admission_runs_out_unused_in_the_second_its_window_ends() {
        // Places 1-2 admitted at 100, 3-4 at 102 (and no further).
        let seconds = [
            second(100, Some(2)),
            second(101, None),
            second(102, Some(4)),
        ];
        let admitted = admitted_at(&seconds, 10, 0);
        assert_eq!(
            admitted,
            [100, 100, 101, 102],
            "place 3 passed between the readings"
        );
        // Buyers 7 (place 1) and 9 (place 3) ordered; 8 (2) and 5 (4) did
        // not; 6 (place 5) was never admitted.
        let places = [(7, 1), (8, 2), (9, 3), (5, 4), (6, 5)];
        let ordered: HashSet<u64> = [7, 9].into();
        let at = |now| RanOut::of(&places, &admitted, &ordered, 3, now);
        assert_eq!(
            at(104),
            RanOut {
                unused: 2,
                by_second: [(103, 1)].into()
            },
            "place 4's runs out at 105"
        );
        assert_eq!(at(200).by_second, [(103, 1), (105, 1)].into());

        // Counted into the timeline: a second without a row gets one.
        let mut timeline = seconds.to_vec();
        add_expired(&mut timeline, &at(200).by_second);
        let got: Vec<(i64, u64, Option<i64>)> = timeline
            .iter()
            .map(|s| (s.t, s.expired, s.admitted))
            .collect();
        assert_eq!(
            got,
            [
                (100, 0, Some(2)),
                (101, 0, None),
                (102, 0, Some(4)),
                (103, 1, Some(4)),
                (105, 1, Some(4))
            ]
        );
    }

    #[test]
    fn places_passed_between_sparse_readings_are_dated_at_the_pace_and_their_joins() {
        // The sale started at 0; two buyers joined at 10, one at 16; the
        // places admitted, at 1 a second, were read at 10 and at 18 only.
        let at = |t, admitted: Option<i64>, joins| SecondView {
            t,
            admitted,
            pace: admitted.map(|_| 1),
            joins,
            ..SecondView::default()
        };
        let seconds = [at(10, Some(0), 2), at(16, None, 1), at(18, Some(3), 0)];
        // Places 1 and 2 at the pace; place 3 when its buyer came (the
        // room had admitted every joiner, and waited until then).
        assert_eq!(admitted_at(&seconds, 3, 0), [11, 12, 16]);
        // Never after the reading that saw them passed.
        let slow = [at(10, Some(0), 3), at(12, Some(3), 0)];
        assert_eq!(admitted_at(&slow, 3, 0), [11, 12, 12]);
    }

    #[test]
    fn places_passed_between_sparse_readings_are_spread_over_the_seconds_between() {
        // Nobody polled between 10 and 13: from 0 to 3 places admitted.
        let seconds = [
            second(10, Some(0)),
            second(13, Some(3)),
            second(14, Some(3)),
        ];
        assert_eq!(admitted_at(&seconds, 10, 0), [11, 12, 13]);
        // A reading at the first second has nothing before it.
        assert_eq!(admitted_at(&[second(5, Some(2))], 10, 0), [5, 5]);
        // Never past those who joined.
        assert_eq!(
            admitted_at(&[second(1, Some(0)), second(3, Some(9))], 2, 0),
            [2, 3]
        );
    }
}
