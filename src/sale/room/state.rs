//! A sale's room as an instance last read it ([`RoomState`]), and what
//! follows from it without Redis: where a ticket stands, whether an order's
//! window is certainly shut, the room's figures for the operator; and the
//! rooms as this process last read them ([`Rooms`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use super::super::types::Rejection;
use super::pass::{RoomKey, Ticket};
use super::queue;
use crate::domain::ProductId;

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
    /// Buyers admitted per second.
    pub rate: f64,
    /// The line: places up to this one are admitted (fractional: it moves
    /// continuously).
    pub served: f64,
    /// When `served` was computed (Redis's clock).
    pub at_ms: i64,
    /// Buyers who joined before the start, and after it.
    pub early: u64,
    pub late: u64,
    pub stock: i64,
    /// Redis's clock at the read.
    pub now_ms: i64,
}

/// Where a ticket stands now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Before the start: the draw places every early joiner at the start.
    BeforeDraw {
        draw_at_ms: i64,
    },
    /// In the line: `ahead` buyers before this one, about `wait_ms` to go.
    Waiting {
        place: u64,
        ahead: u64,
        wait_ms: u64,
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
    /// Places admitted so far (the line).
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

    /// The room's figures at `now_ms`: `admitted` is the line as read, the
    /// places buyers are told are admitted (never fewer); once the sale is
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
            wait_at_back_ms: (waiting as f64 / self.rate.max(1e-9) * 1000.0).ceil() as u64,
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

    /// Places the line has reached, as read: the places admitted.
    pub fn admitted_places(&self) -> u64 {
        (self.served.floor() as u64).min(self.joined())
    }

    /// Where the line is expected at `now_ms` (epoch ms, this process's
    /// clock), moved on from the reading at the pace: for estimates only.
    /// Admission follows the reading itself ([`Self::standing`]), so that
    /// the room's `admitted` figure (Redis's line) is never behind what
    /// buyers were told, whatever the next reading finds (sold out, ended).
    fn expected_at(&self, now_ms: i64) -> f64 {
        let from = self.at_ms.max(self.start_ms);
        let until = now_ms.min(self.end_ms);
        if self.stock <= 0 || until <= from {
            return self.served;
        }
        let moved = self.rate * (until - from) as f64 / 1000.0;
        (self.served + moved).min(self.joined() as f64)
    }

    /// Whether the draw is done: this reading was taken after the start
    /// (by Redis's clock), so its count of early joiners is final.
    pub fn drawn(&self) -> bool {
        self.now_ms >= self.start_ms
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
            true => queue::Early::Final(self.early),
            false => queue::Early::Counting(self.early),
        };
        let Some(place) = queue::place(ticket.number, early, &self.seed) else {
            return Standing::BeforeDraw {
                draw_at_ms: self.start_ms,
            };
        };
        // Admitted by the line as read (moved by `room_tick.lua` when an
        // instance reads the room, about once a second): never past it.
        if place > self.admitted_places() {
            let expected = self.expected_at(now_ms);
            let ahead = place.saturating_sub(expected.floor() as u64 + 1);
            let wait_ms = ((place as f64 - expected) / self.rate.max(1e-9) * 1000.0)
                .ceil()
                .max(0.0);
            return Standing::Waiting {
                place,
                ahead,
                wait_ms: wait_ms as u64,
            };
        }
        // When the line reached this place, by its pace: while it stood
        // (sold out, or nobody left waiting) the admission's time stands too.
        let reached_ms =
            self.at_ms as f64 - (self.served - place as f64) / self.rate.max(1e-9) * 1000.0;
        let expires_ms = (reached_ms.max(self.start_ms as f64) as i64) + self.admission_ms;
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
    sales: RwLock<HashMap<ProductId, Arc<Slot>>>,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) state: RwLock<Option<Read>>,
    pub(super) refreshing: AtomicBool,
}

#[derive(Clone)]
pub(super) struct Read {
    pub(super) room: Option<Arc<RoomState>>,
    pub(super) at: Instant,
}

impl Rooms {
    pub(super) fn slot(&self, product: &ProductId) -> Arc<Slot> {
        if let Some(slot) = self
            .sales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(product)
        {
            return slot.clone();
        }
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(product.clone())
            .or_default()
            .clone()
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
