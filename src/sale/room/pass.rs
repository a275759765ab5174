//! What a waiting room hands out, signed with the sale's room key (random,
//! made when the sale opens, kept in the sale's hash) so that any instance
//! checks it without asking Redis, and nobody without the key can make one:
//!
//! - a **ticket**, `<user_id>.<number>.<tag>`: the buyer's number in the
//!   room (`e<n>`/`l<n>`, see `room_join.lua`); the same for every join;
//! - an **admission**, `<user_id>.<expires_ms>.<tag>`: the buyer may order
//!   until `expires_ms`.
//!
//! The tag is HMAC-SHA256 over the kind, the product id, the user id and the
//! number or expiry, cut to 128 bits: a ticket or an admission moved to
//! another user, another sale, or with another number or expiry does not
//! verify.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{ProductId, hex, unhex};

/// Bytes of the tag kept (128 bits).
const TAG_BYTES: usize = 16;

/// A sale's room key, ready to sign.
#[derive(Clone)]
pub struct RoomKey {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for RoomKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoomKey(..)")
    }
}

/// A buyer's number in a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Number {
    /// The n-th (from 1) to join before the start: placed by the draw.
    Early(u64),
    /// The n-th (from 1) to join after the start: placed after every early joiner.
    Late(u64),
}

impl Number {
    /// `e<n>` or `l<n>`, as `room_join.lua` writes it.
    pub fn parse(text: &str) -> Option<Self> {
        let (kind, n) = text.split_at_checked(1)?;
        let n: u64 = n.parse().ok().filter(|n| *n > 0)?;
        match kind {
            "e" => Some(Self::Early(n)),
            "l" => Some(Self::Late(n)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Early(n) => write!(f, "e{n}"),
            Self::Late(n) => write!(f, "l{n}"),
        }
    }
}

/// A verified ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub user_id: u64,
    pub number: Number,
}

/// Why an admission is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionRefused {
    /// Not one this sale's key signed (forged, changed, another sale's).
    Invalid,
    /// Another buyer's.
    OtherUser,
    Expired,
}

