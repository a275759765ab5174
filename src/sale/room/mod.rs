//! A sale's waiting room (optional, per sale): buyers join a line, early
//! joiners are shuffled at the start, and the line admits buyers at the
//! sale's pace; with the room on only admitted buyers may order.
//!
//! What it keeps, and where:
//! - Redis, per sale: the room's hash (rate, the "now serving" line
//!   `served`, when it last moved, and the counts of early and late
//!   joiners) and one field per joined buyer (`joined`: their number, so
//!   that joining again gives the same ticket). One script call per join
//!   (`room_join.lua`); nothing per poll.
//! - Each instance, per sale: the room as last read ([`RoomState`]),
//!   renewed at most once a second by `room_tick.lua`, which also moves the
//!   line on. A poll is answered from it: the ticket's signature, its
//!   place ([`queue`]), the line; an admission is signed here ([`pass`]).
//! - The buyer: the ticket and the admission, which carry their own number
//!   and expiry, signed with the sale's key.

pub mod pass;
pub mod queue;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, ParsingError, Value};

use super::keys::SaleKeys;
use super::{SaleError, Sales};
use crate::domain::ProductId;
pub use pass::{Number, Refused, RoomKey, Ticket};

/// How old a room's reading may be before a poll renews it (in the background).
pub const TICK: Duration = Duration::from_secs(1);
/// How far outside a room sale's window this process's clock must be for
/// its orders to be refused `sale_not_started` / `sale_ended` here, rather
/// than `admission_required` (clocks differ a little between hosts).
const WINDOW_MARGIN_MS: i64 = 250;
/// How old the reading "this sale has no room" may be.
const NO_ROOM_RECHECK: Duration = Duration::from_secs(30);

static JOIN: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../../lua/room_join.lua")));
static ROOM_TICK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../../lua/room_tick.lua")));

/// A new room key, as hex, for a sale being opened.
pub fn new_key() -> String {
    RoomKey::generate()
}

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

/// A sale's room, or why there is none.
#[derive(Debug, Clone)]
pub enum RoomLookup {
    Room(Arc<RoomState>),
    /// The sale has no waiting room.
    NoRoom,
    /// No sale has this id.
    NoSale,
}

/// What a `room_tick.lua` call found.
enum Ticked {
    NoSale,
    /// The sale, and its room if it has one.
    Read(Option<Arc<RoomState>>),
}

impl Ticked {
    fn room(self) -> Option<Arc<RoomState>> {
        match self {
            Self::NoSale => None,
            Self::Read(room) => room,
        }
    }
}

/// What an order's `Admission-Token` is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The sale has no room: none is needed.
    NoRoom,
    Admitted,
    Refused(Refused),
    /// The room's sale is certainly not taking orders now (not started, or
    /// over): that is the answer, whatever the admission.
    Outside(super::Rejection),
}

