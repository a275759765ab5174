//! The dashboard's controls: pause and resume a sale, restock it, close it,
//! from the page, as the admin API does them (`bookkeeping::Catalog`), each
//! written to the admin log under the dashboard session.
//!
//! Safe against cross-site requests on two counts: the session cookie is
//! `SameSite=Strict` (no other site's page makes the browser send it), and
//! every action carries the session's anti-CSRF token
//! (`X-CSRF-Token`, an HMAC of the session, served inside the page, which
//! no other origin can read), and an `Origin`, when the browser sends one,
//! must be this host's. Either alone refuses a forged request (`403
//! forbidden`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::board::Dashboard;
use super::door::{FORGED, SignedIn, same_origin};
use super::session::Session;
use crate::domain::ProductId;
use crate::http::error::ApiError;
use crate::http::operators::admin_log::AdminAction;
use crate::http::operators::restock::restock_id;
use crate::store::AdminEntry;

/// What the page asks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    product_id: String,
    /// `create` (with `product`: the admin API's body; opened at once),
    /// `pause`, `resume`, `restock` (with `units`), `room` (with any of
    /// the bounds), `close`; `replay` (every dead letter of the events,
    /// whatever the sale).
    action: AdminAction,
    units: Option<i64>,
    /// A restock's key, made by the page once per restock it means (a
    /// double click, a retry after no answer: the same key, applied once).
    restock_key: Option<String>,
    product: Option<crate::http::operators::new_product::CreateProduct>,
    ceiling_per_sec: Option<u32>,
    floor_per_sec: Option<u32>,
    /// 0: no cap.
    active_cap: Option<u32>,
}

/// The client's address, as the limits see it.
fn client_address(dashboard: &Dashboard, parts: &Parts) -> Option<String> {
    dashboard
        .admin
        .guards()
        .client_ip(
            &parts.headers,
            crate::http::extract::peer(&parts.extensions),
        )
        .map(|ip| ip.to_string())
}

