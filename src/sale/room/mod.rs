//! A sale's waiting room (optional, per sale): buyers join a line, early
//! joiners are shuffled at the start, and the room admits their places at
//! the sale's pace; with the room on only admitted buyers may order.
//!
//! What it keeps, and where:
//! - Redis, per sale: the room's hash (its bounds, the pace, the places
//!   admitted `served`, when they last grew, and the counts of early
//!   and late joiners) and one field per joined buyer (`joined`: their
//!   number, so that joining again gives the same ticket). One script call
//!   per join (`room_join.lua`, [`join`]); nothing per poll.
//! - Each instance, per sale: the room as last read ([`RoomState`], in
//!   [`state`]), renewed at most once a second by `room_tick.lua` ([`tick`]:
//!   where the pace is decided; it admits more places). A poll is answered
//!   from it: the ticket's signature, its place in the line ([`places`]),
//!   the places admitted; an admission is signed here ([`pass`]).
//!
//! The words (see `lib.rs`): the **line** is the buyers waiting, each with
//! a **place**; the room has **admitted** the places up to a number that
//! grows at the **pace**; the **ceiling** and **floor** bound the pace; the
//! **cap** bounds the admissions held unused.
//! - The buyer: the ticket and the admission, which carry their own number
//!   and expiry, signed with the sale's key.

mod join;
pub mod pass;
pub mod places;
pub mod pow;
pub(super) mod state;
mod tick;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::core::{Core, Counter};
use super::error::SaleError;
use super::keys::SaleKeys;
use super::rejection::Rejection;
use super::shards;
use crate::domain::{BoundsChange, Chain, ProductId, UserId};
pub use join::Joined;
pub use pass::{AdmissionRefused, Number, RoomKey, Ticket};
use state::Read;
pub use state::{RoomFigures, RoomState, Rooms, Standing};
pub use tick::STRAIN_MS;

/// The waiting rooms' handle: joining, where a ticket stands, admissions
/// and the pace, over the rooms as this process last read them.
#[derive(Clone)]
pub struct Room {
    core: Arc<Core>,
    /// Each sale's room as this process last read it: the room's own.
    rooms: Arc<Rooms>,
}

/// How old a room's reading may be before a poll renews it (in the background).
pub const TICK: Duration = Duration::from_secs(1);
/// How old the reading "this sale has no room" may be.
const NO_ROOM_RECHECK: Duration = Duration::from_secs(30);

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
    /// Valid for the buyer and sale. `counted_in`: with an active cap, the
    /// bucket of the admission's expiry, in which the order script counts
    /// its place as used (`place_order.lua`, `room_used`); `None` without.
    Admitted {
        counted_in: Option<i64>,
    },
    Refused(AdmissionRefused),
    /// The room's sale is certainly not taking orders now (not started, or
    /// over): that is the answer, whatever the admission.
    Outside(Rejection),
}

