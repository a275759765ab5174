//! Rust wrappers of the order, stream and lifecycle scripts in `lua/` (the
//! waiting room's, `room_join.lua` and `room_tick.lua`, are the room's own:
//! `sale::room`): each passes every key in KEYS
//! and decodes the script's reply in one place. `redis::Script` sends EVALSHA
//! and loads the script again when Redis answers NOSCRIPT (after a restart or
//! a `SCRIPT FLUSH`), so the text travels once per server, not per call.

use std::sync::LazyLock;

use redis::{FromRedisValue, ParsingError, RedisResult, Script, Value, aio::ConnectionLike};
use rust_decimal::Decimal;

use super::conn::{Conn, Wait};
use super::keys::{Key, SaleKeys};
use super::types::{
    Booked, BookedState, Progress, Rejection, Restore, Restored, SaleSpec, Vouched, booked_record,
};
use crate::domain::PendingOrder;
use crate::domain::{OrderId, ProductId, Quantity, UserId};

static OPEN_SALE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/open_sale.lua")));
static PLACE_ORDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/place_order.lua")));
static RELEASE_STOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/release_stock.lua")));
static RETAKE_ORDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/retake_order.lua")));
static VOID_ORDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/void_order.lua")));
static CLAIM_BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/claim_batch.lua")));
static RESTORE_BOOKED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/restore_booked.lua")));
static ORDER_STATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/order_state.lua")));
static SALE_CLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/sale_clock.lua")));

static CLOSE_SALE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/close_sale.lua")));

/// `close_sale.lua`: ends the sale now; its end (ms), `None` when not open.
pub async fn close_sale(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
) -> RedisResult<Option<i64>> {
    CLOSE_SALE.key(&keys.sale).invoke_async(conn).await
}

/// `sale_clock.lua`: the Redis node's time (ms) and the sale's window, if open.
pub async fn sale_clock(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
) -> RedisResult<(i64, Option<(i64, i64)>)> {
    let reply: Vec<i64> = SALE_CLOCK.key(&keys.sale).invoke_async(conn).await?;
    match reply[..] {
        [secs, micros] => Ok((secs * 1000 + micros / 1000, None)),
        [secs, micros, start, end] => Ok((secs * 1000 + micros / 1000, Some((start, end)))),
        _ => Err(ParsingError::from(format!("unexpected sale_clock reply {reply:?}")).into()),
    }
}

/// `order_state.lua`: the order's record and progress, `None` when unknown.
pub async fn order_state(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    order_id: &OrderId,
) -> RedisResult<Option<(String, Progress)>> {
    let reply: Vec<String> = ORDER_STATE
        .key(&keys.accepted)
        .key(&keys.released)
        .key(&keys.cancels)
        .key(&keys.orders)
        .key(&keys.dead)
        .arg(order_id.as_str())
        .arg(super::keys::GROUP)
        .invoke_async(conn)
        .await?;
    let mut parts = reply.into_iter();
    let (Some(record), Some(state)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    let progress = match state.as_str() {
        "released" => Progress::Released,
        "cancel_requested" => Progress::CancelRequested,
        "queued" => Progress::Queued,
        "dead" => Progress::DeadLettered,
        "persisted" => Progress::Persisted,
        other => {
            return Err(ParsingError::from(format!("unknown order_state {other:?}")).into());
        }
    };
    Ok(Some((record, progress)))
}

/// What `void_order.lua` did with an order whose WAIT failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Voided {
    /// Taken back: it will never be persisted.
    Void,
    /// A worker claimed it after its own WAIT: the replicas have it.
    Claimed,
    /// A keyed retry answered it since: it stands.
    Replayed,
    /// This Redis does not know the order (a failover lost it).
    Unknown,
}

