//! The key schema of a sale. Every key of one sale carries the product id as
//! its hash tag, `<prefix>:{<product_id>}:<name>`, so each script touches one
//! Redis Cluster slot and `redis-cli --scan --pattern '*{sku-1}*'` finds them all.
//! Keys are built here and nowhere else; scripts receive them in KEYS.

use crate::domain::ProductId;

/// The Redis keys of one sale.
#[derive(Debug, Clone)]
pub struct SaleKeys {
    /// Hash: start_ms, end_ms, limit, price, initial, opened_ms; `awake`
    /// while its drains are awake (see `sale::stream::bells`); with a
    /// waiting room, room_admission_ms, room_early_ms and room_key.
    pub sale: String,
    /// String: units left.
    pub stock: String,
    /// Hash: user_id -> units accepted for that user.
    pub bought: String,
    /// Hash: "user_id:Idempotency-Key" -> order_id.
    pub idem: String,
    /// Stream: one entry per accepted order.
    pub orders: String,
    /// Hash: order_id -> the order's record (JSON), for lookups by id.
    pub accepted: String,
    /// Set: order ids whose units were returned by `release_stock.lua`.
    pub released: String,
    /// Hash: order_id -> the cancel's time (epoch ms), orders whose units
    /// a late payment took again after they were released
    /// (`retake_order.lua`).
    pub retaken: String,
    /// Hash: "<kind>:<payment_id>" -> a payment notification the books
    /// recorded (JSON), kept so that a failover of the books that loses
    /// its record can put it back (`bookkeeping::put_back`).
    pub payments: String,
    /// Hash: restock id -> units (signed), the restocks done
    /// (`restock.lua`: each once).
    pub restocks: String,
    /// Stream: dead letters, entries the workers could not persist.
    pub dead: String,
    /// Hash: order_id -> user_id, cancels asked while the order was pending.
    pub cancels: String,
    /// String: when a worker last made sure the replicas had the sale's
    /// stream before persisting it (written for its WAIT to count; expires).
    pub replicated: String,
    /// Hash: order_id -> "void" (taken back after its WAIT failed, never to
    /// be persisted) or "replayed" (a keyed retry answered it: not voidable).
    pub void: String,
    /// String: the highest stream entry id a worker has claimed for
    /// persisting (after its WAIT); orders up to it can no longer be voided.
    pub claimed: String,
    /// Hash: what reconciliation restored from the books after Redis lost
    /// writes (orders, units, releases, idempotency_records, last_ms).
    pub repaired: String,
    /// Hash: the workers' last verdict on the books (balanced, difference,
    /// judged_ms), for the dashboards; expires unless renewed.
    pub books: String,
    /// Hash: the waiting room's shared state (ceiling, floor, cap, pace,
    /// served, at_ms, early, late, ...; `rate`, the ceiling's earlier name,
    /// is still read, and written by nothing); only for a sale with a room.
    pub room: String,
    /// List: what the room had admitted when ("at_ms:served", newest
    /// first), for its active cap; only while a cap is set.
    pub room_log: String,
    /// Hash: the places of the room's active cap that orders used, by
    /// their admission's expiry (`<expiry_ms / gap>` -> buyers who
    /// ordered); expired buckets removed by `room_tick.lua`; only while a
    /// cap is set.
    pub room_used: String,
    /// Hash: user_id -> the buyer's number in the waiting room (`e<n>`
    /// joined before the start, `l<n>` after): one field per joined buyer.
    pub joined: String,
    /// Hash: move id -> "<to shard>:<units>", units this stock shard gave
    /// to another and not yet known to have arrived (`move_take.lua`);
    /// only for a sale of several shards (see `sale::shards`).
    pub moves: String,
    /// Hash: move id -> "<to shard>:<units>", every move this stock shard
    /// gave (kept: the reconciler checks both sides after a failover).
    pub gave: String,
    /// Hash: move id -> "<from shard>:<units>", the moves this stock shard
    /// took in, each once (`move_apply.lua`).
    pub moved_in: String,
}

/// The consumer group of the stream workers, on every sale's stream.
pub const GROUP: &str = "persist";

/// The registry of open sales (a set of product ids). The one key that is not
/// a sale's: read by the workers every few seconds and by the API instances
/// in the background (to answer unknown ids), never by an order itself.
pub fn registry(prefix: &str) -> String {
    format!("{prefix}:sales")
}

/// The fleet's roll: a hash, one field per `serve`/`worker` process, the
/// process's name and release (JSON; see `sale::fleet`). Not a sale's: its
/// own slot, written once per process every few seconds.
pub fn fleet(prefix: &str) -> String {
    format!("{prefix}:fleet")
}