impl RoomKey {
    /// From the hex text kept in the sale's hash.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let bytes = unhex(hex)?;
        if bytes.len() < 16 {
            return None;
        }
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(&bytes).ok()?;
        Some(Self { mac })
    }

    /// A new random key, as hex (for `open_sale.lua`).
    pub fn generate() -> String {
        let mut bytes = [0u8; 32];
        if getrandom::fill(&mut bytes).is_err() {
            // No OS randomness: a key from the clock and the process still
            // differs per sale, but say so.
            tracing::error!("no OS randomness for a waiting room key");
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            bytes[..16].copy_from_slice(&nanos.to_le_bytes());
            bytes[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        }
        hex(&bytes)
    }

    fn tag(&self, kind: &str, product: &ProductId, user_id: u64, value: &str) -> [u8; TAG_BYTES] {
        let mut mac = self.mac.clone();
        for part in [kind, product.as_str(), &user_id.to_string(), value] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&full[..TAG_BYTES]);
        tag
    }

    fn verify(
        &self,
        kind: &str,
        product: &ProductId,
        user_id: u64,
        value: &str,
        tag: &str,
    ) -> bool {
        let Some(tag) = unhex(tag) else {
            return false;
        };
        let mut mac = self.mac.clone();
        for part in [kind, product.as_str(), &user_id.to_string(), value] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        // Constant time (the library's `verify_truncated_left`).
        tag.len() == TAG_BYTES && mac.verify_truncated_left(&tag).is_ok()
    }

    /// The ticket of `user_id` with `number` in this sale.
    pub fn ticket(&self, product: &ProductId, ticket: Ticket) -> String {
        let number = ticket.number.to_string();
        let tag = self.tag("ticket", product, ticket.user_id, &number);
        format!("{}.{number}.{}", ticket.user_id, hex(&tag))
    }

    /// The ticket in `text`, if this sale's key signed it.
    pub fn read_ticket(&self, product: &ProductId, text: &str) -> Option<Ticket> {
        let mut parts = text.splitn(3, '.');
        let user_id: u64 = parts.next()?.parse().ok()?;
        let number_text = parts.next()?;
        let number = Number::parse(number_text)?;
        let tag = parts.next()?;
        self.verify("ticket", product, user_id, number_text, tag)
            .then_some(Ticket { user_id, number })
    }

    /// An admission for `user_id` to order in this sale until `expires_ms`.
    pub fn admission(&self, product: &ProductId, user_id: u64, expires_ms: i64) -> String {
        let tag = self.tag("admission", product, user_id, &expires_ms.to_string());
        format!("{user_id}.{expires_ms}.{}", hex(&tag))
    }

    /// Whether `text` admits `user_id` to order in this sale at `now_ms`;
    /// its expiry (epoch ms) when it does.
    pub fn check_admission(
        &self,
        product: &ProductId,
        user_id: u64,
        text: &str,
        now_ms: i64,
    ) -> Result<i64, AdmissionRefused> {
        let mut parts = text.splitn(3, '.');
        let (Some(user), Some(expires), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(AdmissionRefused::Invalid);
        };
        let (Ok(holder), Ok(expires_ms)) = (user.parse::<u64>(), expires.parse::<i64>()) else {
            return Err(AdmissionRefused::Invalid);
        };
        if !self.verify("admission", product, holder, expires, tag) {
            return Err(AdmissionRefused::Invalid);
        }
        if holder != user_id {
            return Err(AdmissionRefused::OtherUser);
        }
        if now_ms >= expires_ms {
            return Err(AdmissionRefused::Expired);
        }
        Ok(expires_ms)
    }

    /// The join challenge of this sale for a time window (see
    /// [`super::pow`]): the same for every buyer, made by this key only.
    pub fn challenge(&self, product: &ProductId, window: i64) -> String {
        hex(&self.tag("challenge", product, 0, &window.to_string()))
    }

    /// Whether `text` is this sale's challenge for `window` (constant time).
    pub fn is_challenge(&self, product: &ProductId, window: i64, text: &str) -> bool {
        self.verify("challenge", product, 0, &window.to_string(), text)
    }

    /// 32 bytes only this sale's key can make: the seed of its draw.
    pub fn draw_seed(&self) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(b"draw\0");
        mac.finalize().into_bytes().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RoomKey {
        RoomKey::from_hex(&"ab".repeat(32)).unwrap()
    }

    fn sku(id: &str) -> ProductId {
        ProductId::parse(id).unwrap()
    }

    #[test]
    fn a_ticket_reads_back_only_for_its_sale_and_unchanged() {
        let (k, p) = (key(), sku("sku-1"));
        let t = Ticket {
            user_id: 42,
            number: Number::Early(7),
        };
        let text = k.ticket(&p, t);
        assert_eq!(k.ticket(&p, t), text, "the same ticket every time");
        assert_eq!(k.read_ticket(&p, &text), Some(t));
        assert_eq!(k.read_ticket(&sku("sku-2"), &text), None, "another sale");
        let other_key = RoomKey::from_hex(&RoomKey::generate()).unwrap();
        assert_eq!(other_key.read_ticket(&p, &text), None, "another key");
        for forged in [
            text.replacen("42.", "43.", 1),
            text.replacen(".e7.", ".e1.", 1),
            text.replacen(".e7.", ".l7.", 1),
            format!("{text}0"),
            "42.e7.00".into(),
            "".into(),
        ] {
            assert_eq!(k.read_ticket(&p, &forged), None, "{forged}");
        }
    }

    #[test]
    fn an_admission_admits_its_buyer_in_its_sale_until_it_expires() {
        let (k, p) = (key(), sku("sku-1"));
        let a = k.admission(&p, 42, 10_000);
        assert_eq!(k.check_admission(&p, 42, &a, 9_999), Ok(10_000));
        assert_eq!(
            k.check_admission(&p, 42, &a, 10_000),
            Err(AdmissionRefused::Expired)
        );
        assert_eq!(
            k.check_admission(&p, 43, &a, 0),
            Err(AdmissionRefused::OtherUser)
        );
        assert_eq!(
            k.check_admission(&sku("sku-2"), 42, &a, 0),
            Err(AdmissionRefused::Invalid)
        );
        let later = a.replacen(".10000.", ".99999.", 1);
        assert_eq!(
            k.check_admission(&p, 42, &later, 0),
            Err(AdmissionRefused::Invalid)
        );
        assert_eq!(
            k.check_admission(&p, 42, "junk", 0),
            Err(AdmissionRefused::Invalid)
        );
    }

    #[test]
    fn numbers_read_as_written() {
        for n in [Number::Early(1), Number::Late(123_456)] {
            assert_eq!(Number::parse(&n.to_string()), Some(n));
        }
        for bad in ["", "e", "e0", "x5", "l-1", "e1x"] {
            assert_eq!(Number::parse(bad), None, "{bad}");
        }
    }
}
