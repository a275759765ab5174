//! The body that creates a sale's product, checked once: the admin API's
//! `POST /api/admin/products` and the dashboard's form send the same.

use rust_decimal::Decimal;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::domain::{self, Invalid, MAX_STOCK, ProductId, WaitingRoom};
use crate::store::NewProduct;

/// Longest title (the `tb_product.title` column).
const MAX_TITLE_CHARS: usize = 1024;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProduct {
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9._-]+$",
        example = "sku-1"
    )]
    product_id: String,
    #[schema(min_length = 1, max_length = 1024)]
    title: String,
    /// A decimal string, at least 0, at most 18 decimal places.
    #[schema(example = "9.99")]
    price: Decimal,
    #[schema(maximum = 1_000_000_000)]
    available_qty: u64,
    /// Epoch milliseconds.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    start_time: i64,
    /// Epoch milliseconds, after `start_time`.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    end_time: i64,
    /// Units one user may buy (default 1).
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    limit_per_user: u64,
    /// A waiting room in front of the sale (absent or `null`: none).
    #[serde(default)]
    waiting_room: Option<WaitingRoom>,
    /// Stock shards: the parts the stock is split into, each in its own
    /// hash slot, for a sale beyond one Redis core (default 1; see docs/shards.md).
    #[serde(default = "one_shard")]
    #[schema(minimum = 1, maximum = 64)]
    stock_shards: u16,
}

fn one_shard() -> u16 {
    1
}

fn one() -> u64 {
    1
}

impl CreateProduct {
    /// The product, checked (the admin API's and the dashboard's form's).
    pub(in crate::http) fn validate(self) -> Result<NewProduct, Invalid> {
        let product_id = ProductId::parse(&self.product_id)?;
        let title = self.title.trim();
        if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
            return Err(Invalid(format!(
                "title must be 1 to {MAX_TITLE_CHARS} characters"
            )));
        }
        if self.available_qty > MAX_STOCK {
            return Err(Invalid(format!(
                "available_qty must be at most {MAX_STOCK}"
            )));
        }
        if self.limit_per_user == 0 || self.limit_per_user > domain::MAX_QUANTITY {
            return Err(Invalid(format!(
                "limit_per_user must be between 1 and {}",
                domain::MAX_QUANTITY
            )));
        }
        let start_time = domain::time_ms("start_time", self.start_time)?;
        let end_time = domain::time_ms("end_time", self.end_time)?;
        if end_time <= start_time {
            return Err(Invalid("end_time must be after start_time".into()));
        }
        if self.stock_shards == 0 || self.stock_shards > domain::MAX_SHARDS {
            return Err(Invalid(format!(
                "stock_shards must be between 1 and {}",
                domain::MAX_SHARDS
            )));
        }
        Ok(NewProduct {
            product_id,
            title: title.to_owned(),
            price: domain::price(self.price)?,
            available_qty: self.available_qty,
            start_time,
            end_time,
            limit_per_user: self.limit_per_user,
            waiting_room: self.waiting_room.map(WaitingRoom::validate).transpose()?,
            stock_shards: self.stock_shards,
        })
    }
}
