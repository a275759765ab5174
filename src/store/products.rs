//! `tb_product`: the products (sales) and their MySQL-side stock.

use rust_decimal::Decimal;

use super::db::Db;
use super::error::StoreError;
use super::events::{self, EventKind};
use crate::domain::now_ms;
use crate::domain::{ProductId, RoomBounds, WaitingRoom};

/// A product row.
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    pub product_id: String,
    pub title: String,
    pub price: Decimal,
    /// Units not taken by a persisted, live order: decremented by the stream
    /// workers, given back by cancellations.
    pub available_qty: i64,
    /// The stock the product was created with.
    pub initial_qty: i64,
    pub start_time: i64,
    pub end_time: i64,
    pub limit_per_user: i64,
    pub created: i64,
    pub updated: i64,
    /// When its sale was first opened (epoch ms); `None` before.
    pub opened: Option<i64>,
    /// The waiting room's settings (all `None`: no room); see
    /// [`Product::waiting_room`]. The ceiling's column keeps its first
    /// name, `room_admit_per_sec` (`admit_per_sec` is the pace's word):
    /// renamed by expand/contract from 0.3, as 0.1.0 starts on no books
    /// with a migration it does not know (CHANGELOG, "Upgrading").
    pub room_ceiling_per_sec: Option<i32>,
    pub room_admission_secs: Option<i32>,
    pub room_join_early_secs: Option<i32>,
    pub room_admit_floor_per_sec: Option<i32>,
    pub room_active_cap: Option<i32>,
    pub room_join_difficulty: Option<i8>,
    /// When an admin closed the sale early (epoch ms; `end_time` was moved
    /// to it); `None` otherwise.
    pub closed: Option<i64>,
    /// When the sale was retired: ended, settled, its final audit recorded
    /// (see `bookkeeping::retire`); `None` while it lives.
    pub retired: Option<i64>,
    /// When a retired sale's Redis keys were deleted; `None` until then.
    pub purged: Option<i64>,
    /// Since when an operator paused the sale (epoch ms); `None`: live.
    pub paused: Option<i64>,
    /// Stock shards its sale is opened with (1: one; see `sale::shards`).
    pub stock_shards: i16,
}

impl Product {
    /// The row of a new product, created at `now` (epoch ms).
    fn new(p: &NewProduct, now: i64) -> Self {
        Self {
            product_id: p.product_id.to_string(),
            title: p.title.clone(),
            price: p.price,
            available_qty: p.available_qty as i64,
            initial_qty: p.available_qty as i64,
            start_time: p.start_time,
            end_time: p.end_time,
            limit_per_user: p.limit_per_user as i64,
            created: now,
            updated: now,
            opened: None,
            room_ceiling_per_sec: p.waiting_room.map(|r| r.ceiling_per_sec as i32),
            room_admission_secs: p.waiting_room.map(|r| r.admission_secs as i32),
            room_join_early_secs: p.waiting_room.map(|r| r.join_early_secs as i32),
            room_admit_floor_per_sec: p
                .waiting_room
                .and_then(|r| r.floor_per_sec)
                .map(|f| f as i32),
            room_active_cap: p.waiting_room.and_then(|r| r.active_cap).map(|c| c as i32),
            room_join_difficulty: p
                .waiting_room
                .and_then(|r| r.join_difficulty)
                .map(|d| d as i8),
            closed: None,
            retired: None,
            purged: None,
            paused: None,
            stock_shards: p.stock_shards as i16,
        }
    }

    /// The sale's waiting room, if it has one.
    pub fn waiting_room(&self) -> Option<WaitingRoom> {
        Some(WaitingRoom {
            ceiling_per_sec: u32::try_from(self.room_ceiling_per_sec?).ok()?,
            admission_secs: u32::try_from(self.room_admission_secs?).ok()?,
            join_early_secs: u32::try_from(self.room_join_early_secs?).ok()?,
            floor_per_sec: self
                .room_admit_floor_per_sec
                .and_then(|f| u32::try_from(f).ok()),
            active_cap: self.room_active_cap.and_then(|c| u32::try_from(c).ok()),
            join_difficulty: self.room_join_difficulty.and_then(|d| u8::try_from(d).ok()),
        })
    }
}