/// What joining did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// In the line with this ticket (`new`: false when the buyer had joined before).
    Ticket {
        ticket: String,
        new: bool,
    },
    NoSale,
    NoRoom,
    /// The room opens at `opens_ms` (epoch ms).
    NotOpen {
        opens_ms: i64,
    },
    Ended,
    SoldOut,
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
    pub fn outside_window(&self, now_ms: i64) -> Option<super::Rejection> {
        if now_ms + WINDOW_MARGIN_MS < self.start_ms {
            return Some(super::Rejection::NotStarted {
                starts_at_ms: self.start_ms,
                in_ms: (self.start_ms - now_ms) as u64,
            });
        }
        (now_ms >= self.end_ms + WINDOW_MARGIN_MS).then_some(super::Rejection::Ended)
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
        let Some(place) = queue::place(ticket.number, self.early, self.drawn(), &self.seed) else {
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
struct Slot {
    state: RwLock<Option<Read>>,
    refreshing: AtomicBool,
}

#[derive(Clone)]
struct Read {
    room: Option<Arc<RoomState>>,
    at: Instant,
}

impl Rooms {
    fn slot(&self, product: &ProductId) -> Arc<Slot> {
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

    fn remembered(&self, product: &ProductId) -> Option<Read> {
        let sales = self.sales.read().unwrap_or_else(|e| e.into_inner());
        sales
            .get(product)?
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn forget(&self, product: &ProductId) {
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(product);
    }
}

impl Sales {
    /// `user_id` joins the sale's waiting room (`room_join.lua`). An id
    /// that no sale has (by this process's read of the registry) is
    /// answered without Redis.
    pub async fn join_room(&self, product: &ProductId, user_id: u64) -> Result<Joined, SaleError> {
        if self.is_no_sale(product) {
            return Ok(Joined::NoSale);
        }
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.calls.rooms.fetch_add(1, Ordering::Relaxed);
        let reply: Value = self
            .redis
            .bounded(
                JOIN.key(&keys.sale)
                    .key(&keys.stock)
                    .key(&keys.room)
                    .key(&keys.joined)
                    .arg(user_id)
                    .invoke_async(&mut conn),
            )
            .await?;
        let parts = Vec::<Value>::from_redis_value(reply).map_err(redis::RedisError::from)?;
        let mut parts = parts.into_iter();
        let status: String = next(&mut parts)?;
        Ok(match status.as_str() {
            "joined" => {
                let text: String = next(&mut parts)?;
                let new: i64 = next(&mut parts)?;
                let number = Number::parse(&text)
                    .ok_or_else(|| SaleError::Corrupt(format!("room number {text:?}")))?;
                // The key is needed to sign: the room as this process knows it.
                let room = self
                    .room(product)
                    .await?
                    .ok_or_else(|| SaleError::Corrupt("a joined room without a key".into()))?;
                Joined::Ticket {
                    ticket: room.key.ticket(product, Ticket { user_id, number }),
                    new: new == 1,
                }
            }
            "no_sale" => Joined::NoSale,
            "no_room" => Joined::NoRoom,
            "not_open" => Joined::NotOpen {
                opens_ms: next(&mut parts)?,
            },
            "ended" => Joined::Ended,
            "sold_out" => Joined::SoldOut,
            other => return Err(SaleError::Corrupt(format!("room_join status {other:?}"))),
        })
    }

    /// The sale's room as this process knows it: read now if never read,
    /// renewed in the background when older than [`TICK`]; `None`: the
    /// sale has no room (or is not open).
    pub async fn room(&self, product: &ProductId) -> Result<Option<Arc<RoomState>>, SaleError> {
        Ok(match self.room_lookup(product).await? {
            RoomLookup::Room(room) => Some(room),
            RoomLookup::NoRoom | RoomLookup::NoSale => None,
        })
    }

    /// [`Self::room`], telling a sale without a room from no sale at all.
    pub async fn room_lookup(&self, product: &ProductId) -> Result<RoomLookup, SaleError> {
        let read = match self.rooms.remembered(product) {
            Some(read) => {
                // Old, or taken before the start when the start has passed
                // (the draw needs a reading from after it): renewed, once at
                // a time, while the answers use this one.
                let before_draw = read
                    .room
                    .as_ref()
                    .is_some_and(|r| !r.drawn() && crate::domain::now_ms() >= r.start_ms);
                // A sale without a room gets one only by being opened again
                // (which forgets this): checked now and then, not every tick.
                let max_age = if read.room.is_some() {
                    TICK
                } else {
                    NO_ROOM_RECHECK
                };
                if read.at.elapsed() >= max_age || before_draw {
                    self.renew_room(product);
                }
                read.room
            }
            // Made-up ids cost Redis nothing (as orders for them): the
            // registry as last read says there is no such sale.
            None if self.is_no_sale(product) => return Ok(RoomLookup::NoSale),
            None => match self.tick_room(product, None).await? {
                Ticked::NoSale => return Ok(RoomLookup::NoSale),
                Ticked::Read(room) => room,
            },
        };
        Ok(read.map_or(RoomLookup::NoRoom, RoomLookup::Room))
    }

    /// Whether `token` admits `user_id` to order in the sale now: checked
    /// against the room as remembered (read once if this process has not
    /// read it yet), its signature and expiry; no Redis call otherwise.
    pub async fn admission(
        &self,
        product: &ProductId,
        user_id: u64,
        token: &str,
    ) -> Result<Admission, SaleError> {
        let room = match self.rooms.remembered(product) {
            Some(read) => read.room,
            None if self.is_no_sale(product) => None,
            None => self.tick_room(product, None).await?.room(),
        };
        let Some(room) = room else {
            return Ok(Admission::NoRoom);
        };
        let now = crate::domain::now_ms();
        if let Some(outside) = room.outside_window(now) {
            return Ok(Admission::Outside(outside));
        }
        Ok(
            match room.key.check_admission(product, user_id, token, now) {
                Ok(()) => Admission::Admitted,
                Err(refused) => Admission::Refused(refused),
            },
        )
    }

    /// Why an order without an admission is refused, for a sale known here
    /// to have a room (no Redis call): not started or over while certainly
    /// so, else `admission_required`. `None`: no room known here.
    pub(super) fn refusal_without_admission(
        &self,
        product: &ProductId,
    ) -> Option<super::Rejection> {
        let room = self.rooms.remembered(product)?.room?;
        Some(
            room.outside_window(crate::domain::now_ms())
                .unwrap_or(super::Rejection::AdmissionRequired),
        )
    }

    /// Changes the room's admission rate from now on.
    pub async fn set_room_rate(
        &self,
        product: &ProductId,
        admit_per_sec: u32,
    ) -> Result<Option<Arc<RoomState>>, SaleError> {
        Ok(self.tick_room(product, Some(admit_per_sec)).await?.room())
    }

    /// Reads the sale's room again, in the background (one read at a time).
    pub(super) fn renew_room(&self, product: &ProductId) {
        let slot = self.rooms.slot(product);
        if slot.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (sales, product) = (self.clone(), product.clone());
        tokio::spawn(async move {
            if let Err(e) = sales.tick_room(&product, None).await {
                tracing::warn!(%product, error = %e, "cannot read the waiting room");
            }
            slot.refreshing.store(false, Ordering::Release);
        });
    }

    /// Moves the line on and reads the room (`room_tick.lua`); remembers it.
    async fn tick_room(&self, product: &ProductId, rate: Option<u32>) -> Result<Ticked, SaleError> {
        let keys: SaleKeys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.calls.rooms.fetch_add(1, Ordering::Relaxed);
        let reply: Value = self
            .redis
            .bounded(
                ROOM_TICK
                    .key(&keys.sale)
                    .key(&keys.stock)
                    .key(&keys.room)
                    .arg(rate.map_or(String::new(), |r| r.to_string()))
                    .invoke_async(&mut conn),
            )
            .await?;
        let (exists, room) = parse_tick(reply)?;
        let room = room.map(Arc::new);
        if !exists {
            // No such sale: nothing to remember (ids nobody opened would
            // otherwise fill the table).
            self.rooms.forget(product);
            return Ok(Ticked::NoSale);
        }
        let slot = self.rooms.slot(product);
        *slot.state.write().unwrap_or_else(|e| e.into_inner()) = Some(Read {
            room: room.clone(),
            at: Instant::now(),
        });
        Ok(Ticked::Read(room))
    }

    /// Forgets what this process knew of the sale's room.
    pub(super) fn forget_room(&self, product: &ProductId) {
        self.rooms.forget(product);
    }
}

fn next<T: FromRedisValue>(parts: &mut impl Iterator<Item = Value>) -> Result<T, SaleError> {
    let v = parts
        .next()
        .ok_or_else(|| SaleError::Corrupt("a short reply from a room script".into()))?;
    T::from_redis_value(v).map_err(|e: ParsingError| SaleError::Redis(e.into()))
}

/// `(the sale exists, its room)`.
fn parse_tick(reply: Value) -> Result<(bool, Option<RoomState>), SaleError> {
    let parts = Vec::<Value>::from_redis_value(reply).map_err(redis::RedisError::from)?;
    let mut parts = parts.into_iter();
    let status: String = next(&mut parts)?;
    match status.as_str() {
        "room" => {}
        "no_room" => return Ok((true, None)),
        _ => return Ok((false, None)),
    }
    let start_ms = next(&mut parts)?;
    let end_ms = next(&mut parts)?;
    let admission_ms = next(&mut parts)?;
    let key_hex: String = next(&mut parts)?;
    let key = RoomKey::from_hex(&key_hex)
        .ok_or_else(|| SaleError::Corrupt("the room key is not hex".into()))?;
    let rate: f64 = next::<i64>(&mut parts)? as f64;
    let served: String = next(&mut parts)?;
    let served: f64 = served
        .parse()
        .map_err(|_| SaleError::Corrupt(format!("room served {served:?}")))?;
    Ok((
        true,
        Some(RoomState {
            start_ms,
            end_ms,
            admission_ms,
            seed: key.draw_seed(),
            key,
            rate,
            served,
            at_ms: next(&mut parts)?,
            early: next(&mut parts)?,
            late: next(&mut parts)?,
            stock: next(&mut parts)?,
            now_ms: next(&mut parts)?,
        }),
    ))
}