/// `void_order.lua`.
pub async fn void_order(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    order_id: &OrderId,
    idempotency_field: Option<&str>,
) -> RedisResult<Voided> {
    let reply: String = VOID_ORDER
        .key(&keys.accepted)
        .key(&keys.void)
        .key(&keys.claimed)
        .key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.idem)
        .arg(order_id.as_str())
        .arg(idempotency_field.unwrap_or(""))
        .invoke_async(conn)
        .await?;
    Ok(match reply.as_str() {
        "void" => Voided::Void,
        "claimed" => Voided::Claimed,
        "replayed" => Voided::Replayed,
        "unknown" => Voided::Unknown,
        other => {
            return Err(ParsingError::from(format!("unknown void_order reply {other:?}")).into());
        }
    })
}

/// `claim_batch.lua`: the batch's order ids that were voided.
pub async fn claim_batch(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    last_entry: &str,
    order_ids: &[&str],
) -> RedisResult<Vec<String>> {
    CLAIM_BATCH
        .key(&keys.void)
        .key(&keys.claimed)
        .arg(last_entry)
        .arg(order_ids)
        .invoke_async(conn)
        .await
}

/// `restore_booked.lua` for one chunk of orders.
pub async fn restore_booked(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    booked: &[Booked],
    why: Restore,
) -> RedisResult<Restored> {
    let mut call = RESTORE_BOOKED.prepare_invoke();
    call.key(&keys.accepted)
        .key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.released)
        .key(&keys.idem)
        .key(&keys.repaired)
        .key(&keys.retaken)
        .arg(match why {
            Restore::Repair => "1",
            Restore::Rebuild => "0",
        });
    for b in booked {
        let o = &b.order;
        let state = match b.state {
            BookedState::Sold => "sold",
            BookedState::Cancelled => "cancelled",
            BookedState::Returned => "returned",
        };
        let field = o
            .idempotency_key
            .as_ref()
            .map(|k| idempotency_field(o.user_id, k))
            .unwrap_or_default();
        call.arg(o.order_id.as_str())
            .arg(o.user_id)
            .arg(o.quantity)
            .arg(state)
            .arg(booked_record(o))
            .arg(field);
    }
    let (orders, units, releases, idempotency_records, stock): (u64, u64, u64, u64, i64) =
        call.invoke_async(conn).await?;
    Ok(Restored {
        orders,
        units,
        releases,
        idempotency_records,
        stock,
    })
}

/// `open_sale.lua`: returns `(opened_now, stock_left)`. `room_key`: the
/// waiting room's key (hex), kept only if this call loads the sale.
pub async fn open_sale(
    conn: &mut impl ConnectionLike,
    keys: &SaleKeys,
    spec: &SaleSpec,
    room_key: &str,
) -> RedisResult<(bool, u64)> {
    let room = spec.waiting_room.as_ref();
    OPEN_SALE
        .key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.orders)
        .key(&keys.room)
        .key(&keys.room_log)
        .arg(spec.stock)
        .arg(spec.start_ms)
        .arg(spec.end_ms)
        .arg(spec.limit_per_user)
        .arg(spec.price.to_string())
        .arg(super::keys::GROUP)
        .arg(room.map_or(String::new(), |r| r.admit_per_sec.to_string()))
        .arg(room.map_or(0, |r| u64::from(r.admission_secs) * 1000))
        .arg(room.map_or(0, |r| u64::from(r.join_early_secs) * 1000))
        .arg(room_key)
        .arg(room.map_or(0, |r| r.floor()))
        .arg(room.map_or(0, |r| r.active_cap.unwrap_or(0)))
        .arg(room.map_or(0, |r| r.join_difficulty.unwrap_or(0)))
        .invoke_async(conn)
        .await
}

/// `release_stock.lua`, for a cancel made at `cancelled_ms`: replies
/// `(released_now, stock_left)`.
pub(super) fn release_stock_call(
    keys: &SaleKeys,
    order: &PendingOrder,
    cancelled_ms: i64,
) -> redis::ScriptInvocation<'static> {
    let mut call = RELEASE_STOCK.prepare_invoke();
    call.key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.released)
        .key(&keys.accepted)
        .key(&keys.retaken)
        .arg(order.order_id.as_str())
        .arg(order.user_id)
        .arg(order.quantity)
        .arg(booked_record(order))
        .arg(cancelled_ms);
    call
}

