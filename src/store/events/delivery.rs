//! Pushing the outbox to the shop's endpoints, as the deliverer records it
//! (`tb_event_delivery`, `tb_event_dead`): who holds an endpoint's lease,
//! how far it got, the events that failed every attempt (dead letters) and
//! those an operator asked to replay.

use std::collections::HashSet;

use sqlx::{MySql, QueryBuilder};

use super::feed::Events;
use super::stored::{EVENTS_PER_ROW, EventRow, STORED, Stored, expand};
use crate::store::db::Db;
use crate::store::error::StoreError;

/// An endpoint's mark moved past event `id` by its lease's owner, its
/// failures forgotten.
macro_rules! advance {
    ($id:expr, $endpoint:expr, $owner:expr) => {
        sqlx::query!(
            "UPDATE tb_event_delivery SET delivered_up_to = ?, attempts = 0, \
             next_attempt = 0, last_error = NULL \
             WHERE endpoint = ? AND lease_owner = ? AND delivered_up_to < ?",
            $id,
            $endpoint,
            $owner,
            $id,
        )
    };
}

/// Where delivery to an endpoint stands, for the process that holds its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Every event up to this id is delivered (or dead-lettered).
    pub delivered_up_to: i64,
    /// Failed attempts of the next event.
    pub attempts: u32,
    /// Not before this (epoch ms): the back-off after a failure.
    pub next_attempt: i64,
}

/// A dead-lettered event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct DeadEvent {
    pub endpoint: String,
    pub event_id: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub dead_at: i64,
    pub replay: bool,
}

fn clip(error: &str) -> &str {
    match error.char_indices().nth(500) {
        Some((i, _)) => &error[..i],
        None => error,
    }
}

