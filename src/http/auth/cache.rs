//! Verified tokens, remembered by their SHA-256 until they expire: a
//! buyer's repeated requests cost one hash and one lookup.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::domain::UserId;

/// Verified tokens by SHA-256: user and expiry. Sharded so that concurrent
/// requests rarely meet on a lock; bounded, expired entries dropped when full.
pub(super) struct TokenCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

const SHARDS: usize = 16;

/// A token's SHA-256 → (user id, `exp` in epoch seconds).
type Shard = HashMap<[u8; 32], (UserId, u64)>;

impl TokenCache {
    pub(super) fn new(entries: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: entries.div_ceil(SHARDS),
        }
    }

    fn shard(&self, digest: &[u8; 32]) -> &Mutex<Shard> {
        &self.shards[usize::from(digest[0]) % SHARDS]
    }

    pub(super) fn get(&self, digest: &[u8; 32], now_secs: u64) -> Option<UserId> {
        if self.per_shard == 0 {
            return None;
        }
        let shard = self.shard(digest).lock().unwrap_or_else(|p| p.into_inner());
        // Valid until its `exp` (the leeway is the verifier's to grant).
        shard
            .get(digest)
            .filter(|(_, exp)| *exp > now_secs)
            .map(|(user, _)| *user)
    }

    pub(super) fn insert(&self, digest: [u8; 32], user: UserId, exp: u64, now_secs: u64) {
        if self.per_shard == 0 || exp <= now_secs {
            return;
        }
        let mut shard = self
            .shard(&digest)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if shard.len() >= self.per_shard {
            shard.retain(|_, (_, e)| *e > now_secs);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(digest, (user, exp));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_forgets_expired_tokens() {
        let uid = |n| UserId::new(n).unwrap();
        let cache = TokenCache::new(SHARDS);
        let d = |i: u8| {
            let mut d = [0; 32];
            d[0] = i;
            d[1] = i;
            d
        };
        cache.insert(d(0), uid(7), 100, 50);
        assert_eq!(cache.get(&d(0), 99), Some(uid(7)));
        assert_eq!(cache.get(&d(0), 100), None, "expired");
        // Shard 0 holds one entry: a second one waits for the first to expire.
        cache.insert(d(16), uid(8), 100, 50);
        assert_eq!(cache.get(&d(16), 60), None);
        cache.insert(d(16), uid(8), 200, 150);
        assert_eq!(cache.get(&d(16), 160), Some(uid(8)));
        assert_eq!(cache.len(), 1);
    }
}
