//! The buyer's page of a sale, served by the service itself at
//! `GET /sale/{product_id}`: a countdown to the start, the waiting room
//! (join, place, an estimated wait, the admission), the order and its way
//! to `confirmed`.
//!
//! - The page is a client of the public JSON API like any other (the
//!   product, the room's join and polls, `POST /api/orders`, the order's
//!   lookup): it has no route or data of its own, so it can show nothing a
//!   buyer's script could not see.
//! - Static: the HTML is rendered once, when the router is built; the
//!   product id reaches the page only through the URL path, which the
//!   script reads. A request costs no Redis or MySQL call, so a malformed
//!   id is answered with the API's 404 `product_not_found`, and a well
//!   formed one nobody sells by the page itself, with the product route's
//!   404 message.
//! - Who is buying: the server renders how identity works into the page
//!   (`data-auth`): `none` (`AUTH=none`, a local trial: the page asks for
//!   a user id and sends it in the bodies) or `buyer` (verified buyers: the
//!   embedding shop hands a bearer token in the URL's fragment,
//!   `/sale/{id}#token=<jwt>`, which the script takes out of the address
//!   bar and sends as `Authorization: Bearer`; without one, the requests go
//!   as they are, for a gateway that names the buyer in its own header).
//! - Assets: the page, its script and style are in the binary (no CDN),
//!   under the pages' Content-Security-Policy (`pages`).

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;

use crate::http::error::ApiError;
use crate::http::extract::{PathParam, product_in_path};
use crate::http::pages::{asset, html};

const PAGE: &str = include_str!("assets/sale.html");
/// The page's scripts, each served at `/sale/assets/<name>`, in the order
/// the page loads them: the proof of work, the waiting room, the page.
const SCRIPTS: [(&str, &str); 3] = [
    ("pow.js", include_str!("assets/pow.js")),
    ("room.js", include_str!("assets/room.js")),
    ("sale.js", include_str!("assets/sale.js")),
];
const STYLE: &str = include_str!("assets/sale.css");

/// How the page identifies its buyer, rendered into it as `data-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// `AUTH=none`: the page asks for a user id.
    UserIdField,
    /// Verified buyers: a bearer token from the URL's fragment, or a
    /// gateway's header.
    Verified,
}

impl Identity {
    fn attribute(self) -> &'static str {
        match self {
            Self::UserIdField => "none",
            Self::Verified => "buyer",
        }
    }
}

/// The page's routes (public: no session; the router's per-request guards
/// apply, as to every route).
pub fn routes<S>(identity: Identity) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    // Rendered once: every answer shares these bytes.
    let page = Bytes::from(PAGE.replace("{{auth}}", identity.attribute()));
    let router = Router::new()
        .route(
            "/sale/{product_id}",
            get(move |id: PathParam<String>| async move { sale_page(&page, &id.0) }),
        )
        .route(
            "/sale/assets/sale.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        );
    SCRIPTS.iter().fold(router, |router, &(name, script)| {
        router.route(
            &format!("/sale/assets/{name}"),
            get(move || async move { asset("text/javascript; charset=utf-8", script) }),
        )
    })
}

/// `GET /sale/{product_id}`: the page, for any well-formed id (the script
/// asks the API whether it is on sale).
fn sale_page(page: &Bytes, product_id: &str) -> Result<Response, ApiError> {
    product_in_path(product_id)?;
    Ok(html(StatusCode::OK, page.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_or_style_and_names_its_assets() {
        // Every script, in its order, and nothing else.
        let tags: Vec<String> = SCRIPTS
            .iter()
            .map(|(name, _)| format!(r#"<script src="/sale/assets/{name}" defer></script>"#))
            .collect();
        assert!(PAGE.contains(&tags.join("\n")), "{PAGE}");
        assert!(PAGE.contains(r#"<link rel="stylesheet" href="/sale/assets/sale.css">"#));
        // The CSP would block them: the page must not need them.
        assert_eq!(PAGE.matches("<script").count(), SCRIPTS.len());
        assert!(!PAGE.contains("<style"));
        assert!(!PAGE.contains(" style="));
        for handler in ["onclick=", "onload=", "oninput=", "onsubmit=", "onchange="] {
            assert!(
                !PAGE.contains(handler),
                "no inline event handlers: {handler}"
            );
        }
        assert_eq!(PAGE.matches("{{auth}}").count(), 1);
    }
}