/// What `retake_order.lua` found for a late payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retake {
    /// The units are the order's again (now or by an earlier call).
    Taken,
    /// Not here: no such sale or order in this Redis, the sale is over,
    /// the units sold to others, or the buyer's allowance used up since.
    Refused(&'static str),
}

impl FromRedisValue for Retake {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut parts = Vec::<Value>::from_redis_value(v)?.into_iter();
        let tag = String::from_redis_value(parts.next().ok_or("empty reply")?)?;
        Ok(match tag.as_str() {
            "taken" => Self::Taken,
            "no_sale" => Self::Refused("no_sale"),
            "unknown" => Self::Refused("unknown"),
            "ended" => Self::Refused("ended"),
            "sold_out" => Self::Refused("sold_out"),
            "limit" => Self::Refused("limit"),
            other => {
                return Err(ParsingError::from(format!(
                    "unexpected retake_order reply {other:?}"
                )));
            }
        })
    }
}

/// `retake_order.lua`, for the cancel made at `cancelled_ms`: replies a
/// [`Retake`].
pub(super) fn retake_order_call(
    keys: &SaleKeys,
    order: &PendingOrder,
    cancelled_ms: i64,
) -> redis::ScriptInvocation<'static> {
    let mut call = RETAKE_ORDER.prepare_invoke();
    call.key(&keys.sale)
        .key(&keys.stock)
        .key(&keys.bought)
        .key(&keys.released)
        .key(&keys.accepted)
        .key(&keys.retaken)
        .arg(order.order_id.as_str())
        .arg(order.user_id)
        .arg(order.quantity)
        .arg(cancelled_ms);
    call
}

/// What `place_order.lua` answered for one order of a call.
#[derive(Debug, Clone)]
pub enum PlaceReply {
    Accepted {
        price: Decimal,
        created_ms: i64,
        /// Units the buyer may still buy.
        allowance_left: u64,
    },
    Replayed {
        order_id: OrderId,
        record: String,
    },
    /// Not started (`now_ms < start_ms`) or ended, by Redis's clock.
    OutsideWindow {
        start_ms: i64,
        end_ms: i64,
        now_ms: i64,
    },
    Rejected(Rejection),
}

/// One order of a `place_order.lua` call, owned: it waits in its sale's
/// line (`sale::line`) for the call that carries it.
#[derive(Debug, Clone)]
pub struct OrderCall {
    pub order_id: OrderId,
    pub user_id: UserId,
    pub quantity: Quantity,
    /// Its Idempotency-Key, if any (kept with the order, for MySQL).
    pub idempotency_key: Option<String>,
    /// Whether the API checked the buyer's admission from the sale's room.
    pub vouched: Vouched,
}

impl OrderCall {
    /// The idempotency record's field, `user_id:key`: keys of different
    /// buyers never meet.
    pub fn idempotency_field(&self) -> Option<String> {
        self.idempotency_key
            .as_ref()
            .map(|k| idempotency_field(self.user_id, k))
    }
}

/// The field of an Idempotency-Key's record in the sale's `idem` hash:
/// `user_id:key`, so that keys of different buyers never meet.
fn idempotency_field(user_id: UserId, key: &str) -> String {
    format!("{user_id}:{key}")
}

/// `place_order.lua` for `orders` of `product`'s sale (one or more, in
/// their order of arrival), as one `EVALSHA` written straight into its
/// command buffer (see [`place_order_cmd`]); loaded again on NOSCRIPT.
/// One reply per order, in their order.
pub async fn place_orders(
    conn: &mut impl ConnectionLike,
    prefix: &str,
    product: &ProductId,
    orders: &[OrderCall],
) -> RedisResult<Vec<PlaceReply>> {
    let cmd = place_order_cmd(prefix, product, orders);
    let reply = match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            PLACE_ORDER.prepare_invoke().load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }?;
    Ok(parse_place_replies(reply, orders.len())?)
}

