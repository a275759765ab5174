//! Who may look: the dashboard session a request carries (its cookie, not
//! ended by a logout here or on any instance), and the form to sign in.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::board::Dashboard;
use super::session::{COOKIE, Session};
use crate::http::error::ApiError;
use crate::http::pages::html;

const LOGIN: &str = include_str!("assets/login.html");

/// The request's session, if its cookie is valid and no logout ended it
/// (here, or on any instance: asked of the books; when they cannot be
/// asked, only this instance's logouts are known).
pub(super) async fn signed_in(
    dashboard: &Dashboard,
    headers: &HeaderMap,
) -> Result<Session, ApiError> {
    let refused = ApiError::Unauthorized("no dashboard session: log in at /admin/dashboard");
    let session = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .find_map(|(_, value)| dashboard.sessions.read(value));
    let Some(session) = session else {
        return Err(refused);
    };
    let ended_here = dashboard
        .ended
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&session.nonce);
    if ended_here {
        return Err(refused);
    }
    match dashboard.admin.log().session_ended(&session.nonce).await {
        Ok(true) => Err(refused),
        Ok(false) => Ok(session),
        Err(e) => {
            tracing::warn!(error = %crate::domain::Chain(&e),
                "cannot ask the books whether a dashboard session was ended: accepted");
            Ok(session)
        }
    }
}

/// A dashboard request signed in (see [`signed_in`]); without a session,
/// 401 `unauthorized` (the JSON routes).
pub(super) struct SignedIn(pub Session);

impl FromRequestParts<Arc<Dashboard>> for SignedIn {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        dashboard: &Arc<Dashboard>,
    ) -> Result<Self, Self::Rejection> {
        signed_in(dashboard, &parts.headers).await.map(Self)
    }
}

/// A dashboard page signed in; without a session, the login form (401):
/// a page answers it, not a JSON 401.
pub(super) struct PageSignedIn(pub Session);

impl FromRequestParts<Arc<Dashboard>> for PageSignedIn {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        dashboard: &Arc<Dashboard>,
    ) -> Result<Self, Self::Rejection> {
        (signed_in(dashboard, &parts.headers).await)
            .map(Self)
            .map_err(|_| login_form(StatusCode::UNAUTHORIZED, None))
    }
}

pub(super) fn login_form(status: StatusCode, message: Option<&'static str>) -> Response {
    // The messages are this module's own constants: nothing to escape.
    let message = message.map_or(String::new(), |m| {
        format!("<p class=\"error\" role=\"alert\">{m}</p>")
    });
    html(status, LOGIN.replace("{{message}}", &message))
}

/// The request's `Origin` is this host's (or absent: a browser sends it
/// on every cross-site POST, so an absent one is not cross-site).
pub(super) fn same_origin(parts: &Parts) -> bool {
    let Some(origin) = parts.headers.get(header::ORIGIN) else {
        return true;
    };
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    origin.to_str().ok().is_some_and(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
            .is_some_and(|rest| rest == host)
    })
}

/// The admin log's name for a post refused as forged (without the page's
/// token, or from another origin).
pub(super) const FORGED: &str = "dashboard.forged";
