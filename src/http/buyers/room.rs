//! The waiting room of a sale that has one (`sale::room`): join it, ask
//! where you stand, and (admins) change its pace.

use std::net::SocketAddr;

use axum::body::{Bytes, HttpBody};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Json};
use serde::Serialize;
use utoipa::ToSchema;

use super::orders::Owner;
use super::state::Buyers;
use crate::domain::{ProductId, now_ms};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ErrorBody, NOT_ON_SALE};
use crate::http::extract::{JsonBody, PathParam, SalePath, product_in_path};
use crate::http::transport::limits;
use crate::metrics::timeline::Count;
use crate::sale::room::{Joined, RoomLookup, RoomState, Standing, pow};

/// Where a ticket stands.
#[derive(Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum StandingView {
    /// In the line. Before the start (`place` null) every early joiner
    /// waits for the draw at `draw_at`, which shuffles them all.
    Waiting {
        /// Place in the line, from 1 (null until the draw).
        place: Option<u64>,
        /// Buyers before this one not yet admitted.
        ahead: Option<u64>,
        /// At the pace now (null until the draw).
        estimated_wait_ms: Option<u64>,
        /// The estimate as a range (null until the draw): at the pace's
        /// ceiling, and should strain of the backend halve the pace (not
        /// below its floor).
        estimated_wait_min_ms: Option<u64>,
        estimated_wait_max_ms: Option<u64>,
        /// When early joiners are placed (epoch ms).
        draw_at: i64,
        /// Buyers admitted per second.
        admit_per_sec: f64,
        /// When to ask again (ms from now): about an eighth of the wait,
        /// 1 to 30 s (farther back, less often); before the draw, at the
        /// draw. Asking sooner is answered the same, and gains nothing.
        poll_after_ms: u64,
    },
    /// May order now: send `admission` as the `Admission-Token` header of
    /// `POST /api/orders`, before `expires_at` (epoch ms).
    Admitted {
        place: u64,
        admission: String,
        expires_at: i64,
    },
    /// The admission ran out unused at `expired_at`.
    Expired { place: u64, expired_at: i64 },
    /// No stock left now. Units given back by cancellations (unpaid
    /// orders' timeouts) let the line move again while the sale is open:
    /// ask again after `poll_after_ms`.
    SoldOut { poll_after_ms: u64 },
    /// The sale is over.
    Ended,
}

/// The bounds of a waiting ticket's `poll_after_ms`.
pub const POLL_MIN_MS: u64 = 1_000;
pub const POLL_MAX_MS: u64 = 30_000;
/// How often a ticket of a sold-out, still open sale asks again.
pub const POLL_SOLD_OUT_MS: u64 = 5_000;

/// When a waiting ticket asks again: an eighth of its wait, within
/// [`POLL_MIN_MS`, `POLL_MAX_MS`]; before the draw (`wait_ms` unknown),
/// at the draw, `until_draw_ms` from now.
pub fn poll_after(wait_ms: Option<u64>, until_draw_ms: i64) -> u64 {
    let ms = match wait_ms {
        Some(wait) => wait / 8,
        None => u64::try_from(until_draw_ms).unwrap_or(0),
    };
    ms.clamp(POLL_MIN_MS, POLL_MAX_MS)
}

impl StandingView {
    fn of(room: &RoomState, standing: Standing) -> Self {
        let pace = room.pace;
        match standing {
            Standing::BeforeDraw { draw_at_ms } => Self::Waiting {
                place: None,
                ahead: None,
                estimated_wait_ms: None,
                estimated_wait_min_ms: None,
                estimated_wait_max_ms: None,
                draw_at: draw_at_ms,
                admit_per_sec: pace,
                poll_after_ms: poll_after(None, draw_at_ms.saturating_sub(now_ms())),
            },
            Standing::Waiting {
                place,
                ahead,
                wait_ms,
                wait_range_ms: (min, max),
            } => Self::Waiting {
                place: Some(place),
                ahead: Some(ahead),
                estimated_wait_ms: Some(wait_ms),
                estimated_wait_min_ms: Some(min),
                estimated_wait_max_ms: Some(max),
                draw_at: room.start_ms,
                admit_per_sec: pace,
                poll_after_ms: poll_after(Some(wait_ms), 0),
            },
            Standing::Admitted {
                place,
                admission,
                expires_ms,
            } => Self::Admitted {
                place,
                admission,
                expires_at: expires_ms,
            },
            Standing::Expired { place, expired_ms } => Self::Expired {
                place,
                expired_at: expired_ms,
            },
            Standing::SoldOut => Self::SoldOut {
                poll_after_ms: POLL_SOLD_OUT_MS,
            },
            Standing::Ended => Self::Ended,
        }
    }
}

/// A ticket and where it stands.
#[derive(Serialize, ToSchema)]
pub struct TicketView {
    /// Opaque; the same every time this buyer joins this sale. Poll
    /// `GET /api/sales/{product_id}/queue/{ticket}`.
    ticket: String,
    /// False when the buyer had joined before (same ticket, same place).
    new: bool,
    #[serde(flatten)]
    standing: StandingView,
}

