//! Products: created by an admin in MySQL, opened into Redis, read by anyone.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{Admin, JsonBody, PathParam};
pub use super::new_product::CreateProduct;
use super::state::AppState;
use crate::books::{self, ProductStatus, retire};
use crate::domain::{self, MAX_STOCK, ProductId, SaleState, WaitingRoom};

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
        }
    }
}

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
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateProduct>,
) -> Result<(StatusCode, Json<ProductView>), ApiError> {
    let new = body.validate()?;
    let product = state.catalog.create(&new).await?;
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
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "OK", body = Opened),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`sale_closed`: closed early or retired, it cannot open again", body = ErrorBody),
    )
)]
pub async fn open(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<Opened>, ApiError> {
    let id = product_id_of(&product_id)?;
    let books::SaleOpened { stock, opened } = state.catalog.open(&id).await?;
    Ok(Json(Opened {
        product_id: id.as_str().to_owned(),
        stock,
        opened,
    }))
}

/// `GET /api/products/{product_id}`
#[utoipa::path(
    get,
    path = "/api/products/{product_id}",
    operation_id = "get_product",
    tag = "products",
    summary = "A product and its live stock",
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    responses(
        (status = 200, description = "OK", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<ProductView>, ApiError> {
    let id = product_id_of(&product_id)?;
    Ok(Json(state.catalog.status(&id).await?.into()))
}

/// `POST /api/admin/products/{product_id}/close`: ends the sale now
/// (idempotent); the workers retire it once settled.
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/close",
    operation_id = "close_sale",
    tag = "admin",
    summary = "Close a sale now: no order is accepted from this answer on; it retires once settled",
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Closed (or closed already): the product, `end_time` moved to the close", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn close(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<ProductView>, ApiError> {
    let id = product_id_of(&product_id)?;
    Ok(Json(state.catalog.close(&id).await?.into()))
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
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Paused (or paused already): the product, `paused` set", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: not open; `sale_closed`: closed or retired", body = ErrorBody),
    )
)]
pub async fn pause(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<ProductView>, ApiError> {
    let id = product_id_of(&product_id)?;
    Ok(Json(state.catalog.pause(&id, true).await?.into()))
}

/// `POST /api/admin/products/{product_id}/resume`
#[utoipa::path(
    post,
    path = "/api/admin/products/{product_id}/resume",
    operation_id = "resume_sale",
    tag = "admin",
    summary = "Resume a paused sale: orders are taken again from this answer on",
    description = "Idempotent. The event `sale.resumed`. The waiting room's line moves on from where it stood.",
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Live (or live already): the product, `paused` null", body = ProductView),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
        (status = 409, description = "`invalid_transition`: not open; `sale_closed`: closed or retired", body = ErrorBody),
    )
)]
pub async fn resume(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<ProductView>, ApiError> {
    let id = product_id_of(&product_id)?;
    Ok(Json(state.catalog.pause(&id, false).await?.into()))
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
        ("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$"),
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
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<Restock>,
) -> Result<axum::response::Response, ApiError> {
    let id = product_id_of(&product_id)?;
    if body.units == 0 || body.units.unsigned_abs() > MAX_STOCK {
        return Err(ApiError::InvalidRequest(format!(
            "units must be between -{MAX_STOCK} and {MAX_STOCK}, and not 0"
        )));
    }
    let restock_id = match headers.get("idempotency-key") {
        Some(key) => {
            let key = key
                .to_str()
                .ok()
                .filter(|k| (1..=128).contains(&k.len()))
                .ok_or_else(|| {
                    ApiError::InvalidRequest("Idempotency-Key: 1-128 visible characters".into())
                })?;
            // By its hash: the books' id stays short whatever the key.
            format!("{id}:{}", super::admin_log::fingerprint(key.as_bytes()))
        }
        None => domain::OrderId::generate(&id).into_string(),
    };
    let before = state.catalog.status(&id).await?;
    let before = json!({"stock": before.stock, "initial_qty": before.product.initial_qty});
    let (status, applied) = state.catalog.restock(&id, body.units, &restock_id).await?;
    let mut answer = Json(Restocked {
        applied,
        product: status.into(),
    })
    .into_response();
    answer
        .extensions_mut()
        .insert(super::admin_log::Before(before));
    Ok(answer)
}

/// A product id from the path: one we could never have created is simply
/// not found.
fn product_id_of(text: &str) -> Result<ProductId, ApiError> {
    ProductId::parse(text).map_err(|_| ApiError::ProductNotFound("no product with this id"))
}

/// `GET /api/admin/products/{product_id}/audit`: the sale's books (see
/// `books::audit`); `ok` says whether they balance.
#[utoipa::path(
    get,
    path = "/api/admin/products/{product_id}/audit",
    operation_id = "audit_sale",
    tag = "admin",
    summary = "Check that a sale's books balance in Redis and MySQL",
    params(("product_id" = String, Path, pattern = "^[A-Za-z0-9._-]{1,128}$")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "`ok`: whether every check holds; `audit`: the figures and checks", body = Object),
        (status = 404, description = "`product_not_found`", body = ErrorBody),
    )
)]
pub async fn audit(
    _: Admin,
    State(state): State<AppState>,
    PathParam(product_id): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    let id = product_id_of(&product_id)?;
    let product = state.catalog.product(&id).await?;
    let audit = state.audit.sale(&product).await?;
    Ok(Json(json!({"ok": audit.ok(), "audit": audit})))
}