/// Takes or renews the lease on `endpoint`'s row for `owner` when it is
/// free, expired or `owner`'s own; false otherwise, or when there is no row.
async fn take_lease(
    tx: &mut sqlx::Transaction<'_, MySql>,
    endpoint: &str,
    owner: &str,
    now: i64,
    until: i64,
) -> Result<bool, sqlx::Error> {
    let taken = sqlx::query!(
        "UPDATE tb_event_delivery SET lease_owner = ?, lease_until = ? \
         WHERE endpoint = ? AND (lease_owner = ? OR lease_until < ? OR lease_owner IS NULL)",
        owner,
        until,
        endpoint,
        owner,
        now,
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(taken == 1)
}

/// The deliveries' handle.
#[derive(Clone)]
pub struct Deliveries {
    db: Db,
    events: Events,
}

impl Deliveries {
    pub(crate) fn new(db: Db) -> Self {
        Self {
            events: Events::new(db.clone()),
            db,
        }
    }

    /// Takes (or renews) the lease on delivery to `endpoint` for `owner`
    /// until `until` (epoch ms); `None` while another process holds it.
    pub async fn lease_delivery(
        &self,
        endpoint: &str,
        owner: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<Delivery>, StoreError> {
        self.db
            .transaction(|tx| {
                Box::pin(async move {
                    // The UPDATE first, and the row made only when it is missing
                    // (once per endpoint): an INSERT IGNORE of a row that exists
                    // takes a shared lock, and two processes each holding one
                    // while asking for the exclusive lock is a deadlock (the
                    // lease holder's cursor write was its victim).
                    let mut taken = take_lease(tx, endpoint, owner, now, until).await?;
                    if !taken {
                        let made = sqlx::query!(
                            "INSERT IGNORE INTO tb_event_delivery (endpoint) VALUES (?)",
                            endpoint,
                        )
                        .execute(&mut **tx)
                        .await?
                        .rows_affected();
                        if made == 1 {
                            taken = take_lease(tx, endpoint, owner, now, until).await?;
                        }
                    }
                    if !taken {
                        return Ok(None);
                    }
                    let row = sqlx::query!(
                        "SELECT delivered_up_to, attempts, next_attempt FROM tb_event_delivery \
                         WHERE endpoint = ?",
                        endpoint,
                    )
                    .fetch_one(&mut **tx)
                    .await?;
                    Ok(Some(Delivery {
                        delivered_up_to: row.delivered_up_to,
                        attempts: row.attempts.max(0) as u32,
                        next_attempt: row.next_attempt,
                    }))
                })
            })
            .await
    }

    /// Event `id` was delivered: the cursor moves on (only for the lease's
    /// holder, and only forward).
    pub async fn delivered(
        &self,
        endpoint: &str,
        owner: &str,
        id: i64,
    ) -> Result<bool, StoreError> {
        let moved = self
            .db
            .call(|pool| advance!(id, endpoint, owner).execute(pool))
            .await?
            .rows_affected();
        Ok(moved == 1)
    }

    /// The next event's delivery failed: its attempts, when to try again,
    /// and why; `acked`: the last event delivered before it this pass.
    pub async fn delivery_failed(
        &self,
        endpoint: &str,
        owner: &str,
        acked: Option<i64>,
        attempts: u32,
        next_attempt: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        self.db
            .call(|pool| {
                sqlx::query!(
                    "UPDATE tb_event_delivery SET attempts = ?, next_attempt = ?, last_error = ?, \
                     delivered_up_to = GREATEST(delivered_up_to, COALESCE(?, 0)) \
                     WHERE endpoint = ? AND lease_owner = ?",
                    attempts as i32,
                    next_attempt,
                    clip(error),
                    acked,
                    endpoint,
                    owner,
                )
                .execute(pool)
            })
            .await
            .map(drop)
    }

    /// Event `id` exhausted its attempts: into the dead letters, and the
    /// cursor moves past it, in one transaction.
    pub async fn dead_letter_event(
        &self,
        endpoint: &str,
        owner: &str,
        id: i64,
        attempts: u32,
        error: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.db.transaction(|tx| {
            Box::pin(async move {
                let moved = advance!(id, endpoint, owner)
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                if moved == 1 {
                    sqlx::query!(
                        "INSERT IGNORE INTO tb_event_dead \
                         (endpoint, event_id, attempts, last_error, dead_at) VALUES (?, ?, ?, ?, ?)",
                        endpoint,
                        id,
                        attempts as i32,
                        clip(error),
                        now,
                    )
                    .execute(&mut **tx)
                    .await?;
                }
                Ok(())
            })
        })
        .await
    }

    /// The dead letters, oldest first (at most 1,000).
    pub async fn dead_events(&self) -> Result<Vec<DeadEvent>, StoreError> {
        self.db
            .call(|pool| {
                sqlx::query_as!(
                    DeadEvent,
                    "SELECT endpoint, event_id, attempts, last_error, dead_at, \
                     replay AS `replay: bool` FROM tb_event_dead \
                     ORDER BY event_id, endpoint LIMIT 1000",
                )
                .fetch_all(pool)
            })
            .await
    }

    /// Asks for dead letters to be delivered again (all, or one event's):
    /// the delivery loop tries each once per pass until it goes through.
    /// Returns how many were asked.
    pub async fn replay_dead_events(&self, event_id: Option<i64>) -> Result<u64, StoreError> {
        self.db
            .call(|pool| {
                sqlx::query!(
                    "UPDATE tb_event_dead SET replay = 1 WHERE (? IS NULL OR event_id = ?)",
                    event_id,
                    event_id,
                )
                .execute(pool)
            })
            .await
            .map(|r| r.rows_affected())
    }

    /// The dead letters asked to be replayed, with their events.
    pub async fn replays(&self, endpoint: &str, limit: u32) -> Result<Vec<EventRow>, StoreError> {
        let wanted: Vec<i64> = self
            .db
            .call(|pool| {
                sqlx::query_scalar!(
                    "SELECT event_id FROM tb_event_dead WHERE endpoint = ? AND replay = 1 \
                     ORDER BY event_id LIMIT ?",
                    endpoint,
                    limit,
                )
                .fetch_all(pool)
            })
            .await?;
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Stored> = self
            .db
            .call(|pool| {
                // A runtime query: its `IN` list is as long as `wanted`.
                let mut q = QueryBuilder::<MySql>::new(format!("{STORED} WHERE id IN ("));
                let mut ids = q.separated(", ");
                for id in &wanted {
                    ids.push_bind(id.div_euclid(EVENTS_PER_ROW));
                }
                q.push(") ORDER BY id");
                async move { q.build_query_as().fetch_all(pool).await }
            })
            .await?;
        let wanted: HashSet<i64> = wanted.iter().copied().collect();
        let bare = expand(rows)
            .into_iter()
            .filter(|e| wanted.contains(&e.id))
            .collect();
        self.events.with_details(bare).await
    }

    /// A replayed dead letter went through (`true`: gone) or failed again.
    pub async fn replayed(
        &self,
        endpoint: &str,
        event_id: i64,
        ok: bool,
        error: &str,
    ) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                match ok {
                    true => {
                        sqlx::query!(
                            "DELETE FROM tb_event_dead WHERE endpoint = ? AND event_id = ?",
                            endpoint,
                            event_id,
                        )
                        .execute(pool)
                        .await
                    }
                    false => {
                        sqlx::query!(
                            "UPDATE tb_event_dead SET replay = 0, attempts = attempts + 1, \
                         last_error = ? WHERE endpoint = ? AND event_id = ?",
                            clip(error),
                            endpoint,
                            event_id,
                        )
                        .execute(pool)
                        .await
                    }
                }
            })
            .await
            .map(drop)
    }

    /// How many dead letters wait (all endpoints).
    pub async fn dead_event_count(&self) -> Result<i64, StoreError> {
        self.db
            .call(|pool| {
                sqlx::query_scalar!("SELECT COUNT(*) AS `dead!: i64` FROM tb_event_dead")
                    .fetch_one(pool)
            })
            .await
    }
}