/// `place_order.lua`, then `WAIT`, on the same connection and node (see
/// [`pipe_and_wait`]); returns the replies and the replicas that have the
/// orders. On a replay the script writes too, so the WAIT covers the first
/// order whichever answer this is.
pub async fn place_orders_and_wait(
    conn: &mut Conn,
    prefix: &str,
    product: &ProductId,
    orders: &[OrderCall],
    wait: Wait,
) -> RedisResult<(Vec<PlaceReply>, u32)> {
    let cmd = place_order_cmd(prefix, product, orders);
    let stream = order_key(prefix, product, "orders").to_string();
    let pipe = || {
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        pipe
    };
    let load = async |c: &mut Conn| PLACE_ORDER.prepare_invoke().load_async(c).await;
    let (reply, acked) = pipe_and_wait::<Value>(conn, &stream, pipe, load, wait).await?;
    Ok((parse_place_replies(reply, orders.len())?, acked))
}

/// The `EVALSHA` of `place_order.lua`: its keys and arguments are written
/// into the command's one buffer as they are made (no `String` per key, no
/// copy per argument: what `redis::Script`'s invocation costs on the
/// order path, see BENCHMARKS.md "What an accepted order costs").
fn place_order_cmd(prefix: &str, product: &ProductId, orders: &[OrderCall]) -> redis::Cmd {
    let key = |name| order_key(prefix, product, name);
    let ids: usize = orders.iter().map(|o| o.order_id.as_str().len()).sum();
    let room = 96 + 8 * (prefix.len() + product.as_str().len() + 12) + ids + 48 * orders.len();
    let mut cmd = redis::Cmd::with_capacity(11 + 6 * orders.len(), room);
    cmd.arg("EVALSHA")
        .arg(PLACE_ORDER.get_hash())
        .arg(7)
        .arg(key("sale"))
        .arg(key("stock"))
        .arg(key("bought"))
        .arg(key("idem"))
        .arg(key("orders"))
        .arg(key("accepted"))
        .arg(key("void"))
        .arg(product.as_str());
    for order in orders {
        let admitted = order.vouched == Vouched::Admitted;
        let flags = match (admitted, order.idempotency_key.is_some()) {
            (false, false) => "",
            (true, false) => "a",
            (false, true) => "k",
            (true, true) => "ak",
        };
        cmd.arg(order.order_id.as_str())
            .arg(order.user_id)
            .arg(order.quantity)
            .arg(flags);
        if let (Some(field), Some(key)) = (order.idempotency_field(), &order.idempotency_key) {
            cmd.arg(field).arg(key.as_str());
        }
    }
    cmd
}

/// The reply of a `place_order.lua` call for `n` orders: one
/// [`PlaceReply`] each. `{"no_sale"}` answers them all; otherwise the
/// price and Redis's time (ms) the call's orders share, then an answer per
/// order: the integer units the buyer may still buy for an accepted one
/// (nothing else to parse on the busiest path), an array for any other.
fn parse_place_replies(reply: Value, n: usize) -> Result<Vec<PlaceReply>, ParsingError> {
    let Value::Array(parts) = reply else {
        return Err(format!("place_order reply {reply:?} is not an array").into());
    };
    let mut parts = parts.into_iter();
    let (Some(price), Some(now_ms)) = (parts.next(), parts.next()) else {
        return match parts.len() {
            0 => Ok(vec![PlaceReply::Rejected(Rejection::NoSale); n]),
            _ => Err("place_order reply too short".into()),
        };
    };
    if parts.len() != n {
        return Err(format!("place_order answered {} of {n} orders", parts.len()).into());
    }
    let price = String::from_redis_value(price)?;
    let price: Decimal = price
        .parse()
        .map_err(|_| format!("place_order reply: bad price {price:?}"))?;
    let now_ms = i64::from_redis_value(now_ms)?;
    parts
        .map(|answer| match answer {
            Value::Int(left) => Ok(PlaceReply::Accepted {
                price,
                created_ms: now_ms,
                allowance_left: u64::try_from(left)
                    .map_err(|_| format!("place_order reply: allowance {left}"))?,
            }),
            other => PlaceReply::refused(other, now_ms),
        })
        .collect()
}

