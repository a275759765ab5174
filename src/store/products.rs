//! `tb_product`: the products (sales) and their MySQL-side stock.

use rust_decimal::Decimal;
use serde::Serialize;

use super::{Db, StoreError};
use crate::domain::ProductId;
use crate::domain::now_ms;

/// A product row.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
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
}

const COLUMNS: &str = "product_id, title, price, available_qty, initial_qty, start_time, \
                       end_time, limit_per_user, created, updated, opened";

impl Db {
    /// Inserts a product; `ProductExists` when the id is taken.
    pub async fn create_product(&self, p: &NewProduct) -> Result<Product, StoreError> {
        let now = now_ms();
        let row = Product {
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
        };
        let sql =
            format!("INSERT INTO tb_product ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        let insert = sqlx::query(&sql)
            .bind(&row.product_id)
            .bind(&row.title)
            .bind(row.price)
            .bind(row.available_qty)
            .bind(row.initial_qty)
            .bind(row.start_time)
            .bind(row.end_time)
            .bind(row.limit_per_user)
            .bind(row.created)
            .bind(row.updated)
            .bind(row.opened);
        self.bounded(async {
            match insert.execute(self.pool()).await {
                Ok(_) => Ok(()),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    Err(StoreError::ProductExists)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        Ok(row)
    }

    pub async fn product(&self, product_id: &ProductId) -> Result<Option<Product>, StoreError> {
        let row: Option<Product> = self
            .bounded(async {
                Ok(sqlx::query_as(&format!(
                    "SELECT {COLUMNS} FROM tb_product WHERE product_id = ?"
                ))
                .bind(product_id.as_str())
                .fetch_optional(self.pool())
                .await?)
            })
            .await?;
        // The column has scale 18; drop its trailing zeros ("4999.5", not "4999.500000000000000000").
        Ok(row.map(|p| Product {
            price: p.price.normalize(),
            ..p
        }))
    }
}

impl Db {
    /// Records that the product's sale was opened (the first time only).
    pub async fn mark_opened(&self, product_id: &ProductId) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query("UPDATE tb_product SET opened = ? WHERE product_id = ? AND opened IS NULL")
                .bind(now_ms())
                .bind(product_id.as_str())
                .execute(self.pool())
                .await?;
            Ok(())
        })
        .await
    }

    /// Every product whose sale has been opened, oldest first.
    pub async fn opened_products(&self) -> Result<Vec<Product>, StoreError> {
        let rows: Vec<Product> = self
            .bounded(async {
                Ok(sqlx::query_as(&format!(
                    "SELECT {COLUMNS} FROM tb_product WHERE opened IS NOT NULL ORDER BY id"
                ))
                .fetch_all(self.pool())
                .await?)
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|p| Product {
                price: p.price.normalize(),
                ..p
            })
            .collect())
    }
}
