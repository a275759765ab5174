//! Verified tokens, remembered by their SHA-256 until they expire: a
//! buyer's repeated requests cost one hash and one lookup.
//!
//! The map is `quick_cache`'s (sharded, bounded, S3-FIFO eviction): a full
//! cache forgets the tokens least likely to come back, so a flood of
//! one-off tokens costs verifying, never the regular buyers' entries, and
//! never a scan under a lock.

use quick_cache::UnitWeighter;
use quick_cache::sync::{Cache, DefaultLifecycle};

use crate::domain::UserId;

/// A token's SHA-256 → (user id, `exp` in epoch seconds).
type Map = Cache<[u8; 32], (UserId, u64), UnitWeighter, foldhash::fast::RandomState>;

/// Verified tokens by SHA-256: at most `entries` of them (0: none).
pub(super) struct TokenCache(Option<Map>);

impl TokenCache {
    pub(super) fn new(entries: usize) -> Self {
        Self((entries > 0).then(|| {
            Cache::with(
                entries,
                entries as u64,
                UnitWeighter,
                foldhash::fast::RandomState::default(),
                DefaultLifecycle::default(),
            )
        }))
    }

    pub(super) fn get(&self, digest: &[u8; 32], now_secs: u64) -> Option<UserId> {
        // Valid until its `exp` (the leeway is the verifier's to grant).
        let (user, exp) = self.0.as_ref()?.get(digest)?;
        (exp > now_secs).then_some(user)
    }

    pub(super) fn insert(&self, digest: [u8; 32], user: UserId, exp: u64, now_secs: u64) {
        if let Some(map) = &self.0
            && exp > now_secs
        {
            map.insert(digest, (user, exp));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, Map::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(i: u32) -> [u8; 32] {
        let mut d = [0; 32];
        d[..4].copy_from_slice(&i.to_le_bytes());
        d
    }

    #[test]
    fn a_token_is_remembered_until_it_expires() {
        let uid = |n| UserId::new(n).unwrap();
        let cache = TokenCache::new(16);
        cache.insert(digest(0), uid(7), 100, 50);
        assert_eq!(cache.get(&digest(0), 99), Some(uid(7)));
        assert_eq!(cache.get(&digest(0), 100), None, "expired");
        cache.insert(digest(1), uid(8), 100, 100);
        assert_eq!(cache.get(&digest(1), 99), None, "expired when offered");
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_its_regulars() {
        let uid = |n| UserId::new(n).unwrap();
        let cache = TokenCache::new(100);
        // A regular buyer, seen again and again...
        cache.insert(digest(0), uid(1), 1_000, 0);
        for i in 1..10_000 {
            assert_eq!(cache.get(&digest(0), 1), Some(uid(1)), "after {i} others");
            // ...among a flood of one-off tokens.
            cache.insert(digest(i), uid(2), 1_000, 0);
        }
        assert!(cache.len() <= 110, "{} entries", cache.len());
    }

    #[test]
    fn size_zero_remembers_nothing() {
        let cache = TokenCache::new(0);
        cache.insert(digest(0), UserId::new(1).unwrap(), 100, 0);
        assert_eq!(cache.get(&digest(0), 1), None);
        assert_eq!(cache.len(), 0);
    }
}
