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
//!   with the login form).
//! - Data: `GET /admin/dashboard/data`, polled by the page every second,
//!   answers the numbers read once per tick for every viewer ([`board`]).
//! - Assets: the page, its script and style are in the binary (no CDN),
//!   under a Content-Security-Policy that allows nothing else (`pages`).

pub mod board;
pub mod session;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq;

use std::sync::Arc;

use super::error::ApiError;
use super::limits::{self, Guards};
use super::pages::{asset, html};
pub use board::{Board, Dashboard};
use session::{COOKIE, COOKIE_PATH};

const PAGE: &str = include_str!("assets/dashboard.html");
const LOGIN: &str = include_str!("assets/login.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

/// The dashboard's routes, over its own state (merged into the API's
/// router with the admin routes); `guards` throttle the sign-ins.
pub fn routes<S>(dashboard: Arc<Dashboard>, guards: Arc<Guards>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/admin", get(|| async { see_other("/admin/dashboard") }))
        .route("/admin/dashboard", get(page))
        .route("/admin/dashboard/data", get(data))
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
async fn page(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    match signed_in(&dashboard, &headers) {
        Ok(()) => html(StatusCode::OK, PAGE),
        Err(_) => login_form(StatusCode::UNAUTHORIZED, None),
    }
}

/// `GET /admin/dashboard/data`: the latest numbers (JSON), 401 without a session.
async fn data(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    signed_in(&dashboard, &headers)?;
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

/// `POST /admin/login` (a form: `token=<ADMIN_TOKEN>`): the session cookie
/// and a redirect to the page, or the form again (401).
async fn login(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let expected = &*dashboard.admin_token;
    let presented = url::form_urlencoded::parse(&body)
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    // Constant time: the comparison must not reveal how much of a guess was right.
    if !bool::from(presented.as_bytes().ct_eq(expected.as_bytes())) {
        tracing::warn!("dashboard login refused: wrong token");
        return login_form(StatusCode::UNAUTHORIZED, Some("wrong token"));
    }
    let secure = if forwarded_https(&headers) {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; Max-Age={}; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict{secure}",
        dashboard.sessions.issue(),
        dashboard.sessions.lifetime().as_secs().max(1),
    );
    tracing::info!("dashboard login");
    with_cookie(see_other("/admin/dashboard"), &cookie)
}

/// `POST /admin/logout`: the cookie is dropped (the session itself ends at
/// its expiry; the cookie proves itself, there is no store to forget it).
async fn logout() -> Response {
    with_cookie(
        see_other("/admin/dashboard"),
        &format!("{COOKIE}=; Max-Age=0; Path={COOKIE_PATH}; HttpOnly; SameSite=Strict"),
    )
}

/// Whether the request carries a valid session cookie.
fn signed_in(dashboard: &Dashboard, headers: &HeaderMap) -> Result<(), ApiError> {
    let valid = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, value)| name == COOKIE && dashboard.sessions.valid(value));
    if valid {
        Ok(())
    } else {
        Err(ApiError::Unauthorized(
            "no dashboard session: log in at /admin/dashboard",
        ))
    }
}

fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn login_form(status: StatusCode, message: Option<&'static str>) -> Response {
    // The messages are this module's own constants: nothing to escape.
    let message = message.map_or(String::new(), |m| {
        format!("<p class=\"error\" role=\"alert\">{m}</p>")
    });
    html(status, LOGIN.replace("{{message}}", &message))
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