/// `POST /api/sales/{product_id}/queue`
#[utoipa::path(
    post,
    path = "/api/sales/{product_id}/queue",
    operation_id = "join_queue",
    tag = "waiting room",
    summary = "Join a sale's waiting room",
    description = "The buyer (the authenticated one; `user_id` in the body only with `AUTH=none`) joins the line and gets a ticket. Joining again gives the same ticket and place. Everyone who joins before the start is shuffled at the start; later joiners are served in arrival order after them.",
    params(
        SalePath,
        ("Join-Proof" = Option<String>, Header, max_length = 100, description = "`<challenge>.<nonce>`: the proof of work, when the room asks one (see `GET /api/sales/{product_id}/challenge`)"),
    ),
    request_body = Option<Owner>,
    security(("buyer" = [])),
    responses(
        (status = 200, description = "In the line", body = TicketView),
        (status = 403, description = "`forbidden`: `user_id` is not the authenticated buyer; `challenge_required`: the room asks a proof of work and this one is missing, stale or short", body = ErrorBody),
        (status = 404, description = "`product_not_found` or `no_waiting_room`", body = ErrorBody),
        (status = 409, description = "`queue_not_open` (joining opens `join_early_secs` before the start), `sale_ended` or `sold_out`", body = ErrorBody),
    )
)]
pub async fn join(
    State(state): State<Buyers>,
    caller: Caller,
    headers: HeaderMap,
    SalePath(id): SalePath,
    JsonBody(body): JsonBody<Option<Owner>>,
) -> Result<Json<TicketView>, ApiError> {
    let user_id = caller.acting_as(body.and_then(|b| b.user_id))?;
    let product = id;
    let proof = headers.get(JOIN_PROOF).and_then(|v| v.to_str().ok());
    let joined = state.room.join(&product, user_id, proof).await?;
    let (ticket, new) = match joined {
        Joined::Ticket { ticket, new } => {
            if new {
                state
                    .metrics
                    .timeline
                    .count(product.as_str(), Count::Joins, 1);
            }
            (ticket, new)
        }
        Joined::NoSale => return Err(ApiError::ProductNotFound(NOT_ON_SALE)),
        Joined::NoRoom => return Err(ApiError::NoWaitingRoom),
        Joined::NotOpen { opens_ms } => return Err(ApiError::QueueNotOpen { opens_at: opens_ms }),
        Joined::Ended => return Err(ApiError::SaleEnded),
        Joined::SoldOut => return Err(ApiError::SoldOut),
        Joined::ProofRefused {
            refused,
            difficulty,
        } => {
            let why = match refused {
                pow::ProofRefused::Missing => "this sale's waiting room asks a proof of work",
                pow::ProofRefused::Stale => {
                    "the proof's challenge is not this sale's for this minute or the last"
                }
                pow::ProofRefused::TooEasy => {
                    "the proof's hash has too few leading zero bits for this buyer"
                }
            };
            return Err(ApiError::ChallengeRequired(format!(
                "{why}: solve GET /api/sales/{product}/challenge ({difficulty} bits) and send Join-Proof: <challenge>.<nonce>"
            )));
        }
    };
    let standing = standing_of(&state, &product, &ticket).await?;
    Ok(Json(TicketView {
        ticket,
        new,
        standing,
    }))
}

/// The header a join's proof of work comes in: `<challenge>.<nonce>`.
pub const JOIN_PROOF: &str = "join-proof";

/// A sale's join challenge.
#[derive(Serialize, ToSchema)]
pub struct ChallengeView {
    /// Find a nonce (1 to 32 letters or digits) such that
    /// `SHA-256("<challenge>:<user_id>:<nonce>")` starts with `difficulty`
    /// zero bits, and join with `Join-Proof: <challenge>.<nonce>`.
    challenge: String,
    /// Bits (0: joining costs nothing; about 2^difficulty hashes).
    difficulty: u8,
    /// A proof of this challenge is accepted until then (epoch ms).
    expires_at: i64,
    /// The buyer this request was verified as (the `user_id` to hash);
    /// absent with `AUTH=none` or without credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<u64>,
}

