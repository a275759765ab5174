//! A sale's room as an instance last read it ([`RoomState`]), and what
//! follows from it without Redis: where a ticket stands, whether an order's
//! window is certainly shut, the room's figures for the operator; and the
//! rooms as this process last read them ([`Rooms`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use super::pass::{RoomKey, Ticket};
use super::places;
use crate::domain::ProductId;
use crate::sale::rejection::Rejection;

/// How far outside a room sale's window this process's clock must be for
/// its orders to be refused `sale_not_started` / `sale_ended` here, rather
/// than `admission_required` (clocks differ a little between hosts).
const WINDOW_MARGIN_MS: i64 = 250;

/// A sale's room, as `room_tick.lua` last read it.
#[derive(Debug, Clone)]
pub struct RoomState {
    pub start_ms: i64,
    pub end_ms: i64,
    /// How long an admission is valid.
    pub admission_ms: i64,
    pub key: RoomKey,
    /// The draw's seed (from the key).
    pub seed: [u8; 32],
    /// Buyers admitted per second now: the pace, between `floor` and
    /// `ceiling`, lower while the backend is strained.
    pub pace: f64,
    /// The operator's bounds on the pace (buyers per second).
    pub ceiling: u32,
    pub floor: u32,
    /// At most this many buyers hold an unused admission (`None`: no
    /// cap), and how many do (counted only with a cap).
    pub cap: Option<u64>,
    pub active: u64,
    /// How long the oldest order not yet persisted has waited (`None`:
    /// none waits): past `STRAIN_MS`, the pace halves.
    pub unpersisted_ms: Option<u64>,
    /// With a cap: what was admitted when (`(at_ms, served)`, newest
    /// first, at least a second apart), for when a place was admitted.
    pub log: Vec<(i64, f64)>,
    /// Bits of proof of work a join costs (0: none; see `pow`).
    pub join_difficulty: u8,
    /// What was admitted: places up to this one (fractional: it grows
    /// continuously).
    pub served: f64,
    /// When `served` was computed (Redis's clock).
    pub at_ms: i64,
    /// When `served` was admitted (Redis's clock): `at_ms` while places are
    /// admitted at the pace, earlier once the line stands (every joiner
    /// admitted, paused, held by the cap).
    pub served_at_ms: i64,
    /// Buyers who joined before the start, and after it.
    pub early: u64,
    pub late: u64,
    pub stock: i64,
    /// Redis's clock at the read.
    pub now_ms: i64,
    /// The sale's pause, now or the last one: when it began, and when it
    /// ended (`None`: paused now). Admissions valid when it began get its
    /// length again.
    pub pause: Option<(i64, Option<i64>)>,
    /// The gap (ms) of the log's entries, and the width of the buckets in
    /// which the order script counts the admissions used (`room_used`, by
    /// expiry): `room_tick.lua`'s, the one place it is reckoned.
    pub bucket_ms: i64,
}

/// Where a ticket stands now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Before the start: the draw places every early joiner at the start.
    BeforeDraw {
        draw_at_ms: i64,
    },
    /// In the line: `ahead` buyers before this one, about `wait_ms` to go
    /// at the pace now; between `wait_range_ms.0` (at the ceiling) and
    /// `.1` (should strain halve the pace, or bring it to the floor).
    Waiting {
        place: u64,
        ahead: u64,
        wait_ms: u64,
        wait_range_ms: (u64, u64),
    },
    /// May order until `expires_ms`, with `admission`.
    Admitted {
        place: u64,
        admission: String,
        expires_ms: i64,
    },
    /// The admission ran out unused (at `expired_ms`).
    Expired {
        place: u64,
        expired_ms: i64,
    },
    /// No stock left: nobody waits for nothing.
    SoldOut,
    Ended,
}

/// A room's figures at a moment, for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RoomFigures {
    pub joined: u64,
    /// Places admitted so far.
    pub admitted: u64,
    /// Joined and not yet admitted.
    pub waiting: u64,
    /// The estimated wait of a buyer joining now.
    pub wait_at_back_ms: u64,
}

impl RoomState {
    /// Buyers who joined.
    pub fn joined(&self) -> u64 {
        self.early + self.late
    }

    /// The room's figures at `now_ms`: `admitted` is what was admitted as
    /// read, the places buyers are told are admitted (never fewer); once the sale is
    /// sold out or over, nobody is waiting (every ticket hears so).
    pub fn figures(&self, now_ms: i64) -> RoomFigures {
        let joined = self.joined();
        let admitted = self.admitted_places();
        let waiting = if self.stock <= 0 || now_ms >= self.end_ms {
            0
        } else {
            joined - admitted
        };
        RoomFigures {
            joined,
            admitted,
            waiting,
            wait_at_back_ms: (waiting as f64 / self.pace.max(1e-9) * 1000.0).ceil() as u64,
        }
    }

