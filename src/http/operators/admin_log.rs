//! The admin log's door in the API: every admin route's answer goes
//! through [`record`], which writes one entry per action (what, which sale,
//! what was asked, the values before (a handler's [`Before`]) and after
//! (the answer), who, from where) and one per failed admin authentication
//! (rate-limited: a flood of wrong tokens cannot flood the books; all are
//! counted in `flashsale_admin_auth_failures_total`); and
//! `GET /api/admin/log`, the log, newest first, a page at a time.
//!
//! An entry is written after the action (its outcome is part of it); one
//! that cannot be written (MySQL down) is logged whole at ERROR instead.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, to_bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use prometheus::IntCounter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use crate::domain::{Chain, hex};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{Admin, QueryParams};
use crate::http::transport::body::MAX_BODY_BYTES;
use crate::http::transport::limits::Guards;
use crate::store::{AdminEntry, AdminLog};

/// The values an action changed, as they were before it (JSON): a handler
/// puts it in its answer's extensions for [`record`].
#[derive(Debug, Clone)]
pub struct Before(pub serde_json::Value);

/// Failed admin authentications written per second at most (beyond, only
/// counted), and in a burst.
const FAILURES_PER_SEC: u32 = 5;
const FAILURES_BURST: u32 = 20;

/// The most an answer's body kept as "after" may be.
const MAX_AFTER_BYTES: usize = 64 * 1024;

/// The admin log as the HTTP layer writes it: the log, who the client is
/// (the guards' reading of its address), and the failed authentications'
/// count and pace.
pub struct AdminDoor {
    log: AdminLog,
    guards: Arc<Guards>,
    failures: DefaultDirectRateLimiter,
    /// `flashsale_admin_auth_failures_total`.
    failed: IntCounter,
}

impl AdminDoor {
    pub fn new(log: AdminLog, guards: Arc<Guards>, failed: IntCounter) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(FAILURES_PER_SEC).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(FAILURES_BURST).unwrap_or(NonZeroU32::MIN));
        Self {
            log,
            guards,
            failures: RateLimiter::direct(quota),
            failed,
        }
    }

    pub fn log(&self) -> &AdminLog {
        &self.log
    }

    /// Who the client is (its address, as the limits see it).
    pub fn guards(&self) -> &Arc<Guards> {
        &self.guards
    }

    /// Writes `entry`; a failure is logged with the entry, not returned
    /// (the action is done).
    pub async fn write(&self, entry: AdminEntry) {
        if let Err(e) = self.log.record(&entry).await {
            tracing::error!(action = %entry.action, actor = %entry.actor, product_id = ?entry.product_id,
                address = ?entry.address, status = entry.status, asked = ?entry.asked,
                before = ?entry.before, after = ?entry.after, error = %Chain(&e),
                "an admin action not written to the admin log");
        }
    }

    /// Counts a failed admin authentication, and writes it unless too
    /// many came lately.
    pub async fn failed(&self, entry: AdminEntry) {
        self.failed.inc();
        if self.failures.check().is_ok() {
            self.write(entry).await;
        }
    }
}

/// The SHA-256 of a credential, cut to 12 hex digits: names it in the log
/// without telling it.
pub fn fingerprint(secret: &[u8]) -> String {
    hex(&Sha256::digest(secret)[..6])
}

/// Who presents the request's `Authorization: Bearer`.
fn bearer_actor(headers: &HeaderMap) -> String {
    crate::http::extract::bearer(headers).map_or_else(
        || "none".to_owned(),
        |t| format!("token:{}", fingerprint(t)),
    )
}

/// An admin action, named once for the log whichever door it came
/// through (the admin API's route, the dashboard's control). The
/// dashboard's controls send the lowercase variant (`"restock"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminAction {
    Create,
    Open,
    Close,
    Pause,
    Resume,
    Restock,
    Room,
    Replay,
}

