//! The operator's live view of the open sales, served by the service itself
//! at `/admin/dashboard` (with the admin routes).
//!
//! - Login: a browser cannot send a bearer header when it navigates, so the
//!   page's form posts `ADMIN_TOKEN` once (in the body: never in a URL, and
//!   bodies are never logged) to `POST /admin/login`, which answers with a
//!   signed session cookie ([`session`]): `HttpOnly` (no script reads it),
//!   `SameSite=Strict` (no other site's page sends it), `Path=/admin`, and
//!   `Secure` when the request came through HTTPS (`X-Forwarded-Proto`).
//!   Without a valid cookie the page and its data answer 401 (the page
//!   with the login form). A logout ends the session for every instance
//!   (a copied cookie stops working); sign-ins, sign-outs and refused
//!   sign-ins are written to the admin log, with the client's address.
//! - Data: `GET /admin/dashboard/data`, polled by the page every second,
//!   answers the numbers read once per tick for every viewer ([`board`]).
//! - Assets: the page, its script and style are in the binary (no CDN),
//!   under a Content-Security-Policy that allows nothing else (`pages`).

pub mod board;
mod chart;
mod controls;
mod door;
mod report;
mod reports;
pub mod session;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq;

use std::sync::Arc;

use crate::http::error::ApiError;
use crate::http::pages::{asset, html};
use crate::http::transport::limits::{self};
use crate::store::AdminEntry;
pub use board::{Board, Dashboard};
use door::{FORGED, PageSignedIn, SignedIn, login_form, same_origin, signed_in};
use session::{COOKIE, COOKIE_PATH};

const PAGE: &str = include_str!("assets/dashboard.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

/// The dashboard's routes, over its own state (merged into the API's
/// router with the admin routes); the guards throttle the sign-ins.
pub fn routes<S>(dashboard: Arc<Dashboard>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let guards = dashboard.admin.guards().clone();
    Router::new()
        .route("/admin", get(|| async { see_other("/admin/dashboard") }))
        .route("/admin/dashboard", get(page))
        .route("/admin/dashboard/data", get(data))
        .route("/admin/dashboard/log", get(log))
        .route("/admin/dashboard/action", post(controls::act))
        .route("/admin/dashboard/report/{product_id}", get(report::page))
        .route("/admin/dashboard/reports", get(reports::index))
        .route("/admin/dashboard/reports/compare", get(reports::compare))
        .route("/admin/dashboard/reports.csv", get(reports::csv))
        .route(
            "/admin/login",
            // Throttled per address, as the lookups are.
            post(login).route_layer(from_fn_with_state(guards, limits::guard_lookup)),
        )
        .route("/admin/logout", post(logout))
        .route(
            "/admin/assets/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/admin/assets/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .with_state(dashboard)
}

/// `GET /admin/dashboard`: the page, or the login form (401) without a session.
async fn page(
    State(dashboard): State<Arc<Dashboard>>,
    PageSignedIn(session): PageSignedIn,
) -> Response {
    // The session's anti-CSRF token (hex) goes inside the page.
    html(
        StatusCode::OK,
        PAGE.replace("{{csrf}}", &dashboard.sessions.csrf(&session)),
    )
}

/// `GET /admin/dashboard/data`: the latest numbers (JSON), 401 without a session.
async fn data(State(dashboard): State<Arc<Dashboard>>, _: SignedIn) -> Result<Response, ApiError> {
    let json = dashboard.board.latest().await;
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        json.to_string(),
    )
        .into_response())
}

/// Entries of the admin log the page shows.
const LOG_SHOWN: u32 = 30;

/// `GET /admin/dashboard/log` (`?sale=` one sale's, `?before=` older than
/// an entry): the newest entries of the admin log (when, what, which sale,
/// who, from where, the answer, what was asked, the values before and
/// after), 401 without a session.
async fn log(
    State(dashboard): State<Arc<Dashboard>>,
    _: SignedIn,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let asked: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let before = asked.get("before").and_then(|b| b.parse::<i64>().ok());
    let sale = asked
        .get("sale")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let page = dashboard.admin.log().page(sale, before, LOG_SHOWN).await?;
    // The JSON the entry holds, as JSON (text that is not: as text).
    let json = |text: &Option<String>| -> serde_json::Value {
        text.as_deref().map_or(serde_json::Value::Null, |t| {
            serde_json::from_str(t).unwrap_or_else(|_| t.into())
        })
    };
    let entries: Vec<serde_json::Value> = page
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "id": e.id, "at": e.at, "action": e.action, "product_id": e.product_id,
                "actor": e.actor, "address": e.address, "status": e.status,
                "asked": json(&e.asked), "before": json(&e.before), "after": json(&e.after),
            })
        })
        .collect();
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        serde_json::json!({ "entries": entries }).to_string(),
    )
        .into_response())
}