/// The pub/sub channel on which an order rings a sleeping sale's bell
/// (payload: the product id; see `sale::bells`). A channel, not a key: no
/// cluster slot.
pub fn bell_channel(prefix: &str) -> String {
    format!("{prefix}:bell")
}

/// One key of a sale, `<prefix>:{<product_id>}:<name>`, written where it is
/// used (into a command's arguments, with no `String` of its own: the order
/// path builds only the keys of its script) or made a `String`
/// ([`SaleKeys`] is made of these).
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    pub prefix: &'a str,
    pub product: &'a ProductId,
    pub name: &'static str,
}

impl Key<'_> {
    /// The key's pieces, in order (joined by plain copies: `format!` cost
    /// the order path ~1,300 instructions a key).
    fn pieces(&self) -> [&str; 5] {
        [self.prefix, ":{", self.product.as_str(), "}:", self.name]
    }
}

impl std::fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.pieces().iter().try_for_each(|p| f.write_str(p))
    }
}

impl From<Key<'_>> for String {
    fn from(key: Key<'_>) -> String {
        let pieces = key.pieces();
        let mut s = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
        pieces.iter().for_each(|p| s.push_str(p));
        s
    }
}

impl redis::ToRedisArgs for Key<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        // Joined on the stack, written as one argument (no `io::Write`
        // per piece: the order path writes seven keys a call).
        let mut buf = [0u8; 256];
        let mut len = 0;
        for p in self.pieces() {
            let Some(to) = buf.get_mut(len..len + p.len()) else {
                // Longer than any key of a valid prefix and product id.
                use std::io::Write;
                let mut arg = out.writer_for_next_arg();
                for p in self.pieces() {
                    // Writing into the command's own buffer cannot fail.
                    let _ = arg.write_all(p.as_bytes());
                }
                return;
            };
            to.copy_from_slice(p.as_bytes());
            len += p.len();
        }
        out.write_arg(&buf[..len]);
    }
}

impl SaleKeys {
    pub fn new(prefix: &str, product: &ProductId) -> Self {
        let key = |name: &'static str| {
            String::from(Key {
                prefix,
                product,
                name,
            })
        };
        Self {
            sale: key("sale"),
            stock: key("stock"),
            bought: key("bought"),
            idem: key("idem"),
            orders: key("orders"),
            accepted: key("accepted"),
            released: key("released"),
            retaken: key("retaken"),
            payments: key("payments"),
            restocks: key("restocks"),
            dead: key("dead"),
            cancels: key("cancels"),
            replicated: key("replicated"),
            void: key("void"),
            claimed: key("claimed"),
            repaired: key("repaired"),
            books: key("books"),
            room: key("room"),
            room_log: key("room_log"),
            room_used: key("room_used"),
            joined: key("joined"),
            moves: key("moves"),
            gave: key("gave"),
            moved_in: key("moved_in"),
        }
    }

    /// Every key of the sale (for removing it).
    pub fn all(&self) -> [&str; 24] {
        [
            &self.sale,
            &self.stock,
            &self.bought,
            &self.idem,
            &self.orders,
            &self.accepted,
            &self.released,
            &self.retaken,
            &self.payments,
            &self.restocks,
            &self.dead,
            &self.cancels,
            &self.replicated,
            &self.void,
            &self.claimed,
            &self.repaired,
            &self.books,
            &self.room,
            &self.room_log,
            &self.room_used,
            &self.joined,
            &self.moves,
            &self.gave,
            &self.moved_in,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_product_as_hash_tag() {
        let product = ProductId::parse("sku-1").unwrap();
        let keys = SaleKeys::new("fs", &product);
        assert_eq!(keys.stock, "fs:{sku-1}:stock");
        let written = redis::cmd("X")
            .arg(Key {
                prefix: "fs",
                product: &product,
                name: "stock",
            })
            .get_packed_command();
        assert!(written.ends_with(b"$16\r\nfs:{sku-1}:stock\r\n"));
        // A key longer than the stack's buffer is written whole too.
        let (prefix, long) = ("p".repeat(200), ProductId::parse(&"x".repeat(128)).unwrap());
        let key = Key {
            prefix: &prefix,
            product: &long,
            name: "stock",
        };
        let text = String::from(key);
        let written = redis::cmd("X").arg(key).get_packed_command();
        let expected = format!("${}\r\n{text}\r\n", text.len());
        assert!(written.ends_with(expected.as_bytes()), "{text}");
        for key in keys.all() {
            let tag = key
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'));
            assert_eq!(tag.map(|(t, _)| t), Some("sku-1"), "{key}");
        }
    }
}