impl AdminAction {
    /// Its name in the admin log.
    pub fn name(self) -> &'static str {
        match self {
            Self::Create => "product.create",
            Self::Open => "sale.open",
            Self::Close => "sale.close",
            Self::Pause => "sale.pause",
            Self::Resume => "sale.resume",
            Self::Restock => "sale.restock",
            Self::Room => "room.bounds",
            Self::Replay => "events.replay",
        }
    }

    /// The action of an admin API route, by its method and path.
    fn of_route(method: &Method, path: &str) -> Option<Self> {
        Some(match (method.as_str(), path) {
            ("POST", "/api/admin/products") => Self::Create,
            ("POST", "/api/admin/products/{product_id}/open") => Self::Open,
            ("POST", "/api/admin/products/{product_id}/close") => Self::Close,
            ("POST", "/api/admin/products/{product_id}/pause") => Self::Pause,
            ("POST", "/api/admin/products/{product_id}/resume") => Self::Resume,
            ("POST", "/api/admin/products/{product_id}/restock") => Self::Restock,
            ("POST", "/api/admin/products/{product_id}/room") => Self::Room,
            ("POST", "/api/admin/events/dead/replay") => Self::Replay,
            _ => return None,
        })
    }
}

/// The admin log's name for a request to an admin route: its action's,
/// or the method and route for the others.
fn action(method: &Method, path: &str) -> String {
    AdminAction::of_route(method, path)
        .map_or_else(|| format!("{method} {path}"), |a| a.name().to_owned())
}

/// The sale a request's path names (`/api/admin/products/<id>/...`), or
/// the one its body names (`product_id`, creating a product).
fn sale_of(path: &str, asked: Option<&str>) -> Option<String> {
    let mut parts = path.trim_start_matches('/').split('/');
    if let (Some("api"), Some("admin"), Some("products"), Some(id)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    {
        return Some(id.to_owned());
    }
    let body: serde_json::Value = serde_json::from_str(asked?).ok()?;
    body["product_id"].as_str().map(str::to_owned)
}

/// Around every admin route: the action and its answer, written to the
/// admin log (reads are not actions: only their failed authentications
/// are written).
pub async fn record(State(door): State<Arc<AdminDoor>>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let path = req.uri().path().to_owned();
    let actor = bearer_actor(req.headers());
    let address = door
        .guards
        .client_ip(req.headers(), crate::http::extract::peer(req.extensions()))
        .as_ref()
        .map(IpAddr::to_string);
    let (parts, body) = req.into_parts();
    // Read whole already (the guards read every body): small, in memory.
    let Ok(bytes) = to_bytes(body, MAX_BODY_BYTES).await else {
        return ApiError::InvalidRequest("the body could not be read".into()).into_response();
    };
    let asked = (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned());
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status();
    let mut entry = AdminEntry {
        product_id: sale_of(&path, asked.as_deref()),
        address,
        ..AdminEntry::new(
            action(&method, route.as_deref().unwrap_or(&path)),
            actor,
            i32::from(status.as_u16()),
        )
    };
    if status == StatusCode::UNAUTHORIZED {
        entry.action = "auth.failed".into();
        door.failed(entry).await;
        return response;
    }
    if method == Method::GET || method == Method::HEAD {
        return response;
    }
    entry.asked = asked;
    entry.before = response
        .extensions()
        .get::<Before>()
        .map(|b| b.0.to_string());
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, usize::MAX).await.unwrap_or_default();
    if status.is_success() && bytes.len() <= MAX_AFTER_BYTES {
        entry.after = Some(String::from_utf8_lossy(&bytes).into_owned());
    }
    door.write(entry).await;
    Response::from_parts(parts, Body::from(bytes))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Entries older than this one (the last page's `next`; absent: the
    /// newest).
    #[param(minimum = 1)]
    before: Option<i64>,
    /// At most this many (default 50, at most 500).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// One entry of the admin log.
#[derive(Serialize, ToSchema)]
pub struct LogEntry {
    id: i64,
    /// When (epoch ms).
    at: i64,
    /// `product.create`, `sale.open`, `sale.close`, `room.bounds`,
    /// `events.replay`, `sale.recover`, `dashboard.login`,
    /// `dashboard.logout`, `auth.failed`, ...
    action: String,
    product_id: Option<String>,
    /// `token:<fingerprint>`, `session:<id>`, `cli:<user>@<host>`, `none`.
    actor: String,
    address: Option<String>,
    /// The answer's HTTP status (0: the command line).
    status: i32,
    /// What was asked, the values before and after: JSON as sent and
    /// answered (a body that was not JSON: as text).
    asked: Option<serde_json::Value>,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
}

impl From<AdminEntry> for LogEntry {
    fn from(e: AdminEntry) -> Self {
        // Kept as text; shown as JSON when it is (a body that was not
        // stays a string).
        let json = |s: Option<String>| {
            s.map(|s| serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s)))
        };
        Self {
            id: e.id,
            at: e.at,
            action: e.action,
            product_id: e.product_id,
            actor: e.actor,
            address: e.address,
            status: e.status,
            asked: json(e.asked),
            before: json(e.before),
            after: json(e.after),
        }
    }
}