impl PlaceReply {
    /// An answer other than an acceptance: `{status, ...}`.
    fn refused(answer: Value, now_ms: i64) -> Result<Self, ParsingError> {
        let Value::Array(parts) = answer else {
            return Err(format!("place_order answer {answer:?} is not an array").into());
        };
        let mut parts = parts.into_iter();
        let status = String::from_redis_value(parts.next().ok_or("empty answer")?)?;
        let mut next = || {
            parts
                .next()
                .ok_or_else(|| format!("short answer for {status}"))
        };
        let reply = match status.as_str() {
            "repeat" => Self::Replayed {
                order_id: OrderId::from_trusted(String::from_redis_value(next()?)?),
                record: String::from_redis_value(next()?)?,
            },
            "not_started" | "ended" => Self::OutsideWindow {
                start_ms: i64::from_redis_value(next()?)?,
                end_ms: i64::from_redis_value(next()?)?,
                now_ms,
            },
            "sold_out" => Self::Rejected(Rejection::SoldOut),
            "admission_required" => Self::Rejected(Rejection::AdmissionRequired),
            "insufficient" => Self::Rejected(Rejection::InsufficientStock {
                left: u64::from_redis_value(next()?)?,
            }),
            "limit" => Self::Rejected(Rejection::LimitExceeded {
                allowance: u64::from_redis_value(next()?)?,
            }),
            other => return Err(format!("unknown place_order answer {other:?}").into()),
        };
        Ok(reply)
    }
}

fn order_key<'a>(prefix: &'a str, product: &'a ProductId, name: &'static str) -> Key<'a> {
    Key {
        prefix,
        product,
        name,
    }
}

/// A script call, then `WAIT`, as one pipeline to the master holding `key`
/// (one of the script's keys); see [`super::conn::then_wait`].
pub(super) async fn invoke_and_wait<T: FromRedisValue>(
    conn: &mut Conn,
    key: &str,
    call: &redis::ScriptInvocation<'_>,
    wait: Wait,
) -> RedisResult<(T, u32)> {
    let pipe = || {
        let mut pipe = redis::pipe();
        pipe.invoke_script(call);
        pipe
    };
    pipe_and_wait(
        conn,
        key,
        pipe,
        async |c: &mut Conn| call.load_async(c).await,
        wait,
    )
    .await
}