/// `POST /admin/dashboard/action`: one action on one sale; the product as
/// the admin API answers it, or the API's error.
pub(super) async fn act(
    State(dashboard): State<Arc<Dashboard>>,
    SignedIn(session): SignedIn,
    parts: Parts,
    body: Bytes,
) -> Response {
    let token = parts
        .headers
        .get("x-csrf-token")
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let expected = dashboard.sessions.csrf(&session);
    if !same_origin(&parts) || !bool::from(token.ct_eq(expected.as_bytes())) {
        return refuse_forged(&dashboard, &parts, &session, &body).await;
    }
    let asked: Action = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return ApiError::InvalidRequest(e.to_string()).into_response(),
    };
    let address = client_address(&dashboard, &parts);
    let (product_id, action) = (asked.product_id.clone(), asked.action);
    let before = before(&dashboard, &asked).await;
    let answer = run(&dashboard, asked).await;
    let (status, after) = match &answer {
        Ok(product) => (StatusCode::OK, Some(product.to_string())),
        Err(e) => (crate::http::error::status(e.kind()), None),
    };
    dashboard
        .admin
        .write(AdminEntry {
            product_id: (!product_id.is_empty()).then_some(product_id),
            address,
            asked: Some(String::from_utf8_lossy(&body).into_owned()),
            before: before.map(|b| b.to_string()),
            after,
            ..AdminEntry::new(
                action.name().to_owned(),
                session.actor(),
                i32::from(status.as_u16()),
            )
        })
        .await;
    match answer {
        Ok(product) => (StatusCode::OK, axum::Json(product)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A post without the page's token or from another origin: someone's
/// page posted with the operator's cookie. Refused, logged and written to
/// the admin log (`dashboard.forged`, with what it asked).
async fn refuse_forged(
    dashboard: &Dashboard,
    parts: &Parts,
    session: &Session,
    body: &Bytes,
) -> Response {
    tracing::warn!(
        actor = session.actor(),
        "a dashboard action without this page's token or from another origin: refused"
    );
    dashboard
        .admin
        .write(AdminEntry {
            address: client_address(dashboard, parts),
            asked: Some(String::from_utf8_lossy(body).into_owned()),
            ..AdminEntry::new(
                FORGED.to_owned(),
                session.actor(),
                i32::from(StatusCode::FORBIDDEN.as_u16()),
            )
        })
        .await;
    ApiError::Forbidden("a dashboard action must come from the dashboard's own page")
        .into_response()
}

async fn run(dashboard: &Dashboard, mut asked: Action) -> Result<serde_json::Value, ApiError> {
    if asked.action == AdminAction::Replay {
        let replaying = dashboard.desk.outbox.replay(None).await?;
        return Ok(serde_json::json!({ "replaying": replaying }));
    }
    let id = ProductId::parse(&asked.product_id)
        .map_err(|_| ApiError::ProductNotFound("no product with this id"))?;
    let catalog = &dashboard.desk.catalog;
    if asked.action == AdminAction::Room {
        return room_bounds(dashboard, &id, &asked).await;
    }
    if asked.action == AdminAction::Create {
        create(dashboard, &id, asked.product.take()).await?;
    }
    let mut applied = None;
    let status = match (asked.action, asked.units) {
        (AdminAction::Create, None) => catalog.status(&id).await?,
        (AdminAction::Pause, None) => catalog.pause(&id, true).await?,
        (AdminAction::Resume, None) => catalog.pause(&id, false).await?,
        (AdminAction::Close, None) => catalog.close(&id).await?,
        (AdminAction::Restock, Some(units))
            if units != 0 && units.unsigned_abs() <= crate::domain::MAX_STOCK =>
        {
            let restock_id = restock_id(&id, asked.restock_key.as_deref())?;
            let (status, done) = catalog.restock(&id, units, &restock_id).await?;
            applied = Some(done);
            status
        }
        (AdminAction::Restock, _) => {
            return Err(ApiError::InvalidRequest(
                "restock: units must be a whole number, not 0".into(),
            ));
        }
        _ => {
            return Err(ApiError::InvalidRequest(
                "action: create, pause, resume, restock (with units), room, close or replay (a sale is opened by create)".into(),
            ));
        }
    };
    let p = &status.product;
    Ok(serde_json::json!({
        "product_id": p.product_id,
        "stock": status.stock,
        "initial_qty": p.initial_qty,
        "end_time": p.end_time,
        "closed": p.closed,
        "paused": p.paused,
        // A restock: whether this call moved the stock (false: its key's
        // restock was done before, nothing changed now).
        "applied": applied,
    }))
}

/// For the admin log: the figures an action changes, as they stand before
/// it (a restock's stock, the room's bounds), as the admin API keeps them.
async fn before(dashboard: &Dashboard, asked: &Action) -> Option<serde_json::Value> {
    let id = ProductId::parse(&asked.product_id).ok()?;
    let catalog = &dashboard.desk.catalog;
    match asked.action {
        AdminAction::Restock => crate::http::operators::before::stock(catalog, &id).await,
        AdminAction::Room => crate::http::operators::before::room_bounds(catalog, &id).await,
        _ => None,
    }
}

/// The room's bounds, as the form set them.
async fn room_bounds(
    dashboard: &Dashboard,
    id: &ProductId,
    asked: &Action,
) -> Result<serde_json::Value, ApiError> {
    let change = crate::domain::BoundsChange::new(
        asked.ceiling_per_sec,
        asked.floor_per_sec,
        asked.active_cap,
        None,
    )?;
    let Some(room) = dashboard.desk.catalog.set_room_bounds(id, change).await? else {
        return Err(ApiError::NoWaitingRoom);
    };
    Ok(serde_json::json!({
        "product_id": id.as_str(),
        "ceiling_per_sec": room.ceiling,
        "floor_per_sec": room.floor,
        "active_cap": room.cap,
    }))
}

/// A new sale from the form, created and opened at once.
async fn create(
    dashboard: &Dashboard,
    id: &ProductId,
    product: Option<crate::http::operators::new_product::CreateProduct>,
) -> Result<(), ApiError> {
    let Some(product) = product else {
        return Err(ApiError::InvalidRequest(
            "create: the product is missing".into(),
        ));
    };
    let new = product.validate()?;
    if new.product_id != *id {
        return Err(ApiError::InvalidRequest("create: two product ids".into()));
    }
    dashboard.desk.catalog.create(&new).await?;
    dashboard.desk.catalog.open(id).await?;
    Ok(())
}