/// A page of the admin log, newest first.
#[derive(Serialize, ToSchema)]
pub struct LogPage {
    entries: Vec<LogEntry>,
    /// The cursor for the next (older) page: the last entry's id (`None`:
    /// no older entry).
    next: Option<i64>,
}

const MAX_ENTRIES: u32 = 500;

/// `GET /api/admin/log`
#[utoipa::path(
    get,
    path = "/api/admin/log",
    operation_id = "admin_log",
    tag = "admin",
    summary = "Every admin action and failed admin authentication, newest first",
    description = "Through any door: the admin API, the dashboard, the command line. Who is a fingerprint of the credential (never the secret) or a dashboard session.",
    params(LogParams),
    security(("admin" = [])),
    responses(
        (status = 200, description = "OK", body = LogPage),
        (status = 400, description = "`invalid_request`: a limit outside 1..=500, a cursor below 1", body = ErrorBody),
    )
)]
pub async fn list(
    _: Admin,
    State(door): State<Arc<AdminDoor>>,
    QueryParams(params): QueryParams<LogParams>,
) -> Result<Json<LogPage>, ApiError> {
    let limit = params.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_ENTRIES || params.before.is_some_and(|b| b < 1) {
        return Err(ApiError::InvalidRequest(format!(
            "before must be at least 1, limit between 1 and {MAX_ENTRIES}"
        )));
    }
    let entries = door.log().page(None, params.before, limit).await?;
    let next = (entries.len() == limit as usize)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(LogPage {
        entries: entries.into_iter().map(LogEntry::from).collect(),
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_named_and_sales_found() {
        assert_eq!(
            action(&Method::POST, "/api/admin/products/{product_id}/open"),
            "sale.open"
        );
        assert_eq!(
            action(&Method::DELETE, "/api/admin/x"),
            "DELETE /api/admin/x"
        );
        assert_eq!(
            sale_of("/api/admin/products/sku-1/close", None).as_deref(),
            Some("sku-1")
        );
        assert_eq!(
            sale_of("/api/admin/products", Some(r#"{"product_id":"sku-2"}"#)).as_deref(),
            Some("sku-2")
        );
        assert_eq!(sale_of("/api/admin/events/dead/replay", None), None);
    }

    #[test]
    fn a_fingerprint_names_a_credential_without_telling_it() {
        let f = fingerprint(b"3f9a1c0b7e2d4a6f8b5c1e0d");
        assert_eq!(f.len(), 12);
        assert_eq!(f, fingerprint(b"3f9a1c0b7e2d4a6f8b5c1e0d"));
        assert_ne!(f, fingerprint(b"3f9a1c0b7e2d4a6f8b5c1e0e"));
    }
}
