//! A product as anyone reads it: created by an admin in MySQL, opened
//! into Redis.

use axum::Json;
use axum::extract::State;
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use super::state::Buyers;
use crate::bookkeeping::{ProductStatus, retire};
use crate::domain::{self, SaleState, WaitingRoom};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::SalePath;

/// A product with its live stock (`null` while the sale is not open).
#[derive(Serialize, ToSchema)]
pub struct ProductView {
    product_id: String,
    title: String,
    price: Decimal,
    /// Units not taken by a persisted, live order: decremented by the stream
    /// workers, given back by cancellations.
    available_qty: i64,
    /// The stock the product was created with.
    initial_qty: i64,
    start_time: i64,
    end_time: i64,
    limit_per_user: i64,
    created: i64,
    updated: i64,
    /// When its sale was first opened (epoch ms); `null` before.
    opened: Option<i64>,
    /// When an admin closed the sale early (epoch ms; `end_time` was moved
    /// to it); `null` otherwise.
    closed: Option<i64>,
    /// When the sale was retired: ended, settled, its final audit recorded;
    /// `null` while it lives.
    retired: Option<i64>,
    /// Since when an operator has paused the sale (epoch ms): orders are
    /// refused `sale_paused` until it resumes; `null`: not paused.
    paused: Option<i64>,
    /// Units left: live from Redis, or for a retired sale the units it
    /// ended with (`null` while the sale is not open).
    stock: Option<u64>,
    state: SaleState,
    /// The sale's waiting room (`null`: none).
    waiting_room: Option<WaitingRoom>,
    /// A retired sale's final figures, as recorded at its retirement
    /// (`null` before).
    final_audit: Option<FinalFigures>,
    /// Shards its stock is split into, each in its own hash slot (1: one;
    /// docs/shards.md).
    stock_shards: i16,
}

/// A retired sale's final figures.
#[derive(Serialize, ToSchema)]
pub struct FinalFigures {
    /// When it was retired (epoch ms).
    retired: i64,
    /// Units sold and kept (paid).
    paid: i64,
    /// Units of orders cancelled (by the buyer or the payment timeout).
    cancelled: i64,
    /// Units nobody bought (or bought and cancelled).
    unsold: i64,
    /// Orders in the books, any status.
    orders: i64,
}

impl From<ProductStatus> for ProductView {
    fn from(status: ProductStatus) -> Self {
        let ProductStatus {
            product: p,
            stock,
            final_audit,
        } = status;
        let final_audit = final_audit.map(|a| FinalFigures {
            retired: a.retired,
            paid: a.paid,
            cancelled: a.cancelled,
            unsold: a.redis_stock,
            orders: a.orders,
        });
        Self {
            state: retire::state_of(&p, domain::now_ms()),
            waiting_room: p.waiting_room(),
            stock: stock.or(final_audit.as_ref().map(|a| a.unsold.max(0) as u64)),
            final_audit,
            product_id: p.product_id,
            title: p.title,
            price: p.price,
            available_qty: p.available_qty,
            initial_qty: p.initial_qty,
            start_time: p.start_time,
            end_time: p.end_time,
            limit_per_user: p.limit_per_user,
            created: p.created,
            updated: p.updated,
            opened: p.opened,
            closed: p.closed,
            retired: p.retired,
            paused: p.paused,
            stock_shards: p.stock_shards,
        }
    }
}

/// `GET /api/products/{product_id}`
#[utoipa::path(
    get,
    path = "/api/products/{product_id}",
    operation_id = "get_product",
    tag = "products",
    summary = "A product and its live stock",
    params(SalePath),
    responses(
        (status = 200, description = "OK", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn get(
    State(state): State<Buyers>,
    SalePath(id): SalePath,
) -> Result<Json<ProductView>, ApiError> {
    Ok(Json(state.catalog.status(&id).await?.into()))
}