impl Room {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self {
            core,
            rooms: Arc::default(),
        }
    }

    /// `user_id` joins the sale's waiting room (`room_join.lua`). An id
    /// that no sale has (by this process's read of the registry) is
    /// answered without Redis.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product, user_id = %user_id))]
    pub async fn join(
        &self,
        product: &ProductId,
        user_id: UserId,
        proof: Option<&str>,
    ) -> Result<Joined, SaleError> {
        if self.core.is_no_sale(product) {
            return Ok(Joined::NoSale);
        }
        // The room as this process knows it (read once if never, not
        // renewed here: a refused join costs Redis nothing): a proof of
        // work it asks is checked here, before any Redis call, and its key
        // signs the ticket.
        let known = match self.known(product).await? {
            RoomLookup::Room(room) => Some(room),
            RoomLookup::NoRoom | RoomLookup::NoSale => None,
        };
        if let Some(room) = &known
            && let Err(refused) = pow::check(
                &room.key,
                product,
                user_id.get(),
                room.join_difficulty,
                proof,
                crate::domain::now_ms(),
            )
        {
            return Ok(Joined::ProofRefused {
                refused,
                difficulty: room.join_difficulty,
            });
        }
        // A join let through keeps the reading fresh, as a poll does.
        if known.is_some() {
            self.lookup(product).await?;
        }
        let keys = self.core.keys(product);
        self.core.counts.add(Counter::RoomCalls, 1);
        // A sale of several stock shards: the units on the others count.
        let elsewhere = shards::elsewhere(&self.core, product, false).await?.units;
        let reply = self
            .core
            .call(|mut c| async move { join::join(&mut c, &keys, user_id, elsewhere).await })
            .await?;
        Ok(match join::decode(reply)? {
            join::Reply::Joined { number, new } => {
                let room = self.joined_room(product, known).await?;
                let ticket = Ticket {
                    user_id: user_id.get(),
                    number,
                };
                Joined::Ticket {
                    ticket: room.key.ticket(product, ticket),
                    new,
                }
            }
            join::Reply::Other(joined) => joined,
        })
    }

    /// The room a buyer joined, whose key signs the ticket: as this process
    /// knew it, or, joined a room it had not read as one, read now.
    async fn joined_room(
        &self,
        product: &ProductId,
        known: Option<Arc<RoomState>>,
    ) -> Result<Arc<RoomState>, SaleError> {
        match known {
            Some(room) => Ok(room),
            None => self
                .room(product)
                .await?
                .ok_or_else(|| SaleError::Corrupt("a joined room without a key".into())),
        }
    }

    /// The sale's room as this process knows it: read now if never read,
    /// renewed in the background when older than [`TICK`]; `None`: the
    /// sale has no room (or is not open).
    pub async fn room(&self, product: &ProductId) -> Result<Option<Arc<RoomState>>, SaleError> {
        Ok(match self.lookup(product).await? {
            RoomLookup::Room(room) => Some(room),
            RoomLookup::NoRoom | RoomLookup::NoSale => None,
        })
    }

    /// Every joined buyer's place in the line, `(user_id, place)`, from
    /// the room's `joined` hash (read by `HSCAN`, a thousand fields a
    /// call) and its draw: for the sale's report (which admitted buyers
    /// ordered). `None`: the sale has no room, or is not open. Before the
    /// draw only late joiners have a place.
    pub async fn places(&self, product: &ProductId) -> Result<Option<Vec<(u64, u64)>>, SaleError> {
        let Some(room) = self.room(product).await? else {
            return Ok(None);
        };
        let early = match room.drawn() {
            true => places::Early::Final(room.early),
            false => places::Early::Counting(room.early),
        };
        let key = self.core.keys(product).joined;
        let mut out = Vec::new();
        let mut cursor = 0u64;
        loop {
            let key = &key;
            let (next, fields): (u64, Vec<String>) = self
                .core
                .call(|mut c| async move {
                    redis::cmd("HSCAN")
                        .arg(key)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            for pair in fields.chunks_exact(2) {
                let (Ok(user), Some(number)) = (pair[0].parse::<u64>(), Number::parse(&pair[1]))
                else {
                    return Err(SaleError::Corrupt(format!(
                        "room joined field {:?} -> {:?}",
                        pair[0], pair[1]
                    )));
                };
                if let Some(place) = places::place(number, early, &room.seed) {
                    out.push((user, place));
                }
            }
            if next == 0 {
                return Ok(Some(out));
            }
            cursor = next;
        }
    }

    /// The rooms this process has read in the last few seconds, as read,
    /// and when (for the sales' timelines: `bookkeeping::report`).
    pub fn readings(&self) -> Vec<(ProductId, std::time::Instant, Arc<RoomState>)> {
        self.rooms.fresh(Duration::from_secs(5))
    }

    /// [`Self::room`], telling a sale without a room from no sale at all.
    pub async fn lookup(&self, product: &ProductId) -> Result<RoomLookup, SaleError> {
        self.read(product, true).await
    }

    /// The room as this process knows it, read once if never but not
    /// renewed: enough for what its key and join difficulty answer (a
    /// join's proof, the challenge), so that refused joins and challenge
    /// requests cost Redis nothing once the room is known. (The key is the
    /// sale's for as long as it is open; a new difficulty is seen at the
    /// next renewal, which polls and the joins let through make.)
    pub async fn known(&self, product: &ProductId) -> Result<RoomLookup, SaleError> {
        self.read(product, false).await
    }

    async fn read(&self, product: &ProductId, renew: bool) -> Result<RoomLookup, SaleError> {
        let read = match self.rooms.remembered(product) {
            Some(read) if !renew => read.room,
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
                    self.renew(product);
                }
                read.room
            }
            // Made-up ids cost Redis nothing (as orders for them): the
            // registry as last read says there is no such sale.
            None if self.core.is_no_sale(product) => return Ok(RoomLookup::NoSale),
            None => match self.tick_room(product, BoundsChange::default()).await? {
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
        user_id: UserId,
        token: &str,
    ) -> Result<Admission, SaleError> {
        let room = match self.rooms.remembered(product) {
            Some(read) => read.room,
            None if self.core.is_no_sale(product) => None,
            None => self
                .tick_room(product, BoundsChange::default())
                .await?
                .room(),
        };
        let Some(room) = room else {
            return Ok(Admission::NoRoom);
        };
        let now = crate::domain::now_ms();
        if let Some(outside) = room.outside_window(now) {
            return Ok(Admission::Outside(outside));
        }
        Ok(
            match room.key.check_admission(product, user_id.get(), token, now) {
                Ok(expires_ms) => Admission::Admitted {
                    counted_in: room.cap.map(|_| expires_ms / room.bucket_ms),
                },
                Err(refused) => Admission::Refused(refused),
            },
        )
    }

    /// Why an order without an admission is refused, for a sale known here
    /// to have a room (no Redis call): not started or over while certainly
    /// so, else `admission_required`. `None`: no room known here.
    pub(super) fn refusal_without_admission(&self, product: &ProductId) -> Option<Rejection> {
        let room = self.rooms.remembered(product)?.room?;
        Some(
            room.outside_window(crate::domain::now_ms())
                .unwrap_or(Rejection::AdmissionRequired),
        )
    }

    /// Changes the room's bounds from now on (a new ceiling is the pace at
    /// once); the room as it then stands, `None` without a room.
    pub async fn set_bounds(
        &self,
        product: &ProductId,
        change: BoundsChange,
    ) -> Result<Option<Arc<RoomState>>, SaleError> {
        Ok(self.tick_room(product, change).await?.room())
    }

    /// Reads the sale's room again, in the background (one read at a time).
    pub(super) fn renew(&self, product: &ProductId) {
        let kept = self.rooms.kept(product);
        if kept.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (room, product) = (self.clone(), product.clone());
        tokio::spawn(async move {
            if let Err(e) = room.tick_room(&product, BoundsChange::default()).await {
                tracing::warn!(%product, error = %Chain(&e), "cannot read the waiting room");
            }
            kept.refreshing.store(false, Ordering::Release);
        });
    }

    /// Admits places at the pace and reads the room (`room_tick.lua`);
    /// remembers it.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product))]
    async fn tick_room(
        &self,
        product: &ProductId,
        change: BoundsChange,
    ) -> Result<Ticked, SaleError> {
        let keys: SaleKeys = self.core.keys(product);
        self.core.counts.add(Counter::RoomCalls, 1);
        // A sale of several stock shards: the room counts the sale's units.
        // (and their buyers' orders count against the room's active cap).
        let elsewhere = shards::elsewhere(&self.core, product, true).await?;
        let reply = self
            .core
            .call(|mut c| {
                let elsewhere = &elsewhere;
                async move { tick::tick(&mut c, &keys, change, elsewhere).await }
            })
            .await?;
        let (exists, room) = tick::decode(reply)?;
        if let Some(room) = &room {
            shards::drop_used(&self.core, product, &elsewhere, room.now_ms, room.bucket_ms).await?;
        }
        let room = room.map(Arc::new);
        if !exists {
            // No such sale: nothing to remember (ids nobody opened would
            // otherwise fill the table).
            self.rooms.forget(product);
            return Ok(Ticked::NoSale);
        }
        let kept = self.rooms.kept(product);
        *kept.state.write().unwrap_or_else(|e| e.into_inner()) = Some(Read {
            room: room.clone(),
            at: Instant::now(),
        });
        Ok(Ticked::Read(room))
    }

    /// Forgets what this process knew of the sale's room.
    pub(super) fn forget(&self, product: &ProductId) {
        self.rooms.forget(product);
    }
}
