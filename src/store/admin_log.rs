//! `tb_admin_log` ([`AdminLog`]): every admin action, through any door, and
//! every failed admin authentication, one row each; and
//! `tb_dashboard_session_ended`: the dashboard sessions a logout ended
//! before their expiry.

use super::db::Db;
use super::error::StoreError;
use crate::domain::now_ms;

/// One entry of the admin log.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct AdminEntry {
    /// Its place in the log (given by the store; 0 before).
    pub id: i64,
    /// When (epoch ms).
    pub at: i64,
    /// What: `product.create`, `sale.open`, `sale.close`, `room.bounds`,
    /// `events.replay`, `sale.recover`, `dashboard.login`,
    /// `dashboard.logout`, `auth.failed`, ...
    pub action: String,
    pub product_id: Option<String>,
    /// Who: `token:<fingerprint>` (the SHA-256 of the credential
    /// presented, cut to 12 hex digits), `session:<id>` (a dashboard
    /// session), `cli:<user>@<host>`, `none`.
    pub actor: String,
    /// From which address (the client's, as the limits see it).
    pub address: Option<String>,
    /// The answer's HTTP status (0 for the command line: 200 done).
    pub status: i32,
    /// What was asked (the request's JSON body).
    pub asked: Option<String>,
    /// The values before the action, and after (JSON).
    #[sqlx(rename = "before_value")]
    pub before: Option<String>,
    #[sqlx(rename = "after_value")]
    pub after: Option<String>,
}

impl AdminEntry {
    /// An entry of `action` by `actor`, answered `status`, now; the rest
    /// (which sale, from where, what was asked, before and after) unknown
    /// until set.
    pub fn new(action: impl Into<String>, actor: String, status: i32) -> Self {
        Self {
            id: 0,
            at: now_ms(),
            action: action.into(),
            product_id: None,
            actor,
            address: None,
            status,
            asked: None,
            before: None,
            after: None,
        }
    }
}

/// The admin log's handle.
#[derive(Clone)]
pub struct AdminLog {
    db: Db,
}

impl AdminLog {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Appends `entry` (its `id` is ignored); its id.
    pub async fn record(&self, entry: &AdminEntry) -> Result<i64, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "INSERT INTO tb_admin_log (at, action, product_id, actor, address, status, \
                     asked, before_value, after_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    entry.at,
                    entry.action,
                    entry.product_id,
                    entry.actor,
                    entry.address,
                    entry.status,
                    entry.asked,
                    entry.before,
                    entry.after,
                )
                .execute(pool)
                .await
                .map(|r| r.last_insert_id() as i64)
            })
            .await
    }

    /// The newest entries (`sale`'s only, when given), older than `before`
    /// (an id) if given; at most `limit`, newest first.
    pub async fn page(
        &self,
        sale: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AdminEntry>, StoreError> {
        let before = before.unwrap_or(i64::MAX);
        self.db
            .call(|pool| async move {
                match sale {
                    Some(sale) => {
                        sqlx::query_as!(
                            AdminEntry,
                            "SELECT id, at, action, product_id, actor, address, \
                             status AS `status: i32`, asked, before_value AS `before`, \
                             after_value AS `after` FROM tb_admin_log \
                             WHERE product_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
                            sale,
                            before,
                            limit,
                        )
                        .fetch_all(pool)
                        .await
                    }
                    None => {
                        sqlx::query_as!(
                            AdminEntry,
                            "SELECT id, at, action, product_id, actor, address, \
                             status AS `status: i32`, asked, before_value AS `before`, \
                             after_value AS `after` FROM tb_admin_log \
                             WHERE id < ? ORDER BY id DESC LIMIT ?",
                            before,
                            limit,
                        )
                        .fetch_all(pool)
                        .await
                    }
                }
            })
            .await
    }

    /// Ends dashboard session `nonce` (which would expire at `expires`,
    /// epoch ms) for every instance; forgets sessions past their expiry.
    pub async fn end_session(&self, nonce: &str, expires: i64) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                let now = now_ms();
                sqlx::query!(
                    "DELETE FROM tb_dashboard_session_ended WHERE expires < ?",
                    now
                )
                .execute(pool)
                .await?;
                sqlx::query!(
                    "INSERT IGNORE INTO tb_dashboard_session_ended (nonce, expires) VALUES (?, ?)",
                    nonce,
                    expires
                )
                .execute(pool)
                .await
                .map(|_| ())
            })
            .await
    }

    /// Whether dashboard session `nonce` was ended by a logout.
    pub async fn session_ended(&self, nonce: &str) -> Result<bool, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_scalar!(
                    "SELECT COUNT(*) FROM tb_dashboard_session_ended WHERE nonce = ?",
                    nonce
                )
                .fetch_one(pool)
                .await
                .map(|n| n > 0)
            })
            .await
    }
}
