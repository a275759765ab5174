//! Products: created by an admin in MySQL, opened into Redis, read by anyone.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::extract::{Admin, JsonBody, PathParam};
use crate::domain::{self, Invalid, MAX_STOCK, ProductId};
use crate::sale::SaleSpec;
use crate::store::{NewProduct, Product};

/// Longest title (the `tb_product.title` column).
const MAX_TITLE_CHARS: usize = 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateProduct {
    product_id: String,
    title: String,
    price: Decimal,
    available_qty: u64,
    start_time: i64,
    end_time: i64,
    #[serde(default = "one")]
    limit_per_user: u64,
}

fn one() -> u64 {
    1
}

impl CreateProduct {
    fn validate(self) -> Result<NewProduct, Invalid> {
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
        Ok(NewProduct {
            product_id,
            title: title.to_owned(),
            price: domain::price(self.price)?,
            available_qty: self.available_qty,
            start_time,
            end_time,
            limit_per_user: self.limit_per_user,
        })
    }
}

/// A product with its live stock (`null` while the sale is not open).
#[derive(Serialize)]
pub struct ProductView {
    #[serde(flatten)]
    product: Product,
    stock: Option<u64>,
}

/// `POST /api/admin/products`
pub async fn create(
    _: Admin,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateProduct>,
) -> Result<(StatusCode, Json<ProductView>), ApiError> {
    let new = body.validate()?;
    let product = state.db.create_product(&new).await?;
    tracing::info!(product_id = %new.product_id, "product created");
    Ok((
        StatusCode::CREATED,
        Json(ProductView {
            product,
            stock: None,
        }),
    ))
}

/// `POST /api/admin/products/{product_id}/open`: idempotent.
pub async fn open(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    let (id, product) = find(&state, &product_id).await?;
    let spec = SaleSpec {
        stock: product.available_qty.max(0) as u64,
        start_ms: product.start_time,
        end_ms: product.end_time,
        limit_per_user: product.limit_per_user.max(1) as u64,
        price: product.price,
    };
    let (opened, stock) = state.sales.open(&id, &spec).await?;
    state.db.mark_opened(&id).await?;
    if opened {
        tracing::info!(product_id = %id, stock, "sale opened");
    }
    Ok(Json(
        json!({"product_id": id.as_str(), "stock": stock, "opened": opened}),
    ))
}

/// `GET /api/products/{product_id}`
pub async fn get(
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<ProductView>, ApiError> {
    let (id, product) = find(&state, &product_id).await?;
    let stock = state.sales.stock(&id).await?;
    Ok(Json(ProductView { product, stock }))
}

async fn find(state: &AppState, product_id: &str) -> Result<(ProductId, Product), ApiError> {
    let not_found = || ApiError::ProductNotFound("no product with this id".into());
    // An id we could never have created is simply not found.
    let id = ProductId::parse(product_id).map_err(|_| not_found())?;
    let product = state.db.product(&id).await?.ok_or_else(not_found)?;
    Ok((id, product))
}

/// `GET /api/admin/products/{product_id}/audit`: the sale's books (see
/// `books::audit`); `ok` says whether they balance.
pub async fn audit(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    let (_, product) = find(&state, &product_id).await?;
    let audit = crate::books::audit::audit_sale(&state.sales, &state.db, &product).await?;
    Ok(Json(json!({"ok": audit.ok(), "audit": audit})))
}
