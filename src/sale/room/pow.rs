//! An optional cost to join a sale's room (`waiting_room.join_difficulty`,
//! in bits): a proof of work, as Queue-it asks one before a place in line.
//!
//! The challenge is the sale's, per minute (an HMAC of the window under the
//! room's key, [`RoomKey::challenge`]): the same for every buyer, served
//! from memory (`GET /api/sales/{id}/challenge`). A buyer finds a nonce
//! such that `SHA-256("<challenge>:<user_id>:<nonce>")` starts with
//! `difficulty` zero bits (about 2^difficulty hashes) and joins with the
//! header `Join-Proof: <challenge>.<nonce>`. The proof names its buyer (it
//! does not work for another) and its minute (it is accepted in that
//! minute and the next); it is checked with one HMAC and one SHA-256 in the
//! instance, no Redis call, so a refused join costs Redis nothing.
//! Joining is idempotent anyway: a proof used twice gains nothing.

use sha2::{Digest, Sha256};

use super::pass::RoomKey;
use crate::domain::ProductId;

/// A challenge's time window.
pub const WINDOW_MS: i64 = 60_000;
/// The highest difficulty a room takes (about 16 million hashes).
pub const MAX_DIFFICULTY: u8 = 24;
/// The longest nonce taken, in characters.
const MAX_NONCE: usize = 32;

/// Why a join's proof is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofRefused {
    /// No `Join-Proof` header.
    Missing,
    /// Not `<challenge>.<nonce>`, or the challenge is not this sale's for
    /// this minute or the last one.
    Stale,
    /// The hash does not start with enough zero bits (or the proof is
    /// another buyer's).
    TooEasy,
}

/// The window `now_ms` falls in.
pub fn window_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(WINDOW_MS)
}

/// The challenge now, and until when a proof of it is accepted (epoch ms).
pub fn challenge(key: &RoomKey, product: &ProductId, now_ms: i64) -> (String, i64) {
    let window = window_of(now_ms);
    (
        key.challenge(product, window),
        (window + 2).saturating_mul(WINDOW_MS),
    )
}

/// Checks `proof` (`<challenge>.<nonce>`) of `user_id` at `difficulty` bits.
pub fn check(
    key: &RoomKey,
    product: &ProductId,
    user_id: u64,
    difficulty: u8,
    proof: Option<&str>,
    now_ms: i64,
) -> Result<(), ProofRefused> {
    if difficulty == 0 {
        return Ok(());
    }
    let proof = proof.ok_or(ProofRefused::Missing)?;
    let (challenge, nonce) = proof.split_once('.').ok_or(ProofRefused::Stale)?;
    if nonce.is_empty()
        || nonce.len() > MAX_NONCE
        || !nonce.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(ProofRefused::Stale);
    }
    let window = window_of(now_ms);
    if !(key.is_challenge(product, window, challenge)
        || key.is_challenge(product, window - 1, challenge))
    {
        return Err(ProofRefused::Stale);
    }
    if !holds(challenge, user_id, nonce, difficulty) {
        return Err(ProofRefused::TooEasy);
    }
    Ok(())
}

/// Whether `nonce` solves `challenge` for `user_id` at `difficulty` bits
/// (the work alone; [`check`] also checks the challenge).
pub fn holds(challenge: &str, user_id: u64, nonce: &str, difficulty: u8) -> bool {
    zero_bits(&digest(challenge, user_id, nonce)) >= u32::from(difficulty)
}

/// Finds a nonce for `challenge` and `user_id` at `difficulty` bits (what
/// a client does; for the tests, the benchmark and `flashsale` clients).
pub fn solve(challenge: &str, user_id: u64, difficulty: u8) -> String {
    let mut n: u64 = 0;
    loop {
        let nonce = n.to_string();
        if holds(challenge, user_id, &nonce, difficulty) {
            return nonce;
        }
        n += 1;
    }
}

fn digest(challenge: &str, user_id: u64, nonce: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(challenge.as_bytes());
    h.update(b":");
    h.update(user_id.to_string().as_bytes());
    h.update(b":");
    h.update(nonce.as_bytes());
    h.finalize().into()
}

/// Leading zero bits of `hash`.
fn zero_bits(hash: &[u8]) -> u32 {
    let mut bits = 0;
    for b in hash {
        if *b == 0 {
            bits += 8;
        } else {
            return bits + b.leading_zeros();
        }
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RoomKey {
        RoomKey::from_hex(&"5a".repeat(32)).expect("hex")
    }

    #[test]
    fn zero_bits_count_from_the_left() {
        assert_eq!(zero_bits(&[0xff]), 0);
        assert_eq!(zero_bits(&[0x00, 0x10]), 11);
        assert_eq!(zero_bits(&[0, 0]), 16);
    }

    #[test]
    fn a_solved_challenge_joins_only_its_buyer_in_its_minutes() {
        let (key, p) = (key(), ProductId::parse("sku-1").expect("id"));
        let now = 1_800_000_000_000;
        let (c, until) = challenge(&key, &p, now);
        assert_eq!(until, (window_of(now) + 2) * WINDOW_MS);
        let nonce = solve(&c, 7, 12);
        let proof = format!("{c}.{nonce}");
        assert_eq!(check(&key, &p, 7, 12, Some(&proof), now), Ok(()));
        // Accepted in the next minute too, not after.
        assert_eq!(
            check(&key, &p, 7, 12, Some(&proof), now + WINDOW_MS),
            Ok(())
        );
        assert_eq!(
            check(&key, &p, 7, 12, Some(&proof), now + 2 * WINDOW_MS),
            Err(ProofRefused::Stale)
        );
        // Another buyer, a harder difficulty (most likely), another sale.
        let other = (1..=50u64)
            .filter(|u| check(&key, &p, *u + 7, 12, Some(&proof), now).is_ok())
            .count();
        assert!(other <= 1, "{other} other buyers took the proof");
        assert_eq!(
            check(
                &key,
                &ProductId::parse("sku-2").expect("id"),
                7,
                12,
                Some(&proof),
                now
            ),
            Err(ProofRefused::Stale)
        );
        assert_eq!(
            check(&key, &p, 7, 12, None, now),
            Err(ProofRefused::Missing)
        );
        assert_eq!(check(&key, &p, 7, 0, None, now), Ok(()), "no difficulty");
        for bad in [
            "",
            ".",
            "x.1",
            &format!("{c}."),
            &format!("{c}.1 2"),
            &format!("{c}.{}", "9".repeat(33)),
        ] {
            assert_eq!(
                check(&key, &p, 7, 12, Some(bad), now),
                Err(ProofRefused::Stale),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_proof_below_the_difficulty_is_refused() {
        let (key, p) = (key(), ProductId::parse("sku-1").expect("id"));
        let now = 1_800_000_000_000;
        let (c, _) = challenge(&key, &p, now);
        // A nonce whose hash has exactly 0 leading zero bits.
        let weak = (0u64..)
            .map(|n| n.to_string())
            .find(|n| zero_bits(&digest(&c, 7, n)) == 0)
            .expect("a weak nonce");
        assert_eq!(
            check(&key, &p, 7, 1, Some(&format!("{c}.{weak}")), now),
            Err(ProofRefused::TooEasy)
        );
    }
}
