//! Which sales are quiet, so that the per-sale passes (the books check,
//! cancels asked while pending) follow orders rather than the number of
//! open sales: a sale whose drains sleep (see `sale::bells`) and were not
//! awake since a pass last looked at it has nothing new for that pass; it is
//! looked at again only every [`QUIET_PASSES`] passes, in case something changed
//! that no drain saw (a hand edit, a cancel request that raced its order's
//! persisting).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ProductId;

/// A pass looks at a sale that stayed quiet since its last look every this
/// many passes (every 5 minutes for a pass every 5 s).
pub const QUIET_PASSES: u32 = 60;

/// The drains' sleep, as this process's passes see it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Activity {
    /// Product -> since when its drain sleeps (absent: awake, or unknown).
    asleep: Arc<Mutex<HashMap<ProductId, Instant>>>,
}

impl Activity {
    pub(super) fn sleeps(&self, product: &ProductId) {
        self.map().insert(product.clone(), Instant::now());
    }

    pub(super) fn wakes(&self, product: &ProductId) {
        self.map().remove(product);
    }

    /// Sales whose drains sleep now.
    pub fn sleeping(&self) -> usize {
        self.map().len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ProductId, Instant>> {
        self.asleep.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One pass's memory of when it last looked at each sale.
#[derive(Debug)]
pub struct Looks {
    last: HashMap<ProductId, Instant>,
    /// How often a quiet sale is looked at.
    quiet: Duration,
}

impl Looks {
    /// For a pass every `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            last: HashMap::new(),
            quiet: every * QUIET_PASSES,
        }
    }

    /// How often a quiet sale is looked at.
    pub fn quiet(&self) -> Duration {
        self.quiet
    }

    /// Of `open`, the sales due a look now (each then counts as looked at):
    /// those awake, asleep since the last look, never looked at, or last
    /// looked at [`Self::quiet`] ago. Sales no longer open are forgotten.
    pub fn due(&mut self, activity: &Activity, open: &[ProductId]) -> Vec<ProductId> {
        let now = Instant::now();
        let asleep = activity.map();
        let due: Vec<ProductId> = open
            .iter()
            .filter(|p| match (asleep.get(*p), self.last.get(*p)) {
                (Some(since), Some(looked)) => {
                    since >= looked || now.duration_since(*looked) >= self.quiet
                }
                _ => true,
            })
            .cloned()
            .collect();
        drop(asleep);
        let open: std::collections::HashSet<&ProductId> = open.iter().collect();
        self.last.retain(|p, _| open.contains(p));
        for p in &due {
            self.last.insert(p.clone(), now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(s: &str) -> ProductId {
        ProductId::parse(s).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_sale_is_looked_at_every_five_minutes_an_active_one_every_pass() {
        let activity = Activity::default();
        let mut looks = Looks::new(Duration::from_secs(5));
        let (busy, quiet) = (pid("busy"), pid("quiet"));
        let open = vec![busy.clone(), quiet.clone()];
        assert_eq!(looks.due(&activity, &open), open, "first looks: all");
        activity.sleeps(&quiet);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            looks.due(&activity, &open),
            open,
            "asleep since the last look: one more look"
        );
        for _ in 0..58 {
            tokio::time::advance(Duration::from_secs(5)).await;
            assert_eq!(looks.due(&activity, &open), vec![busy.clone()]);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(looks.due(&activity, &open), open, "five minutes on: a look");
        activity.wakes(&quiet);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(looks.due(&activity, &open), open, "awake: every pass");
    }
}