/// `POST /admin/login` (a form: `token=<ADMIN_TOKEN>`): the session cookie
/// and a redirect to the page, or the form again (401).
async fn login(State(dashboard): State<Arc<Dashboard>>, parts: Parts, body: Bytes) -> Response {
    let headers = &parts.headers;
    let peer = crate::http::extract::peer(&parts.extensions);
    let expected = &*dashboard.admin_token;
    let presented = url::form_urlencoded::parse(&body)
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    let address = dashboard
        .admin
        .guards()
        .client_ip(headers, peer)
        .map(|ip| ip.to_string());
    // Constant time: the comparison must not reveal how much of a guess was right.
    if !bool::from(presented.as_bytes().ct_eq(expected.as_bytes())) {
        tracing::warn!(address = ?address, "dashboard login refused: wrong token");
        let entry = entry(
            "auth.failed",
            "none".into(),
            address,
            StatusCode::UNAUTHORIZED,
        );
        dashboard.admin.failed(entry).await;
        return login_form(StatusCode::UNAUTHORIZED, Some("wrong token"));
    }
    let secure = if forwarded_https(headers) {
        "; Secure"
    } else {
        ""
    };
    let issued = dashboard.sessions.issue();
    let cookie = format!(
        "{COOKIE}={issued}; Max-Age={}; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict{secure}",
        dashboard.sessions.lifetime().as_secs().max(1),
    );
    let actor = dashboard
        .sessions
        .read(&issued)
        .map_or_else(|| "none".to_owned(), |s| s.actor());
    tracing::info!(address = ?address, actor, "dashboard login");
    let entry = entry("dashboard.login", actor, address, StatusCode::SEE_OTHER);
    dashboard.admin.write(entry).await;
    with_cookie(see_other("/admin/dashboard"), &cookie)
}

/// `POST /admin/logout`: the session ends for every instance (its nonce
/// kept in the books until it would have expired) and the cookie is
/// dropped.
async fn logout(State(dashboard): State<Arc<Dashboard>>, parts: Parts) -> Response {
    let headers = &parts.headers;
    let peer = crate::http::extract::peer(&parts.extensions);
    if !same_origin(&parts) {
        // Another site's page cannot end the operator's session (nor log
        // that it did): refused, and written down.
        let actor = match signed_in(&dashboard, headers).await {
            Ok(session) => session.actor(),
            Err(_) => "none".to_owned(),
        };
        let address = dashboard
            .admin
            .guards()
            .client_ip(headers, peer)
            .map(|ip| ip.to_string());
        let forged = entry(FORGED, actor, address, StatusCode::FORBIDDEN);
        dashboard.admin.write(forged).await;
        return ApiError::Forbidden("a sign-out must come from the dashboard's own page")
            .into_response();
    }
    if let Ok(session) = signed_in(&dashboard, headers).await {
        {
            let mut ended = dashboard.ended.lock().unwrap_or_else(|e| e.into_inner());
            let now = crate::domain::now_ms();
            ended.retain(|_, expires| *expires > now);
            ended.insert(session.nonce.clone(), session.expires_ms);
        }
        if let Err(e) = dashboard
            .admin
            .log()
            .end_session(&session.nonce, session.expires_ms)
            .await
        {
            tracing::warn!(error = %crate::domain::Chain(&e),
                "a dashboard logout not kept in the books: other instances accept its cookie until it expires");
        }
        let address = dashboard
            .admin
            .guards()
            .client_ip(headers, peer)
            .map(|ip| ip.to_string());
        let entry = entry(
            "dashboard.logout",
            session.actor(),
            address,
            StatusCode::SEE_OTHER,
        );
        dashboard.admin.write(entry).await;
    }
    with_cookie(
        see_other("/admin/dashboard"),
        &format!("{COOKIE}=; Max-Age=0; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict"),
    )
}

/// An admin log entry of the dashboard's.
fn entry(action: &str, actor: String, address: Option<String>, status: StatusCode) -> AdminEntry {
    AdminEntry {
        address,
        ..AdminEntry::new(action, actor, i32::from(status.as_u16()))
    }
}

fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