    /// `sale_not_started` / `sale_ended` while this process's clock is
    /// outside the window by more than [`WINDOW_MARGIN_MS`] (nearer a
    /// boundary, Redis decides).
    pub fn outside_window(&self, now_ms: i64) -> Option<Rejection> {
        if now_ms + WINDOW_MARGIN_MS < self.start_ms {
            return Some(Rejection::NotStarted {
                starts_at_ms: self.start_ms,
                in_ms: (self.start_ms - now_ms) as u64,
            });
        }
        (now_ms >= self.end_ms + WINDOW_MARGIN_MS).then_some(Rejection::Ended)
    }

    /// The places admitted, as read.
    pub fn admitted_places(&self) -> u64 {
        (self.served.floor() as u64).min(self.joined())
    }

    /// What is expected to be admitted at `now_ms` (epoch ms, this
    /// process's clock), grown from the reading at the pace: for estimates
    /// only. Admission follows the reading itself ([`Self::standing`]), so
    /// that the room's `admitted` figure (Redis's `served`) is never behind
    /// what buyers were told, whatever the next reading finds (sold out,
    /// ended). While the sale is paused the line stands still
    /// (`room_tick.lua` admits no more), so the estimate does too: only the time the
    /// sale was live since the reading counts.
    fn expected_at(&self, now_ms: i64) -> f64 {
        let from = self.at_ms.max(self.start_ms);
        let until = now_ms.min(self.end_ms);
        if self.stock <= 0 || until <= from {
            return self.served;
        }
        let stood = match self.pause {
            Some((began, ended)) => {
                let ended = ended.unwrap_or(until);
                (ended.min(until) - began.max(from)).max(0)
            }
            None => 0,
        };
        let moved = self.pace * (until - from - stood) as f64 / 1000.0;
        (self.served + moved).min(self.joined() as f64)
    }

    /// Whether the draw is done: this reading was taken after the start
    /// (by Redis's clock), so its count of early joiners is final.
    pub fn drawn(&self) -> bool {
        self.now_ms >= self.start_ms
    }

    /// When `place` was admitted (epoch ms). With an active cap admission
    /// stops and starts: from the room's log, between the entries around
    /// the moment the place was admitted (to within an entry's gap).
    /// Otherwise, or before the log: by the pace back from when what is
    /// admitted now was (`served_at_ms`: once every joiner is admitted the
    /// line stands, and its last admissions run out as the others', where
    /// reckoned from the reading they ran from every new one).
    fn admitted_ms(&self, place: u64) -> f64 {
        let p = place as f64;
        // The earliest moment what is admitted now was, then each older
        // entry of the log (newest first): what was admitted then.
        let mut newer = (self.served_at_ms as f64, self.served);
        for &(at, served) in &self.log {
            if served < p {
                let (newer_at, newer_served) = newer;
                let share = ((p - served) / (newer_served - served).max(1e-9)).min(1.0);
                return at as f64 + share * (newer_at - at as f64);
            }
            if (at as f64) < newer.0 {
                newer = (at as f64, served);
            }
        }
        let (at, served) = newer;
        at - (served - p) / self.pace.max(1e-9) * 1000.0
    }

    /// Where `ticket` stands at `now_ms`.
    pub fn standing(&self, product: &ProductId, ticket: Ticket, now_ms: i64) -> Standing {
        if now_ms >= self.end_ms {
            return Standing::Ended;
        }
        if self.stock <= 0 {
            return Standing::SoldOut;
        }
        let early = match self.drawn() {
            true => places::Early::Final(self.early),
            false => places::Early::Counting(self.early),
        };
        let Some(place) = places::place(ticket.number, early, &self.seed) else {
            return Standing::BeforeDraw {
                draw_at_ms: self.start_ms,
            };
        };
        // Admitted as read (what `room_tick.lua` admitted when an instance
        // last read the room, about once a second): never past it.
        if place > self.admitted_places() {
            let expected = self.expected_at(now_ms);
            let ahead = place.saturating_sub(expected.floor() as u64 + 1);
            let to_go = (place as f64 - expected).max(0.0);
            let at = |pace: f64| (to_go / pace.max(1e-9) * 1000.0).ceil() as u64;
            let slowest = (self.pace / 2.0).max(f64::from(self.floor)).min(self.pace);
            return Standing::Waiting {
                place,
                ahead,
                wait_ms: at(self.pace),
                wait_range_ms: (at(f64::from(self.ceiling).max(self.pace)), at(slowest)),
            };
        }
        let admitted_ms = self.admitted_ms(place);
        let mut expires_ms = (admitted_ms.max(self.start_ms as f64) as i64) + self.admission_ms;
        // An admission valid when a pause began does not run out during
        // it: it gets the pause's length (so far) again.
        if let Some((from, to)) = self.pause
            && expires_ms - self.admission_ms < from
            && expires_ms > from
        {
            expires_ms += to.unwrap_or(now_ms).max(from) - from;
        }
        if now_ms >= expires_ms {
            return Standing::Expired {
                place,
                expired_ms: expires_ms,
            };
        }
        Standing::Admitted {
            place,
            admission: self.key.admission(product, ticket.user_id, expires_ms),
            expires_ms,
        }
    }
}

