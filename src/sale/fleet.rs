//! The fleet: every `serve` and `worker` process of the deployment says
//! who it is and which release it runs, every few seconds, in one Redis
//! hash (`<prefix>:fleet`, one field per process), so that the dashboard
//! can list them, mid-upgrade above all (docs/operations.md "Upgrading").
//! A process that stops cleanly leaves the roll; one that died is shown as
//! gone once it missed a few beats, and forgotten after [`FORGET_AFTER`].
//! Nothing here is on the order path: one `HSET` per process per beat.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::core::Core;
use super::error::SaleError;
use super::keys;
use crate::domain::{Chain, now_ms, release};

/// How often a process says it is there.
pub const BEAT: Duration = Duration::from_secs(5);
/// A process not heard from for this long is shown as gone.
pub const GONE_AFTER: Duration = Duration::from_secs(3 * BEAT.as_secs());
/// A process not heard from for this long leaves the roll (whoever reads it
/// next removes it).
pub const FORGET_AFTER: Duration = Duration::from_secs(10 * 60);
/// Most processes listed (a roll grown past it is cut, oldest beats first).
pub const MAX_LISTED: usize = 200;

/// What a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `flashsale serve` without workers.
    Api,
    /// `flashsale serve` with the stream workers in the same process.
    ApiAndWorkers,
    /// `flashsale worker`.
    Worker,
}

/// One process on the roll, as it wrote itself (JSON: fields may be added,
/// never renamed; a reader ignores the fields it does not know).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Unique per process (`<host>-<pid>-<random>`): the hash's field.
    pub name: String,
    pub role: Role,
    pub version: String,
    pub commit: String,
    pub host: String,
    pub pid: u32,
    /// When the process started, and when it last said it was there (ms
    /// since the epoch, by its own clock).
    pub started_ms: i64,
    pub seen_ms: i64,
}

impl Member {
    /// This process, as `role`, with this build's release.
    pub fn this_process(role: Role) -> Self {
        let host = hostname();
        let pid = std::process::id();
        let mut bytes = [0u8; 3];
        let _ = getrandom::fill(&mut bytes);
        let now = now_ms();
        Self {
            name: format!("{host}-{pid}-{}", crate::domain::hex(&bytes)),
            role,
            version: release::VERSION.to_owned(),
            commit: release::COMMIT.to_owned(),
            host,
            pid,
            started_ms: now,
            seen_ms: now,
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The roll of the deployment's processes.
#[derive(Clone)]
pub struct Fleet {
    core: Arc<Core>,
}

impl Fleet {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    fn key(&self) -> String {
        keys::fleet(&self.core.prefix)
    }

    /// Writes `member` on the roll (seen now).
    pub async fn beat(&self, member: &Member) -> Result<(), SaleError> {
        let key = self.key();
        let seen = Member {
            seen_ms: now_ms(),
            ..member.clone()
        };
        let json =
            serde_json::to_string(&seen).unwrap_or_else(|_| unreachable!("plain data serializes"));
        let name = seen.name;
        self.core
            .call(|mut c| async move { c.hset::<_, _, _, ()>(&key, &name, &json).await })
            .await
    }

    /// Takes `name` off the roll (a clean stop).
    pub async fn leave(&self, name: &str) -> Result<(), SaleError> {
        let (key, name) = (self.key(), name.to_owned());
        self.core
            .call(|mut c| async move { c.hdel::<_, _, ()>(&key, &name).await })
            .await
    }

    /// The processes on the roll, newest beat first; those not heard from
    /// for [`FORGET_AFTER`] (and any field that is not a member) are
    /// removed as they are read.
    pub async fn members(&self) -> Result<Vec<Member>, SaleError> {
        let key = self.key();
        let all: Vec<(String, String)> = self
            .core
            .call({
                let key = key.clone();
                |mut c| async move { c.hgetall(&key).await }
            })
            .await?;
        let forget_before = now_ms() - FORGET_AFTER.as_millis() as i64;
        let mut members = Vec::with_capacity(all.len());
        let mut forgotten = Vec::new();
        for (name, json) in all {
            match serde_json::from_str::<Member>(&json) {
                Ok(m) if m.seen_ms >= forget_before => members.push(m),
                // Gone long ago, or written by something that is not a
                // release of this service: off the roll.
                _ => forgotten.push(name),
            }
        }
        if !forgotten.is_empty() {
            self.core
                .call(|mut c| async move { c.hdel::<_, _, ()>(&key, &forgotten).await })
                .await?;
        }
        members.sort_by(|a, b| b.seen_ms.cmp(&a.seen_ms).then(a.name.cmp(&b.name)));
        members.truncate(MAX_LISTED);
        Ok(members)
    }

    /// Keeps `member` on the roll until `stop`, then takes it off. A beat
    /// that fails is retried at the next one, and logged at debug only: a
    /// Redis that does not answer is reported where it matters (orders,
    /// readiness), and the dashboard shows the process as gone.
    pub async fn attend(self, member: Member, stop: CancellationToken) {
        loop {
            if let Err(e) = self.beat(&member).await {
                tracing::debug!(error = %Chain(&e), "could not write this process on the fleet's roll; the next beat retries");
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(BEAT) => {}
            }
        }
        if let Err(e) = self.leave(&member.name).await {
            tracing::warn!(error = %Chain(&e), "could not take this process off the fleet's roll (it shows as gone once its beats stop)");
        }
    }
}
