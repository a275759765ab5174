//! Sales as an operator runs them: a product created, its sale opened,
//! closed, paused, resumed, restocked, audited.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

pub use super::new_product::CreateProduct;
use super::restock::restock_id;
use super::state::Operators;
use crate::bookkeeping::{self, ProductStatus};
use crate::domain::MAX_STOCK;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{Admin, JsonBody, SalePath};

use crate::http::buyers::products::ProductView;

/// `POST /api/admin/products`
#[utoipa::path(
    post,
    path = "/api/admin/products",
    operation_id = "create_product",
    tag = "admin",
    summary = "Create a product (in MySQL; open its sale next)",
    request_body = CreateProduct,
    security(("admin" = [])),
    responses(
        (status = 201, description = "Created", body = ProductView),
        (status = 409, description = "`product_exists`", body = ErrorBody),
    )
)]
pub async fn create(
    _: Admin,
    State(state): State<Operators>,
    JsonBody(body): JsonBody<CreateProduct>,
) -> Result<(StatusCode, Json<ProductView>), ApiError> {
    let new = body.validate()?;
    let product = state.desk.catalog.create(&new).await?;
    let view = ProductStatus {
        product,
        stock: None,
        final_audit: None,
    };
    Ok((StatusCode::CREATED, Json(view.into())))
}

/// What opening a sale did.
#[derive(Serialize, ToSchema)]
pub struct Opened {
    product_id: String,
    /// Units on sale in Redis.
    stock: u64,
    /// False when the sale was open already (nothing changed).
    opened: bool,
}

/// `POST /api/admin/products/{product_id}/open`: idempotent.
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/open",
    operation_id = "open_sale",
    tag = "admin",
    summary = "Open a product's sale in Redis (idempotent)",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "OK", body = Opened),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`sale_closed`: closed early or retired, it cannot open again", body = ErrorBody),
    )
)]
pub async fn open(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<Opened>, ApiError> {
    let bookkeeping::SaleOpened { stock, opened } = state.desk.catalog.open(&id).await?;
    Ok(Json(Opened {
        product_id: id.as_str().to_owned(),
        stock,
        opened,
    }))
}

/// `POST /api/admin/products/{product_id}/close`: ends the sale now
/// (idempotent); the workers retire it once settled.
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/close",
    operation_id = "close_sale",
    tag = "admin",
    summary = "Close a sale now: no order is accepted from this answer on; it retires once settled",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Closed (or closed already): the product, `end_time` moved to the close", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn close(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<ProductView>, ApiError> {
    Ok(Json(state.desk.catalog.close(&id).await?.into()))
}

/// `POST /api/admin/products/{product_id}/pause`: orders are refused
/// (`sale_paused`) from this answer on, on every instance, until resumed.
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/pause",
    operation_id = "pause_sale",
    tag = "admin",
    summary = "Pause a sale: orders are refused `sale_paused` until it resumes; its window is not moved",
    description = "From this answer on, on every instance (each order's script reads the pause: no instance remembers it). A keyed retry of an order accepted before still gets its answer. The waiting room's line stands still, and admissions valid when the pause began do not run out during it. Idempotent. The event `sale.paused`.",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Paused (or paused already): the product, `paused` set", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: not open; `sale_closed`: closed or retired; `sale_ended`: past its end (a pause would hold nothing back)", body = ErrorBody),
    )
)]
pub async fn pause(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<ProductView>, ApiError> {
    Ok(Json(state.desk.catalog.pause(&id, true).await?.into()))
}

/// `POST /api/admin/products/{product_id}/resume`
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/resume",
    operation_id = "resume_sale",
    tag = "admin",
    summary = "Resume a paused sale: orders are taken again from this answer on",
    description = "Idempotent. The event `sale.resumed`. The waiting room's line moves on from where it stood.",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Live (or live already): the product, `paused` null", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: not open; `sale_closed`: closed or retired", body = ErrorBody),
    )
)]
pub async fn resume(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<ProductView>, ApiError> {
    Ok(Json(state.desk.catalog.pause(&id, false).await?.into()))
}

/// How many units to add to an open sale (negative: to take away).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    /// Added (taken away when negative: never more than are left); not 0.
    #[schema(example = 200)]
    units: i64,
}

/// What a restock came to.
#[derive(Serialize, ToSchema)]
pub struct Restocked {
    /// This call moved the stock (false: a retry of a restock done before,
    /// by its `Idempotency-Key`).
    applied: bool,
    product: ProductView,
}

/// `POST /api/admin/products/{product_id}/restock`
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/restock",
    operation_id = "restock_sale",
    tag = "admin",
    summary = "Add units to an open sale, or take some away (never more than are left)",
    description = "Atomically with the orders (the stock and the sale's initial move together in one script): no unit lost or made. The books' `initial_qty` and `available_qty` follow, with the event `sale.restocked`. Once per `Idempotency-Key`: a retry changes nothing more and finishes the books' half if it failed. The waiting room's line moves again for new units.",
    params(
        SalePath,
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the restock once however often it is sent (1-128 visible characters)"),
    ),
    request_body = Restock,
    security(("admin" = [])),
    responses(
        (status = 200, description = "Restocked (or restocked before, by this key)", body = Restocked),
        (status = 400, description = "`invalid_request`: units 0 or beyond the stock bound", body = ErrorBody),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`insufficient_stock` (taking away more than are left), `sale_ended`, `sale_closed`, `invalid_transition` (not open)", body = ErrorBody),
    )
)]
pub async fn restock(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<Restock>,
) -> Result<axum::response::Response, ApiError> {
    if body.units == 0 || body.units.unsigned_abs() > MAX_STOCK {
        return Err(ApiError::InvalidRequest(format!(
            "units must be between -{MAX_STOCK} and {MAX_STOCK}, and not 0"
        )));
    }
    let key = match headers.get("idempotency-key") {
        Some(key) => Some(key.to_str().map_err(|_| {
            ApiError::InvalidRequest("Idempotency-Key: 1-128 visible characters".into())
        })?),
        None => None,
    };
    let restock_id = restock_id(&id, key)?;
    let before = super::before::stock(&state.desk.catalog, &id).await;
    let (status, applied) = state
        .desk
        .catalog
        .restock(&id, body.units, &restock_id)
        .await?;
    let mut answer = Json(Restocked {
        applied,
        product: status.into(),
    })
    .into_response();
    if let Some(before) = before {
        answer
            .extensions_mut()
            .insert(super::admin_log::Before(before));
    }
    Ok(answer)
}

/// `GET /api/admin/products/{product_id}/audit`: the sale's books (see
/// `bookkeeping::audit`); `ok` says whether they balance.
#[utoipa::path(
    get,
    path = "/api/admin/products/{product_id}/audit",
    operation_id = "audit_sale",
    tag = "admin",
    summary = "Check that a sale's books balance in Redis and MySQL",
    params(SalePath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "`ok`: whether every check holds; `audit`: the figures and checks", body = Object),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn audit(
    _: Admin,
    State(state): State<Operators>,
    SalePath(id): SalePath,
) -> Result<Json<Value>, ApiError> {
    let product = state.desk.catalog.product(&id).await?;
    let audit = state.desk.audit.sale(&product).await?;
    Ok(Json(json!({"ok": audit.ok(), "audit": audit})))
}
