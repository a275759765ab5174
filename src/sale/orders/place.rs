//! `place_order.lua`, where stock is deducted: the script checks the sale,
//! deducts the stock and appends each order of a call to the sale's stream
//! in one atomic step. Here: the call's command, written straight into its
//! buffer, and its reply, decoded once per call.

use redis::{FromRedisValue, ParsingError, RedisResult, Value, aio::ConnectionLike};
use rust_decimal::Decimal;

use super::decision::Vouched;
use super::record::idempotency_field;
use crate::config::ReplicaWait;
use crate::domain::{OrderId, PendingOrder, ProductId, Quantity, UserId};
use crate::sale::conn::Conn;
use crate::sale::keys::Key;
use crate::sale::lua::script;
use crate::sale::rejection::Rejection;
use crate::sale::wait::pipe_and_wait;

script!(PLACE_ORDER, "place_order");
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
    /// The sale has this many stock shards, and the buyer's home is
    /// another (nothing written).
    Shards(u16),
}

/// One order of a `place_order.lua` call, owned: it waits with the other
/// orders of its sale for the shared call that carries it
/// (`sale::orders::sharing`).
#[derive(Debug, Clone)]
pub struct OrderCall {
    pub order_id: OrderId,
    pub user_id: UserId,
    pub quantity: Quantity,
    /// Its Idempotency-Key, if any (kept with the order, for MySQL).
    pub idempotency_key: Option<String>,
    /// Whether the API checked the buyer's admission from the sale's room.
    pub vouched: Vouched,
    /// The stock shards of its sale the order was routed for (1: a sale of
    /// one, or not known to have several): a call's orders routed for
    /// another count than the sale's go back (`PlaceReply::Shards`).
    pub shards: u16,
}

impl OrderCall {
    /// The order as accepted at `created_ms` (Redis's time), at `price`:
    /// its id and key become the accepted order's, with no copy.
    pub(super) fn accepted(
        self,
        product: &ProductId,
        price: Decimal,
        created_ms: i64,
    ) -> PendingOrder {
        PendingOrder {
            order_id: self.order_id,
            user_id: self.user_id,
            product_id: product.clone(),
            quantity: self.quantity,
            price,
            created_ms,
            idempotency_key: self.idempotency_key,
        }
    }

