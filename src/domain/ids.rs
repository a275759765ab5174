//! Identities: of a sale (`ProductId`), an order (`OrderId`), a buyer
//! (`UserId`), and an order's units (`Quantity`). Each is only made valid.

use std::fmt;

use super::valid::{Invalid, MAX_PRODUCT_ID_LEN, MAX_QUANTITY, invalid, now_ms};

/// A product (= sale) id: 1..=128 characters of `[A-Za-z0-9._-]`.
///
/// Inside the service it may also name one stock shard of a sale opened
/// with several (`<product_id>~<k>`, k >= 1, see [`ProductId::shard`]):
/// the hash tag of that shard's keys in Redis. `~` is not a character of
/// a product id, so a shard's name is never a sale's; only
/// [`ProductId::shard`] and [`OrderId::parse`] make one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProductId(String);

/// The most stock shards a sale may have.
pub const MAX_SHARDS: u16 = 64;

/// Salts tried for a shard's tag (see [`ProductId::shard`]); a band is an
/// eighth of the slots or more, so the search ends within a few dozen.
const MAX_SALT: u32 = 100_000;

/// The Redis Cluster slot of keys whose hash tag is `tag` (CRC16/XMODEM
/// of the tag, modulo 16384).
pub fn key_slot(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for byte in tag.bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl ProductId {
    /// The rule [`ProductId::parse`] applies, as a regular expression (the
    /// OpenAPI document's and the pages' `pattern`).
    pub const PATTERN: &str = "^[A-Za-z0-9._-]{1,128}$";

    pub fn parse(s: &str) -> Result<Self, Invalid> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }

    /// [`Self::parse`], keeping `s`'s allocation.
    pub fn parse_owned(s: String) -> Result<Self, Invalid> {
        Self::check(&s)?;
        Ok(Self(s))
    }

    fn check(s: &str) -> Result<(), Invalid> {
        if s.is_empty() {
            return Err(invalid("product_id must not be empty"));
        }
        if s.len() > MAX_PRODUCT_ID_LEN {
            return Err(invalid(format!(
                "product_id must be at most {MAX_PRODUCT_ID_LEN} characters"
            )));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid(
                "product_id may only contain letters, digits, '.', '_' and '-'",
            ));
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Stock shard `k` of this sale's `n`: the sale itself for 0 (a sale
    /// of one shard keeps the keys it always had), else `<product_id>~<k>`,
    /// or `<product_id>~<k>.<j>` with the smallest `j` that puts its hash
    /// slot in the middle half of the `(b + k) mod n`-th of `n` equal bands
    /// of the 16,384 slots, `b` being the sale's own band: the shards are
    /// spread evenly over the slots, so on a cluster of `n` masters holding
    /// equal ranges (as `redis-cli --cluster create` makes them) each shard
    /// is on a master of its own.
    pub fn shard(&self, k: u16, n: u16) -> ProductId {
        let sale = self.sale_str();
        if k == 0 || n <= 1 {
            return Self(sale.to_owned());
        }
        const RING: u32 = 16_384;
        let n = u32::from(n);
        let band = (u32::from(key_slot(sale)) * n / RING + u32::from(k)) % n;
        let (lo, hi) = (band * RING / n, (band + 1) * RING / n);
        let quarter = (hi - lo) / 4;
        let fits = |tag: &str| (lo + quarter..hi - quarter).contains(&u32::from(key_slot(tag)));
        let base = format!("{sale}~{k}");
        if fits(&base) {
            return Self(base);
        }
        (1..MAX_SALT)
            .map(|j| format!("{base}.{j}"))
            .find(|tag| fits(tag))
            .map_or(Self(base), Self)
    }

    /// The sale this id names (itself, or the sale of a shard).
    pub fn sale(&self) -> ProductId {
        Self(self.sale_str().to_owned())
    }

    /// [`Self::sale`], taking this id: no copy (an order's answer names
    /// its sale; a sale of one shard's id is its sale's).
    pub fn into_sale(mut self) -> ProductId {
        if let Some(at) = self.0.find('~') {
            self.0.truncate(at);
        }
        self
    }

    fn sale_str(&self) -> &str {
        self.0.split_once('~').map_or(&self.0, |(sale, _)| sale)
    }

    /// Which stock shard of its sale this id names (0: the sale itself).
    pub fn shard_index(&self) -> u16 {
        self.0
            .split_once('~')
            .and_then(|(_, k)| k.split('.').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Whether this names a shard k >= 1 rather than a sale.
    pub fn is_shard(&self) -> bool {
        self.0.contains('~')
    }

    /// A sale's or a shard's name as written by [`Self::shard`].
    pub fn parse_sale_or_shard(s: &str) -> Option<Self> {
        match s.split_once('~') {
            None => Self::parse(s).ok(),
            Some((sale, shard)) => {
                let (digits, salt) = match shard.split_once('.') {
                    Some((k, j)) => (k, Some(j)),
                    None => (shard, None),
                };
                let k: u16 = digits.parse().ok()?;
                let canonical = (1..MAX_SHARDS).contains(&k) && k.to_string() == digits;
                let salt_ok = salt.is_none_or(|j| {
                    j.parse::<u32>()
                        .is_ok_and(|v| (1..MAX_SALT).contains(&v) && v.to_string() == j)
                });
                (canonical && salt_ok && Self::check(sale).is_ok()).then(|| Self(s.to_owned()))
            }
        }
    }
}

impl fmt::Display for ProductId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An order id: `<product_id>:<36 hex digits>`, the digits being the time in
/// ms (12) and 96 bits from the operating system's random source (24): unique
/// without coordination, ordered by time, and unguessable: one id says
/// nothing about any other (ids issued before this format, with 32 digits
/// of time, a per-process number and a counter, are still accepted).
///
/// Generated by the API instance, not by a Redis counter: a counter restarts
/// when Redis loses a sale, and a reused id would make the worker's
/// "insert unless present" silently drop a real order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrderId(String);

/// Random bytes for ids, drawn from the OS in blocks (one `getrandom` call
/// per ~340 ids rather than one per id); each byte is used once.
struct RandomPool {
    bytes: [u8; 4096],
    used: usize,
}

thread_local! {
    static POOL: std::cell::RefCell<RandomPool> = const {
        std::cell::RefCell::new(RandomPool { bytes: [0; 4096], used: 4096 })
    };
}

/// 96 fresh random bits.
fn random_96() -> [u8; 12] {
    POOL.with_borrow_mut(|pool| {
        if pool.used + 12 > pool.bytes.len() {
            // The OS source fails only on a broken system; ids must not be guessable.
            getrandom::fill(&mut pool.bytes).expect("the OS random source answers");
            pool.used = 0;
        }
        let mut out = [0; 12];
        out.copy_from_slice(&pool.bytes[pool.used..pool.used + 12]);
        pool.used += 12;
        out
    })
}

impl OrderId {
    pub fn generate(product: &ProductId) -> Self {
        let ms = now_ms() as u64 & 0xFFFF_FFFF_FFFF;
        let mut random = [0; 16];
        random[4..].copy_from_slice(&random_96());
        let random = u128::from_be_bytes(random);
        // Written digit by digit: `format!`'s machinery was a twentieth of
        // an accepted order's instructions in the API (BENCHMARKS.md,
        // "What does an accepted order cost?").
        let mut id = String::with_capacity(product.0.len() + 37);
        id.push_str(&product.0);
        id.push(':');
        push_hex(&mut id, u128::from(ms), 12);
        push_hex(&mut id, random, 24);
        Self(id)
    }

    /// Parses an id that this service could have issued (36 hex digits, or
    /// 32 for ids issued before 0.2); `None` otherwise (such an id was never
    /// accepted).
    ///
    /// The id of an order of a sale's stock shard k >= 1 is
    /// `<product_id>~<k>:<digits>`: the product returned names that shard
    /// (its [`ProductId::sale`] is the sale).
    pub fn parse(s: &str) -> Option<(Self, ProductId)> {
        let (product, suffix) = s.rsplit_once(':')?;
        let product = ProductId::parse_sale_or_shard(product)?;
        let well_formed = matches!(suffix.len(), 32 | 36)
            && suffix
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        well_formed.then(|| (Self(s.to_owned()), product))
    }

    /// Wraps an id read back from our own storage (Redis or MySQL).
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The `digits` low hex digits of `v`, most significant first, lower case.
fn push_hex(out: &mut String, v: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out.push(char::from(HEX[((v >> (4 * i)) & 0xf) as usize]));
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A buyer id: 1..=i64::MAX (it is a BIGINT in MySQL). Only made valid.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u64", into = "u64")]
pub struct UserId(u64);

impl UserId {
    pub fn new(v: u64) -> Result<Self, Invalid> {
        if v == 0 || v > i64::MAX as u64 {
            return Err(invalid(format!(
                "user_id must be between 1 and {}",
                i64::MAX
            )));
        }
        Ok(Self(v))
    }

    /// A buyer id written as text (a token's claim, a gateway's header):
    /// its canonical digits only, so that one buyer has one spelling.
    /// `"+4101"`, `"04101"`, `" 4101"` or `"4101.0"` are refused, not read
    /// as 4101.
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let canonical =
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0');
        if !canonical {
            return Err(invalid(
                "user_id must be digits without a sign or leading zeros".to_owned(),
            ));
        }
        Self::new(
            s.parse()
                .map_err(|_| invalid(format!("user_id must be between 1 and {}", i64::MAX)))?,
        )
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// As MySQL's BIGINT holds it (it fits: at most i64::MAX).
    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }
}

impl TryFrom<u64> for UserId {
    type Error = Invalid;
    fn try_from(v: u64) -> Result<Self, Invalid> {
        Self::new(v)
    }
}

impl From<UserId> for u64 {
    fn from(u: UserId) -> u64 {
        u.0
    }
}

/// Sent to Redis (a script's argument, a hash's value) as its digits.
impl redis::ToRedisArgs for UserId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        self.0.write_redis_args(out);
    }
}

impl redis::ToSingleRedisArg for UserId {}

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Units in one order: 1..=MAX_QUANTITY. Only made valid.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u64", into = "u64")]
pub struct Quantity(u64);

impl Quantity {
    /// One unit.
    pub const ONE: Self = Self(1);

    pub fn new(v: u64) -> Result<Self, Invalid> {
        if v == 0 || v > MAX_QUANTITY {
            return Err(invalid(format!(
                "quantity must be between 1 and {MAX_QUANTITY}"
            )));
        }
        Ok(Self(v))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for Quantity {
    type Error = Invalid;
    fn try_from(v: u64) -> Result<Self, Invalid> {
        Self::new(v)
    }
}

impl From<Quantity> for u64 {
    fn from(q: Quantity) -> u64 {
        q.0
    }
}

impl redis::ToRedisArgs for Quantity {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        self.0.write_redis_args(out);
    }
}

impl redis::ToSingleRedisArg for Quantity {}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern says what `parse` does: its length and its characters.
    #[test]
    fn the_product_id_pattern_is_the_parse_rule() {
        assert!(
            ProductId::PATTERN.ends_with(&format!("]{{1,{MAX_PRODUCT_ID_LEN}}}$")),
            "{}",
            ProductId::PATTERN
        );
        let class = "A-Za-z0-9._-";
        assert!(ProductId::PATTERN.contains(&format!("[{class}]")));
        for b in 0u8..128 {
            let c = b as char;
            let in_class = c.is_ascii_alphanumeric() || ".-_".contains(c);
            assert_eq!(ProductId::parse(&c.to_string()).is_ok(), in_class, "{c:?}");
        }
        assert!(ProductId::parse(&"a".repeat(MAX_PRODUCT_ID_LEN)).is_ok());
        assert!(ProductId::parse(&"a".repeat(MAX_PRODUCT_ID_LEN + 1)).is_err());
        assert!(ProductId::parse("").is_err());
    }
}