/// A validated product to create.
#[derive(Debug, Clone)]
pub struct NewProduct {
    pub product_id: ProductId,
    pub title: String,
    pub price: Decimal,
    pub available_qty: u64,
    pub start_time: i64,
    pub end_time: i64,
    pub limit_per_user: u64,
    pub waiting_room: Option<WaitingRoom>,
    /// 1..=64 (see `sale::shards`).
    pub stock_shards: u16,
}

/// Whole product rows, checked at build time like every static query:
/// `$rest` is what follows `FROM tb_product`, then its arguments.
macro_rules! product_rows {
    ($rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Product,
            "SELECT product_id, title, price, available_qty, initial_qty, start_time, \
             end_time, limit_per_user, created, updated, opened, \
             room_admit_per_sec AS room_ceiling_per_sec, room_admission_secs, \
             room_join_early_secs, room_admit_floor_per_sec, room_active_cap, \
             room_join_difficulty, closed, retired, purged, paused, stock_shards \
             FROM tb_product " + $rest
            $(, $arg)*
        )
    };
}

/// The products table's handle.
#[derive(Clone)]
pub struct Products {
    db: Db,
}

impl Products {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Inserts a product; `ProductExists` when the id is taken.
    pub async fn create(&self, p: &NewProduct) -> Result<Product, StoreError> {
        let row = Product::new(p, now_ms());
        self.db
            .call(|pool| {
                sqlx::query!(
                    "INSERT INTO tb_product (product_id, title, price, available_qty, \
                     initial_qty, start_time, end_time, limit_per_user, created, updated, opened, \
                     room_admit_per_sec, room_admission_secs, room_join_early_secs, \
                     room_admit_floor_per_sec, room_active_cap, room_join_difficulty, \
                     closed, retired, purged, paused, stock_shards) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    &row.product_id,
                    &row.title,
                    row.price,
                    row.available_qty,
                    row.initial_qty,
                    row.start_time,
                    row.end_time,
                    row.limit_per_user,
                    row.created,
                    row.updated,
                    row.opened,
                    row.room_ceiling_per_sec,
                    row.room_admission_secs,
                    row.room_join_early_secs,
                    row.room_admit_floor_per_sec,
                    row.room_active_cap,
                    row.room_join_difficulty,
                    row.closed,
                    row.retired,
                    row.purged,
                    row.paused,
                    row.stock_shards,
                )
                .execute(pool)
            })
            .await
            .map_err(|e| match e {
                StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    StoreError::ProductExists
                }
                e => e,
            })?;
        Ok(row)
    }

    pub async fn product(&self, product_id: &ProductId) -> Result<Option<Product>, StoreError> {
        let row = self
            .db
            .call(|pool| async move {
                product_rows!("WHERE product_id = ?", product_id.as_str())
                    .fetch_optional(pool)
                    .await
            })
            .await?;
        Ok(row.map(normalized))
    }

    /// A waiting room's bounds as its room now holds them, for a sale
    /// opened again by recovery (no cap: NULL).
    pub async fn set_room_bounds(
        &self,
        product_id: &ProductId,
        bounds: RoomBounds,
    ) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                let now = now_ms();
                sqlx::query!(
                    "UPDATE tb_product SET room_admit_per_sec = ?, room_admit_floor_per_sec = ?, \
                     room_active_cap = ?, room_join_difficulty = NULLIF(?, 0), updated = ? \
                     WHERE product_id = ? AND room_admit_per_sec IS NOT NULL",
                    bounds.ceiling,
                    bounds.floor,
                    bounds.cap,
                    bounds.join_difficulty,
                    now,
                    product_id.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)
    }

    /// Records that the product's sale was opened (the first time only).
    pub async fn mark_opened(&self, product_id: &ProductId) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                let now = now_ms();
                sqlx::query!(
                    "UPDATE tb_product SET opened = ? WHERE product_id = ? AND opened IS NULL",
                    now,
                    product_id.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)
    }

    /// Every product whose sale has been opened, oldest first.
    pub async fn opened_products(&self) -> Result<Vec<Product>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                product_rows!("WHERE opened IS NOT NULL ORDER BY id")
                    .fetch_all(pool)
                    .await
            })
            .await?;
        Ok(rows.into_iter().map(normalized).collect())
    }

    /// Closes a product's sale at `closed_at` (`closed` set once; `end_time`
    /// moved to `end_at` unless it ends earlier; `start_time`, the planned
    /// start, kept even when the close comes before it); `None` when there
    /// is no such product. A retired sale is closed already: nothing changes.
    pub async fn close_product(
        &self,
        product: &ProductId,
        closed_at: i64,
        end_at: i64,
    ) -> Result<Option<Product>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "UPDATE tb_product SET closed = COALESCE(closed, ?), \
                     end_time = LEAST(end_time, ?), updated = ? \
                     WHERE product_id = ? AND retired IS NULL",
                    closed_at,
                    end_at,
                    closed_at,
                    product.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)?;
        self.product(product).await
    }

    /// Records that the sale is paused since `since_ms` (`pause`) or live
    /// again, with its event (`sale.paused`, `sale.resumed`) in the same
    /// transaction; true when this call changed it.
    pub async fn set_paused(
        &self,
        product: &ProductId,
        pause: bool,
        since_ms: i64,
    ) -> Result<bool, StoreError> {
        self.db
            .transaction(|tx| {
                Box::pin(async move {
                    let change = if pause {
                        sqlx::query!(
                            "UPDATE tb_product SET paused = ?, updated = ? \
                             WHERE product_id = ? AND paused IS NULL",
                            since_ms,
                            since_ms,
                            product.as_str(),
                        )
                    } else {
                        sqlx::query!(
                            "UPDATE tb_product SET paused = NULL, \
                             updated = GREATEST(updated, ?, ?) \
                             WHERE product_id = ? AND paused IS NOT NULL",
                            since_ms,
                            since_ms,
                            product.as_str(),
                        )
                    };
                    let changed = change.execute(&mut **tx).await?.rows_affected() == 1;
                    if changed {
                        let kind = if pause {
                            EventKind::Paused
                        } else {
                            EventKind::Resumed
                        };
                        events::record_sale(tx, kind, product.as_str()).await?;
                    }
                    Ok(changed)
                })
            })
            .await
    }

    /// Records restock `restock_id` of `units` (signed) at `at`: its row,
    /// `initial_qty` and `available_qty` moved by it, and `sale.restocked`,
    /// in one transaction, once per id; true when this call recorded it.
    pub async fn record_restock(
        &self,
        product: &ProductId,
        restock_id: &str,
        units: i64,
        at: i64,
    ) -> Result<bool, StoreError> {
        self.db
            .transaction(|tx| {
                Box::pin(async move {
                    let recorded = sqlx::query!(
                        "INSERT IGNORE INTO tb_restock (restock_id, product_id, units, at) \
                         VALUES (?, ?, ?, ?)",
                        restock_id,
                        product.as_str(),
                        units,
                        at,
                    )
                    .execute(&mut **tx)
                    .await?
                    .rows_affected()
                        == 1;
                    if recorded {
                        sqlx::query!(
                            "UPDATE tb_product SET initial_qty = initial_qty + ?, \
                             available_qty = available_qty + ?, updated = GREATEST(updated, ?) \
                             WHERE product_id = ?",
                            units,
                            units,
                            at,
                            product.as_str(),
                        )
                        .execute(&mut **tx)
                        .await?;
                        events::record_sale(tx, EventKind::Restocked, product.as_str()).await?;
                    }
                    Ok(recorded)
                })
            })
            .await
    }

    /// The units restocks added to a sale (taken away: negative), in all.
    pub async fn restocked(&self, product: &ProductId) -> Result<i64, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_scalar!(
                    "SELECT SUM(units) FROM tb_restock WHERE product_id = ?",
                    product.as_str()
                )
                .fetch_one(pool)
                .await
            })
            .await
            .map(|sum| sum.and_then(|d| i64::try_from(d).ok()).unwrap_or(0))
    }

    /// A sale's restocks as the books hold them, `(restock_id, units)`, in
    /// the order they were made.
    pub async fn restocks_of(&self, product: &ProductId) -> Result<Vec<(String, i64)>, StoreError> {
        self.db
            .call(|pool| async move {
                let rows = sqlx::query!(
                    "SELECT restock_id, units FROM tb_restock WHERE product_id = ? \
                     ORDER BY at, restock_id",
                    product.as_str()
                )
                .fetch_all(pool)
                .await?;
                Ok(rows.into_iter().map(|r| (r.restock_id, r.units)).collect())
            })
            .await
    }

    /// When a sale was paused and resumed, as its events say: `(true:
    /// paused / false: resumed, at)` (epoch ms), in order.
    pub async fn pauses_of(&self, product: &ProductId) -> Result<Vec<(bool, i64)>, StoreError> {
        let rows = self
            .db
            .call(|pool| async move {
                sqlx::query!(
                    "SELECT type AS kind, created FROM tb_event WHERE product_id = ? \
                     AND type IN ('sale.paused', 'sale.resumed') ORDER BY id",
                    product.as_str()
                )
                .fetch_all(pool)
                .await
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.kind == "sale.paused", r.created))
            .collect())
    }

    /// A sale's restocks as `(at, units)` (epoch ms), in time order: the
    /// report's marks.
    pub async fn restock_times(&self, product: &ProductId) -> Result<Vec<(i64, i64)>, StoreError> {
        self.db
            .call(|pool| async move {
                let rows = sqlx::query!(
                    "SELECT at, units FROM tb_restock WHERE product_id = ? ORDER BY at, restock_id",
                    product.as_str()
                )
                .fetch_all(pool)
                .await?;
                Ok(rows.into_iter().map(|r| (r.at, r.units)).collect())
            })
            .await
    }

    /// Opened sales not retired whose end is at or before `ended_by` (epoch
    /// ms), by end then id, after `after` (the last of the previous page),
    /// at most `limit`: those a retirement pass looks at.
    pub async fn ended_unretired(
        &self,
        ended_by: i64,
        after: Option<&(i64, String)>,
        limit: u32,
    ) -> Result<Vec<Product>, StoreError> {
        let (from, id) = after.cloned().unwrap_or((i64::MIN, String::new()));
        let rows = self
            .db
            .call(|pool| {
                let id = &id;
                async move {
                    product_rows!(
                        "WHERE retired IS NULL AND opened IS NOT NULL AND end_time <= ? \
                         AND (end_time > ? OR (end_time = ? AND product_id > ?)) \
                         ORDER BY end_time, product_id LIMIT ?",
                        ended_by,
                        from,
                        from,
                        id,
                        limit,
                    )
                    .fetch_all(pool)
                    .await
                }
            })
            .await?;
        Ok(rows.into_iter().map(normalized).collect())
    }

    /// Retired sales whose Redis keys are not deleted yet, by retirement
    /// then id, after `after` (the last of the previous page), at most `limit`.
    pub async fn unpurged(
        &self,
        after: Option<&(i64, String)>,
        limit: u32,
    ) -> Result<Vec<Product>, StoreError> {
        let (from, id) = after.cloned().unwrap_or((i64::MIN, String::new()));
        let rows = self
            .db
            .call(|pool| {
                let id = &id;
                async move {
                    product_rows!(
                        "WHERE purged IS NULL AND retired IS NOT NULL \
                         AND (retired > ? OR (retired = ? AND product_id > ?)) \
                         ORDER BY retired, product_id LIMIT ?",
                        from,
                        from,
                        id,
                        limit,
                    )
                    .fetch_all(pool)
                    .await
                }
            })
            .await?;
        Ok(rows.into_iter().map(normalized).collect())
    }

    /// Records that a retired sale's Redis keys are deleted.
    pub async fn mark_purged(&self, product: &ProductId, now_ms: i64) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "UPDATE tb_product SET purged = ? WHERE product_id = ? AND purged IS NULL \
                     AND retired IS NOT NULL",
                    now_ms,
                    product.as_str(),
                )
                .execute(pool)
                .await
            })
            .await
            .map(drop)
    }

    /// How many sales were retired.
    pub async fn retired_count(&self) -> Result<i64, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_scalar!("SELECT COUNT(*) FROM tb_product WHERE retired IS NOT NULL")
                    .fetch_one(pool)
                    .await
            })
            .await
    }
}

/// The column has scale 18; drop its trailing zeros ("4999.5", not "4999.500000000000000000").
fn normalized(p: Product) -> Product {
    Product {
        price: p.price.normalize(),
        ..p
    }
}
