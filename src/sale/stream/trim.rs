//! Trimming a sale's stream: acked entries past their retention go, never
//! one that is pending or not yet delivered.

use std::time::Duration;

use redis::streams::{
    StreamInfoGroupsReply, StreamPendingReply, StreamTrimOptions, StreamTrimmingMode,
};
use redis::{AsyncCommands, RedisResult, aio::ConnectionLike};

use crate::sale::keys::{GROUP, SaleKeys};

/// A stream entry's id (`<ms>-<seq>`), ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EntryId {
    ms: u64,
    seq: u64,
}

impl EntryId {
    fn parse(id: &str) -> Option<Self> {
        let (ms, seq) = id.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The first id after this one.
    fn next(self) -> Self {
        Self {
            seq: self.seq.saturating_add(1),
            ..self
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// The lowest stream id to keep (`XTRIM MINID`): nothing pending, nothing
/// not yet delivered (above `delivered`), nothing younger than `retention`
/// by the Redis clock (`now_ms`).
fn trim_bound(
    delivered: EntryId,
    oldest_pending: Option<EntryId>,
    now_ms: u64,
    retention: Duration,
) -> EntryId {
    let kept = EntryId {
        ms: now_ms.saturating_sub(retention.as_millis() as u64),
        seq: 0,
    };
    let bound = delivered.next().min(kept);
    oldest_pending.map_or(bound, |oldest| bound.min(oldest))
}

/// Trims entries that are acknowledged AND older than `retention`; never an
/// entry that is pending or not yet delivered. Returns the entries removed.
pub(super) async fn trim(
    conn: &mut (impl ConnectionLike + Send + Sync),
    keys: &SaleKeys,
    retention: Duration,
) -> RedisResult<u64> {
    // Order matters: the group's last delivered id first, the pending list
    // second. An entry delivered between the two reads is newer than that id,
    // so it is above the bound either way.
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(&keys.orders).await?;
    let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
        return Ok(0);
    };
    let Some(delivered) = EntryId::parse(&group.last_delivered_id) else {
        return Ok(0);
    };
    let pending: StreamPendingReply = conn.xpending(&keys.orders, GROUP).await?;
    let (now_s, now_us): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let now_ms = now_s * 1000 + now_us / 1000;

    let oldest_pending = match &pending {
        StreamPendingReply::Data(p) => EntryId::parse(&p.start_id),
        _ => None,
    };
    let bound = trim_bound(delivered, oldest_pending, now_ms, retention);
    let opts = StreamTrimOptions::minid(StreamTrimmingMode::Exact, bound.to_string());
    conn.xtrim_options(&keys.orders, &opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn id(ms: u64, seq: u64) -> EntryId {
        EntryId { ms, seq }
    }

    #[test]
    fn the_trim_keeps_everything_pending_undelivered_or_recent() {
        let now = 10 * 3_600_000;
        // All delivered and acked, long ago: up to the last delivered one.
        assert_eq!(trim_bound(id(1000, 4), None, now, HOUR), id(1000, 5));
        // A pending entry holds everything from it on.
        let pending = Some(id(900, 2));
        assert_eq!(trim_bound(id(1000, 4), pending, now, HOUR), id(900, 2));
        // Retention holds the last hour, acked or not.
        let recent = now - 60_000;
        assert_eq!(
            trim_bound(id(recent, 0), None, now, HOUR),
            id(now - 3_600_000, 0)
        );
        // A clock before the retention trims nothing rather than wrapping.
        assert_eq!(trim_bound(id(5, 0), None, 1000, HOUR), id(0, 0));
        assert_eq!(
            EntryId::parse("1700000000000-7"),
            Some(id(1_700_000_000_000, 7))
        );
        assert_eq!(EntryId::parse("nonsense"), None);
        assert_eq!(id(1000, 5).to_string(), "1000-5");
    }
}