/// `GET /api/sales/{product_id}/challenge`: from this instance's reading
/// of the room, no Redis call.
#[utoipa::path(
    get,
    path = "/api/sales/{product_id}/challenge",
    operation_id = "join_challenge",
    tag = "waiting room",
    summary = "The proof of work a join costs",
    description = "The sale's challenge for this minute (the same for every buyer; a proof of it is accepted this minute and the next) and the difficulty in bits; with a verified buyer's credentials, also the `user_id` the proof must name. With a difficulty above 0, `POST /api/sales/{product_id}/queue` needs the header `Join-Proof: <challenge>.<nonce>` where `SHA-256(\"<challenge>:<user_id>:<nonce>\")` starts with that many zero bits.",
    params(SalePath),
    responses(
        (status = 200, description = "The challenge", body = ChallengeView),
        (status = 404, description = "`product_not_found` or `no_waiting_room`", body = ErrorBody),
    )
)]
pub async fn challenge(
    State(state): State<Buyers>,
    caller: Result<Caller, ApiError>,
    SalePath(id): SalePath,
) -> Result<Json<ChallengeView>, ApiError> {
    let product = id;
    let room = match state.room.known(&product).await? {
        RoomLookup::Room(room) => room,
        RoomLookup::NoRoom => return Err(ApiError::NoWaitingRoom),
        RoomLookup::NoSale => return Err(ApiError::ProductNotFound(NOT_ON_SALE)),
    };
    let (challenge, expires_at) = pow::challenge(&room.key, &product, now_ms());
    Ok(Json(ChallengeView {
        challenge,
        difficulty: room.join_difficulty,
        expires_at,
        user_id: match caller {
            Ok(Caller::Buyer(me)) => Some(me.get()),
            _ => None,
        },
    }))
}

/// `GET /api/sales/{product_id}/queue/{ticket}`: answered from this
/// instance's reading of the room (renewed about once a second), no Redis
/// call per poll.
#[utoipa::path(
    get,
    path = "/api/sales/{product_id}/queue/{ticket}",
    operation_id = "queue_standing",
    tag = "waiting room",
    summary = "Where a ticket stands",
    description = "`waiting` (with the place and an estimated wait once the draw is done), `admitted` (with the admission for `POST /api/orders` and its expiry), `expired`, `sold_out` or `ended`. Cheap: poll every few seconds.",
    params(
        SalePath,
        ("ticket" = String, Path, max_length = 200),
    ),
    responses(
        (status = 200, description = "Where it stands", body = StandingView),
        (status = 404, description = "`product_not_found`, `no_waiting_room` or `ticket_not_found`", body = ErrorBody),
    )
)]
pub async fn standing(
    State(state): State<Buyers>,
    parts: axum::http::request::Parts,
    PathParam((product_id, ticket)): PathParam<(String, String)>,
) -> Result<Json<StandingView>, ApiError> {
    let peer = crate::http::extract::peer(&parts.extensions);
    state.guards.check_poll(&parts.headers, peer)?;
    let product = product_in_path(&product_id)?;
    Ok(Json(standing_of(&state, &product, &ticket).await?))
}

/// Whether `path` is a poll, `/api/sales/{product_id}/queue/{ticket}`.
pub fn is_poll(path: &str) -> bool {
    poll_target(path).is_some()
}

fn poll_target(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/api/sales/")?;
    let (product, rest) = rest.split_once('/')?;
    let ticket = rest.strip_prefix("queue/")?;
    (!product.is_empty() && !ticket.is_empty() && !ticket.contains('/'))
        .then_some((product, ticket))
}

/// A poll, answered straight from the connection (no router): `serve`
/// hands it here, under the same guards as every request. The router's
/// route stays, for the same answers through it.
pub async fn poll_endpoint<B>(
    state: &Buyers,
    peer: Option<SocketAddr>,
    req: axum::http::Request<B>,
) -> Response
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    limits::guarded(&state.guards, req, |parts, _| async move {
        if let Err(limited) = state.guards.check_poll(&parts.headers, peer) {
            return limited.into_response();
        }
        let Some((product_id, ticket)) = poll_target(parts.uri.path()) else {
            return ApiError::RouteNotFound.into_response();
        };
        let answer = match product_in_path(product_id) {
            Ok(product) => standing_of(state, &product, ticket).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(view) => Json(view).into_response(),
            Err(e) => e.into_response(),
        }
    })
    .await
}

async fn standing_of(
    state: &Buyers,
    product: &ProductId,
    ticket: &str,
) -> Result<StandingView, ApiError> {
    let room = match state.room.lookup(product).await? {
        RoomLookup::Room(room) => room,
        RoomLookup::NoRoom => return Err(ApiError::NoWaitingRoom),
        RoomLookup::NoSale => return Err(ApiError::ProductNotFound(NOT_ON_SALE)),
    };
    let ticket = room
        .key
        .read_ticket(product, ticket)
        .ok_or(ApiError::TicketNotFound)?;
    let standing = room.standing(product, ticket, now_ms());
    Ok(StandingView::of(&room, standing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_farther_back_the_less_often_within_bounds() {
        assert_eq!(poll_after(Some(0), 0), POLL_MIN_MS);
        assert_eq!(poll_after(Some(4_000), 0), POLL_MIN_MS);
        assert_eq!(poll_after(Some(40_000), 0), 5_000);
        assert_eq!(poll_after(Some(80_000), 0), 10_000);
        assert_eq!(poll_after(Some(u64::MAX), 0), POLL_MAX_MS);
        // Before the draw: at the draw, within the same bounds.
        assert_eq!(poll_after(None, 7_000), 7_000);
        assert_eq!(poll_after(None, -5), POLL_MIN_MS);
        assert_eq!(poll_after(None, i64::MAX), POLL_MAX_MS);
    }
}