/// A pipeline of one script call (`pipe` makes it), then `WAIT`; `load`
/// loads the script when the node answers NOSCRIPT (a pipeline does not load
/// it by itself: after a restart, or a failover to a node that never ran it).
async fn pipe_and_wait<T: FromRedisValue>(
    conn: &mut Conn,
    key: &str,
    pipe: impl Fn() -> redis::Pipeline,
    load: impl AsyncFnOnce(&mut Conn) -> RedisResult<String>,
    wait: Wait,
) -> RedisResult<(T, u32)> {
    let (reply, acked) = match super::conn::then_wait(conn, key, pipe(), wait).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            load(conn).await?;
            super::conn::then_wait(conn, key, pipe(), wait).await?
        }
        other => other?,
    };
    Ok((T::from_redis_value(reply)?, acked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_calls_reply_shares_price_and_time_and_answers_each_order() {
        let reply = Value::Array(vec![
            bulk("4999.50"),
            Value::Int(1_796_003_647_270),
            Value::Int(3),
            Value::Array(vec![bulk("limit"), Value::Int(0)]),
            Value::Array(vec![bulk("ended"), Value::Int(10), Value::Int(20)]),
            Value::Int(0),
        ]);
        let replies = parse_place_replies(reply, 4).unwrap();
        let PlaceReply::Accepted {
            price,
            created_ms,
            allowance_left,
        } = &replies[0]
        else {
            panic!("{replies:?}");
        };
        assert_eq!(
            (price.to_string(), *created_ms, *allowance_left),
            ("4999.50".into(), 1_796_003_647_270, 3)
        );
        assert!(matches!(
            replies[1],
            PlaceReply::Rejected(Rejection::LimitExceeded { allowance: 0 })
        ));
        assert!(matches!(
            replies[2],
            PlaceReply::OutsideWindow {
                start_ms: 10,
                end_ms: 20,
                now_ms: 1_796_003_647_270
            }
        ));
        assert!(matches!(
            replies[3],
            PlaceReply::Accepted {
                allowance_left: 0,
                ..
            }
        ));

        let no_sale = parse_place_replies(Value::Array(vec![bulk("no_sale")]), 2).unwrap();
        assert!(
            no_sale
                .iter()
                .all(|r| matches!(r, PlaceReply::Rejected(Rejection::NoSale)))
        );
        // A reply that answers another number of orders, or is malformed,
        // is an error, never a guess.
        for broken in [
            Value::Array(vec![bulk("1.00"), Value::Int(1), Value::Int(1)]),
            Value::Array(vec![bulk("x"), Value::Int(1), Value::Int(1), Value::Int(1)]),
            Value::Array(vec![
                bulk("1"),
                Value::Int(1),
                Value::Int(-1),
                Value::Int(1),
            ]),
            Value::Array(vec![
                bulk("1"),
                Value::Int(1),
                Value::Array(vec![bulk("what")]),
                Value::Int(1),
            ]),
            bulk("ok 4999 1796003647270 1"),
        ] {
            assert!(
                parse_place_replies(broken.clone(), 2).is_err(),
                "{broken:?}"
            );
        }
    }

    /// The order command carries the script's KEYS in its contract's
    /// order, named as every other handle names them (`SaleKeys`), and its
    /// ARGV, four per order or six when keyed: byte for byte what
    /// `redis::Script`'s invocation sends.
    #[test]
    fn the_order_command_is_the_scripts_invocation() {
        let product = ProductId::parse("sku-1").unwrap();
        let order = |user, key: Option<&str>, vouched| OrderCall {
            order_id: OrderId::generate(&product),
            user_id: UserId::new(user).unwrap(),
            quantity: Quantity::new(2).unwrap(),
            idempotency_key: key.map(str::to_owned),
            vouched,
        };
        let orders = [
            order(42, Some("k-1"), Vouched::Admitted),
            order(7, None, Vouched::No),
            order(8, Some("k 2"), Vouched::No),
            order(9, None, Vouched::Admitted),
        ];
        let keys = SaleKeys::new("fs", &product);
        let mut invocation = PLACE_ORDER.prepare_invoke();
        for key in [
            &keys.sale,
            &keys.stock,
            &keys.bought,
            &keys.idem,
            &keys.orders,
            &keys.accepted,
            &keys.void,
        ] {
            invocation.key(key);
        }
        invocation.arg("sku-1");
        for (o, user, flags, keyed) in [
            (&orders[0], 42, "ak", Some(("42:k-1", "k-1"))),
            (&orders[1], 7, "", None),
            (&orders[2], 8, "k", Some(("8:k 2", "k 2"))),
            (&orders[3], 9, "a", None),
        ] {
            invocation
                .arg(o.order_id.as_str())
                .arg(user)
                .arg(2)
                .arg(flags);
            if let Some((field, key)) = keyed {
                invocation.arg(field).arg(key);
            }
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation);
        assert_eq!(
            place_order_cmd("fs", &product, &orders).get_packed_command(),
            pipe.get_packed_pipeline()
        );
    }
}