    /// The idempotency record's field, `user_id:key`: keys of different
    /// buyers never meet.
    pub fn idempotency_field(&self) -> Option<String> {
        self.idempotency_key
            .as_ref()
            .map(|k| idempotency_field(self.user_id, k))
    }
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
    wait: ReplicaWait,
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
/// order path, see BENCHMARKS.md "What does an accepted order cost?").
fn place_order_cmd(prefix: &str, product: &ProductId, orders: &[OrderCall]) -> redis::Cmd {
    let key = |name| order_key(prefix, product, name);
    let ids: usize = orders.iter().map(|o| o.order_id.as_str().len()).sum();
    let room = 96 + 8 * (prefix.len() + product.as_str().len() + 12) + ids + 48 * orders.len();
    // The room's `room_used` only when an order counts against an active
    // cap: a key more is work for Redis on every call (~1,000 instructions).
    let counted = orders.iter().any(|o| {
        matches!(
            o.vouched,
            Vouched::Admitted {
                counted_in: Some(_)
            }
        )
    });
    let mut cmd = redis::Cmd::with_capacity(12 + 7 * orders.len(), room);
    cmd.arg("EVALSHA")
        .arg(PLACE_ORDER.get_hash())
        .arg(if counted { 8 } else { 7 })
        .arg(key("sale"))
        .arg(key("stock"))
        .arg(key("bought"))
        .arg(key("idem"))
        .arg(key("orders"))
        .arg(key("accepted"))
        .arg(key("void"));
    if counted {
        cmd.arg(key("room_used"));
    }
    // The count the call's orders were routed for; orders routed for
    // different counts (an instance learning a sale's shards meanwhile):
    // none, and every order goes back to be routed again.
    let shards = match orders.first() {
        Some(first) if orders.iter().all(|o| o.shards == first.shards) => first.shards,
        _ => 0,
    };
    cmd.arg(product.as_str()).arg(shards);
    for order in orders {
        let keyed = order.idempotency_key.is_some();
        let flags = match (order.vouched, keyed) {
            (Vouched::No, false) => "",
            (Vouched::No, true) => "k",
            (Vouched::Admitted { counted_in: None }, false) => "a",
            (Vouched::Admitted { counted_in: None }, true) => "ak",
            (
                Vouched::Admitted {
                    counted_in: Some(_),
                },
                false,
            ) => "c",
            (
                Vouched::Admitted {
                    counted_in: Some(_),
                },
                true,
            ) => "ck",
        };
        cmd.arg(order.order_id.as_str())
            .arg(order.user_id)
            .arg(order.quantity)
            .arg(flags);
        if let (Some(field), Some(key)) = (order.idempotency_field(), &order.idempotency_key) {
            cmd.arg(field).arg(key.as_str());
        }
        if let Vouched::Admitted {
            counted_in: Some(bucket),
        } = order.vouched
        {
            cmd.arg(bucket);
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
            "paused" => Self::Rejected(Rejection::Paused {
                since_ms: i64::from_redis_value(next()?)?,
            }),
            "admission_required" => Self::Rejected(Rejection::AdmissionRequired),
            "insufficient" => Self::Rejected(Rejection::InsufficientStock {
                left: u64::from_redis_value(next()?)?,
            }),
            "shard" => Self::Shards(u16::from_redis_value(next()?)?),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::answer::Code;
    use crate::sale::SaleKeys;

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
    }

    /// The table of the script's refusals is the script's: every code
    /// `lua/place_order.lua` answers is decoded, to the refusal whose API
    /// code the table names.
    #[test]
    fn every_refusal_the_script_answers_is_decoded_as_the_table_says() {
        use crate::sale::rejection::SCRIPT_REFUSALS;
        let script = include_str!("../../../lua/place_order.lua");
        let mut answered: Vec<&str> = script
            .split("answer = {'")
            .skip(1)
            .filter_map(|rest| rest.split('\'').next())
            .collect();
        answered.sort();
        answered.dedup();
        let mut known: Vec<&str> = SCRIPT_REFUSALS.iter().map(|(code, _)| *code).collect();
        known.extend(["repeat", "shard"]);
        known.sort();
        assert_eq!(answered, known, "the script's answers and the table differ");
        assert!(script.contains("return {'no_sale'}"));
        for (code, api) in SCRIPT_REFUSALS {
            // Redis's time before the window for `not_started`, after it
            // for `ended` (the script decides which; the reply says both).
            let now_ms = if code == "not_started" { 5 } else { 30 };
            let reply = Value::Array(vec![bulk(code), Value::Int(10), Value::Int(20)]);
            let why = match PlaceReply::refused(reply, now_ms).unwrap() {
                PlaceReply::Rejected(why) => why,
                PlaceReply::OutsideWindow {
                    start_ms, now_ms, ..
                } => Rejection::outside_window(start_ms, now_ms),
                other => panic!("{code}: {other:?}"),
            };
            assert_eq!(why.code(), api, "{code}");
        }
        assert_eq!(Rejection::NoSale.code(), Code::ProductNotFound);
    }

    #[test]
    fn no_sale_answers_every_order_and_a_broken_reply_is_an_error() {
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
    /// ARGV, four per order, six when keyed, one more when its admission
    /// counts against an active cap: byte for byte what
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
            shards: 3,
        };
        let admitted = |counted_in| Vouched::Admitted { counted_in };
        let orders = [
            order(42, Some("k-1"), admitted(None)),
            order(7, None, Vouched::No),
            order(8, Some("k 2"), Vouched::No),
            order(9, None, admitted(None)),
            order(10, None, admitted(Some(1_700_000_060))),
            order(11, Some("k-3"), admitted(Some(1_700_000_061))),
        ];
        let keys = SaleKeys::new("fs", &product);
        // The invocation of the first `n` orders: `room_used` among the
        // keys only when one of them counts against a cap.
        let invocation = |n: usize, shards: u16| {
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
            if n > 4 {
                invocation.key(&keys.room_used);
            }
            invocation.arg("sku-1").arg(shards);
            for (o, user, flags, keyed, until) in [
                (&orders[0], 42, "ak", Some(("42:k-1", "k-1")), None),
                (&orders[1], 7, "", None, None),
                (&orders[2], 8, "k", Some(("8:k 2", "k 2")), None),
                (&orders[3], 9, "a", None, None),
                (&orders[4], 10, "c", None, Some(1_700_000_060i64)),
                (
                    &orders[5],
                    11,
                    "ck",
                    Some(("11:k-3", "k-3")),
                    Some(1_700_000_061),
                ),
            ]
            .into_iter()
            .take(n)
            {
                invocation
                    .arg(o.order_id.as_str())
                    .arg(user)
                    .arg(2)
                    .arg(flags);
                if let Some((field, key)) = keyed {
                    invocation.arg(field).arg(key);
                }
                if let Some(until) = until {
                    invocation.arg(until);
                }
            }
            let mut pipe = redis::pipe();
            pipe.invoke_script(&invocation);
            pipe.get_packed_pipeline()
        };
        for n in [4, 6] {
            assert_eq!(
                place_order_cmd("fs", &product, &orders[..n]).get_packed_command(),
                invocation(n, 3),
                "{n} orders"
            );
        }
        // Orders routed for different counts of stock shards: the call says
        // none (the script sends every order back to be routed again).
        let mut mixed = orders.clone();
        mixed[2].shards = 1;
        assert_eq!(
            place_order_cmd("fs", &product, &mixed[..4]).get_packed_command(),
            invocation(4, 0),
        );
    }
}