/// Each sale's room as this process last read it (`None`: the sale has no
/// room, or no sale), and whether a read is under way.
#[derive(Default)]
pub struct Rooms {
    sales: RwLock<HashMap<ProductId, Arc<Kept>>>,
}

/// A sale's room as read last, and whether a read is under way.
#[derive(Default)]
pub(super) struct Kept {
    pub(super) state: RwLock<Option<Read>>,
    pub(super) refreshing: AtomicBool,
}

#[derive(Clone)]
pub(super) struct Read {
    pub(super) room: Option<Arc<RoomState>>,
    pub(super) at: Instant,
}

impl Rooms {
    pub(super) fn kept(&self, product: &ProductId) -> Arc<Kept> {
        if let Some(kept) = self
            .sales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(product)
        {
            return kept.clone();
        }
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(product.clone())
            .or_default()
            .clone()
    }

    /// Every room read within `fresh`, as read, and when.
    pub(super) fn fresh(
        &self,
        fresh: std::time::Duration,
    ) -> Vec<(ProductId, Instant, Arc<RoomState>)> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        sales
            .iter()
            .filter_map(|(product, kept)| {
                let read = kept.state.read().unwrap_or_else(|e| e.into_inner());
                let read = read.as_ref().filter(|r| r.at.elapsed() < fresh)?;
                Some((product.clone(), read.at, read.room.clone()?))
            })
            .collect()
    }

    pub(super) fn remembered(&self, product: &ProductId) -> Option<Read> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        sales
            .get(product)?
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn forget(&self, product: &ProductId) {
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(product);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sale::room::Number;

    fn room(log: Vec<(i64, f64)>, served: f64, at_ms: i64) -> RoomState {
        let key = RoomKey::from_hex(&"ab".repeat(32)).expect("hex");
        RoomState {
            start_ms: 0,
            end_ms: 1_000_000,
            admission_ms: 10_000,
            seed: key.draw_seed(),
            key,
            pace: 10.0,
            ceiling: 40,
            floor: 5,
            cap: (!log.is_empty()).then_some(10),
            active: 0,
            unpersisted_ms: None,
            log,
            join_difficulty: 0,
            served,
            at_ms,
            served_at_ms: at_ms,
            early: 0,
            late: 100,
            stock: 100,
            now_ms: at_ms,
            pause: None,
            bucket_ms: 1_000,
        }
    }

    fn late(n: u64) -> Ticket {
        Ticket {
            user_id: n,
            number: Number::parse(&format!("l{n}")).expect("a number"),
        }
    }

    #[test]
    fn the_wait_comes_as_a_range_from_the_ceiling_to_half_the_pace() {
        let product = ProductId::parse("p").expect("id");
        let r = room(Vec::new(), 10.0, 50_000);
        let Standing::Waiting {
            wait_ms,
            wait_range_ms,
            ..
        } = r.standing(&product, late(30), 50_000)
        else {
            panic!("waiting")
        };
        // 20 places to go: 2 s at 10/s, 0.5 s at the ceiling (40/s), 4 s
        // at half the pace (5/s, the floor).
        assert_eq!((wait_ms, wait_range_ms), (2_000, (500, 4_000)));
        let mut at_floor = r.clone();
        at_floor.pace = 5.0;
        let Standing::Waiting { wait_range_ms, .. } = at_floor.standing(&product, late(30), 50_000)
        else {
            panic!("waiting")
        };
        assert_eq!(wait_range_ms, (500, 4_000), "never below the floor");
    }

    #[test]
    fn once_every_joiner_is_admitted_the_last_admissions_still_run_out() {
        let product = ProductId::parse("p").expect("id");
        // 100 joined; the last of them was admitted at 40 s, and the line
        // stood; read at 50 s (every read moves `at_ms` on).
        let mut r = room(Vec::new(), 100.0, 50_000);
        r.served_at_ms = 40_000;
        // Place 100 admitted at 40 s, place 90 a second before (10/s):
        // their admissions (10 s) ran out at 50 s and 49 s, whenever the
        // buyer asks, not 10 s after every new reading.
        assert_eq!(
            r.standing(&product, late(100), 49_000),
            Standing::Admitted {
                place: 100,
                admission: r.key.admission(&product, 100, 50_000),
                expires_ms: 50_000
            }
        );
        assert_eq!(
            r.standing(&product, late(90), 50_000),
            Standing::Expired {
                place: 90,
                expired_ms: 49_000
            }
        );
        assert_eq!(
            r.standing(&product, late(100), 50_000),
            Standing::Expired {
                place: 100,
                expired_ms: 50_000
            }
        );
    }

    #[test]
    fn with_a_cap_an_admission_runs_from_when_its_place_was_admitted() {
        let product = ProductId::parse("p").expect("id");
        // 10 admitted by 1 s, no more until 8 s, 14 by 9 s; read at 9.5 s.
        let log = vec![(9_000, 14.0), (8_000, 10.0), (1_000, 10.0), (0, 0.0)];
        let r = room(log, 14.0, 9_500);
        let expires = |place: u64, now: i64| match r.standing(&product, late(place), now) {
            Standing::Admitted { expires_ms, .. } => Some(expires_ms),
            _ => None,
        };
        // Place 5: halfway from 0 (at 0 s) to 10 (at 1 s): 0.5 s + 10 s.
        assert_eq!(expires(5, 9_500), Some(10_500));
        // Place 12: halfway from 10 (8 s) to 14 (9 s): 8.5 s + 10 s.
        assert_eq!(expires(12, 9_500), Some(18_500));
        // The line standing does not stop an admission's clock.
        assert_eq!(
            r.standing(&product, late(5), 10_600),
            Standing::Expired {
                place: 5,
                expired_ms: 10_500
            }
        );
        // Without a cap (no log): by the pace back from the reading.
        let r = room(Vec::new(), 14.0, 9_500);
        let Standing::Admitted { expires_ms, .. } = r.standing(&product, late(12), 9_500) else {
            panic!("admitted")
        };
        assert_eq!(expires_ms, 9_500 - 200 + 10_000);
    }

    #[test]
    fn a_waiting_buyer_is_not_moved_on_while_the_sale_is_paused() {
        let product = ProductId::parse("sku-1").expect("an id");
        let ahead_at = |r: &RoomState, now_ms: i64| match r.standing(&product, late(90), now_ms) {
            Standing::Waiting { ahead, .. } => ahead,
            other => panic!("waiting: {other:?}"),
        };
        // Read at 10 s with 20 admitted; paused since 9 s.
        let mut paused = room(Vec::new(), 20.0, 10_000);
        paused.pause = Some((9_000, None));
        let at_read = ahead_at(&paused, 10_000);
        assert_eq!(ahead_at(&paused, 13_000), at_read, "the line stands");
        // Live, the same reading moves on at the pace (10/s).
        let live = room(Vec::new(), 20.0, 10_000);
        assert_eq!(ahead_at(&live, 13_000), at_read - 30);
        // Resumed at 12 s: only the second since counts.
        let mut resumed = room(Vec::new(), 20.0, 10_000);
        resumed.pause = Some((9_000, Some(12_000)));
        assert_eq!(ahead_at(&resumed, 13_000), at_read - 10);
    }

    #[test]
    fn an_admission_valid_when_a_pause_began_gets_its_length_again() {
        let product = ProductId::parse("p").expect("id");
        let log = vec![(9_000, 14.0), (8_000, 10.0), (1_000, 10.0), (0, 0.0)];
        let mut r = room(log, 14.0, 9_500);
        let expires =
            |r: &RoomState, place: u64, now: i64| match r.standing(&product, late(place), now) {
                Standing::Admitted { expires_ms, .. } => Some(expires_ms),
                _ => None,
            };
        // Paused from 6 s to 9 s: place 5 (admitted at 0.5 s, valid until
        // 10.5 s) gets the 3 s again; place 12, admitted after it, does not.
        r.pause = Some((6_000, Some(9_000)));
        assert_eq!(expires(&r, 5, 9_500), Some(13_500));
        assert_eq!(expires(&r, 12, 9_500), Some(18_500));
        // Still paused: it keeps growing with the pause.
        r.pause = Some((6_000, None));
        assert_eq!(expires(&r, 5, 12_000), Some(16_500));
        // A pause after the admission ran out gives nothing back.
        r.pause = Some((11_000, Some(12_000)));
        assert_eq!(expires(&r, 5, 9_500), Some(10_500));
    }
}
