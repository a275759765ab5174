//! The OpenAPI 3 document of the routes, generated from the handlers'
//! annotations (so it cannot drift from them) and served at `/openapi.json`.
//!
//! Each handler declares its own success and domain answers; the answers
//! every route of a kind can give (a malformed path or query, too many
//! headers, a timeout; a body too large or not JSON; a missing admin token;
//! a rate limit or shedding on the order path) are added here, in one place,
//! from the same rules the router and the guards apply.

use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi as Document, Ref, RefOr, Schema};
use utoipa::{Modify, OpenApi};

use super::buyers::{health, orders, payments, products, room};
use super::error::{Code, status};
use super::operators::{admin_log, events, report, room_pace, sales};
use crate::sale::SCRIPT_REFUSALS;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale",
        description = "A flash-sale order service: one atomic Lua script in Redis decides every order; Redis Streams carry accepted orders to MySQL.\n\nEvery error answer is `{\"error\": \"<code>\", \"message\": \"...\"}`; `error` is one of the codes of the `ErrorBody` schema."
    ),
    paths(
        health::healthz,
        health::readyz,
        products::get,
        sales::create,
        sales::open,
        sales::audit,
        report::json,
        report::csv,
        sales::close,
        sales::pause,
        sales::resume,
        sales::restock,
        orders::place::place,
        orders::get,
        orders::pay,
        orders::cancel,
        payments::notify,
        events::list,
        events::dead,
        events::replay,
        admin_log::list,
        orders::list_for_user,
        room::join,
        room::challenge,
        room::standing,
        room_pace::set_pace,
    ),
    components(schemas(super::error::ErrorBody)),
    modifiers(&CommonAnswers)
)]
struct ApiDoc;

/// The document, built once.
pub fn document() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

/// `GET /openapi.json`
pub async fn openapi_json() -> Response {
    static JSON: OnceLock<String> = OnceLock::new();
    let body = JSON.get_or_init(|| {
        let mut doc = serde_json::to_value(document())
            .unwrap_or_else(|_| unreachable!("a document serializes"));
        camel_case_links(&mut doc);
        doc.to_string()
    });
    ([(header::CONTENT_TYPE, "application/json")], body.as_str()).into_response()
}

struct CommonAnswers;

impl Modify for CommonAnswers {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("ADMIN_TOKEN"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "buyer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A JWT naming the buyer (claim `sub` by default), signed with the configured secret or key. Behind a gateway that authenticates buyers, its user header (`AUTH_USER_HEADER`) is used instead, from the gateway's addresses only. A server run with `AUTH=none` verifies nobody and takes `user_id` from the body.",
                    ))
                    .build(),
            ),
        );
        // The `error` field: exactly the codes the API answers.
        let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        components.schemas.insert(
            "ErrorBody".into(),
            RefOr::T(Schema::Object(
                ObjectBuilder::new()
                    .description(Some("The body of every error answer."))
                    .property(
                        "error",
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .enum_values(Some(codes))
                            .description(Some("Machine-readable code")),
                    )
                    .required("error")
                    .property(
                        "message",
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .description(Some("For a human; may change")),
                    )
                    .required("message")
                    .property(
                        "starts_at",
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                            .description(Some(
                                "`sale_not_started` only: when the sale opens (epoch ms, by the server's clock); the `Retry-After` header says the seconds until then",
                            )),
                    )
                    .build(),
            )),
        );
        add_links(doc);
        for (path, item) in doc.paths.paths.iter_mut() {
            for (method, op) in [
                (HttpMethod::Get, item.get.as_mut()),
                (HttpMethod::Post, item.post.as_mut()),
            ] {
                if let Some(op) = op {
                    if path == "/api/orders" && method == HttpMethod::Post {
                        name_the_sales_refusals(op);
                    }
                    add_common(path, method, op);
                }
            }
        }
    }
}

/// Which operations an answer of every route applies to.
#[derive(Clone, Copy)]
enum Applies {
    Every,
    /// Routes with a path, query or body to parse.
    Parsed,
    WithBody,
    Admin,
    /// The buyer's routes (a JWT or a gateway's header).
    Buyer,
    /// The buyer's routes other than `POST /api/orders` (lookups, joins).
    BuyerLookup,
    Poll,
    PlaceOrder,
}

/// The answers every route may give, beside its own.
const COMMON: [(Applies, u16, &str); 10] = [
    (
        Applies::Every,
        431,
        "`headers_too_large`: too many or too large request headers",
    ),
    (
        Applies::Parsed,
        400,
        "`invalid_request`: a malformed path, query or body; nothing changed",
    ),
    (Applies::WithBody, 413, "`payload_too_large`"),
    (
        Applies::WithBody,
        415,
        "`unsupported_media_type`: the body must be `application/json`",
    ),
    (
        Applies::Admin,
        401,
        "`unauthorized`: missing or wrong `Authorization: Bearer <ADMIN_TOKEN>`",
    ),
    (
        Applies::Buyer,
        401,
        "`unauthorized`: no credential, or one that does not verify (malformed, bad signature, expired, not yet valid, another issuer or audience, an algorithm not accepted)",
    ),
    (
        Applies::BuyerLookup,
        429,
        "`rate_limited`: too many lookups or joins from this address; retry after `Retry-After`",
    ),
    (
        Applies::Poll,
        429,
        "`rate_limited`: too many polls from this address; retry after `Retry-After`",
    ),
    (
        Applies::PlaceOrder,
        429,
        "`rate_limited`: too many orders from this user or address; retry after `Retry-After`",
    ),
    (
        Applies::PlaceOrder,
        503,
        "`overloaded`: more orders in flight than the service decides at once (shed at once: nothing waits), or `unavailable`: a dependency did not answer in time; retry after `Retry-After`",
    ),
];

/// The 503 of every route but the order route's (which sheds, too).
const UNAVAILABLE: &str =
    "`unavailable`: Redis or MySQL did not answer in time; retry after `Retry-After`";

impl Applies {
    fn to(self, path: &str, method: &HttpMethod, op: &Operation) -> bool {
        let has_params =
            path.contains('{') || op.parameters.as_ref().is_some_and(|p| !p.is_empty());
        let buyer = path.starts_with("/api/orders")
            || path.starts_with("/api/users/")
            || path == "/api/sales/{product_id}/queue";
        let place_order = path == "/api/orders" && *method == HttpMethod::Post;
        match self {
            Self::Every => true,
            Self::Parsed => has_params || op.request_body.is_some(),
            Self::WithBody => op.request_body.is_some(),
            Self::Admin => path.starts_with("/api/admin/"),
            Self::Buyer => buyer,
            Self::BuyerLookup => buyer && path != "/api/orders",
            Self::Poll => path == "/api/sales/{product_id}/queue/{ticket}",
            Self::PlaceOrder => place_order,
        }
    }
}

/// `POST /api/orders`'s 409: the refusals the order script decides, named
/// from its table ([`SCRIPT_REFUSALS`]), so a refusal added there is
/// documented here.
fn name_the_sales_refusals(op: &mut Operation) {
    let conflict = StatusCode::CONFLICT;
    let codes: Vec<String> = SCRIPT_REFUSALS
        .iter()
        .filter(|(_, code)| status(*code) == conflict)
        .map(|(_, code)| format!("`{}`", code.as_str()))
        .collect();
    if let Some(RefOr::T(response)) = op.responses.responses.get_mut("409") {
        response.description = format!(
            "Refused by the sale: {}. `sale_not_started` carries `starts_at` (epoch ms); it and `sale_paused` carry a `Retry-After` header",
            codes.join(", ")
        );
    }
}

fn add_common(path: &str, method: HttpMethod, op: &mut Operation) {
    let mut answers: Vec<(u16, &str)> = COMMON
        .iter()
        .filter(|(applies, ..)| applies.to(path, &method, op))
        .map(|&(_, status, description)| (status, description))
        .collect();
    answers.push((503, UNAVAILABLE));
    let responses = &mut op.responses.responses;
    for (status, description) in answers {
        let status = status.to_string();
        if responses.contains_key(&status) {
            continue;
        }
        let mut response = ResponseBuilder::new().description(description).content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        );
        if status == "401" {
            response = response.header(
                "WWW-Authenticate",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::String))
                    .description(Some("`Bearer`"))
                    .build(),
            );
        }
        if status == "503" || status == "429" {
            response = response.header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::Integer))
                    .description(Some("Seconds to wait before retrying"))
                    .build(),
            );
        }
        responses.insert(status, RefOr::T(response.build()));
    }
}

/// Path, status and method of an answer, and the links to add to it.
type LinksFrom = (
    &'static str,
    &'static str,
    &'static str,
    Vec<(&'static str, Link)>,
);

/// Links from the answers that make ids to the operations that take them,
/// so clients (and stateful fuzzers) can follow a sale from creation to order.
fn add_links(doc: &mut Document) {
    use serde_json::json;
    let product = "$response.body#/product_id";
    let order = "$response.body#/order_id";
    let user = json!({"user_id": "$response.body#/user_id"});
    let links: [LinksFrom; 3] = [
        (
            "/api/admin/products",
            "201",
            "post",
            vec![
                (
                    "GetProduct",
                    link("get_product").parameter("product_id", product).build(),
                ),
                (
                    "OpenSale",
                    link("open_sale").parameter("product_id", product).build(),
                ),
                (
                    "AuditSale",
                    link("audit_sale").parameter("product_id", product).build(),
                ),
            ],
        ),
        (
            "/api/admin/products/{product_id}/open",
            "200",
            "post",
            vec![(
                "PlaceOrder",
                link("place_order")
                    .request_body(Some(
                        json!({"user_id": 1, "product_id": product, "quantity": 1}),
                    ))
                    .build(),
            )],
        ),
        (
            "/api/orders",
            "202",
            "post",
            vec![
                (
                    "GetOrder",
                    link("get_order").parameter("order_id", order).build(),
                ),
                (
                    "PayOrder",
                    link("pay_order")
                        .parameter("order_id", order)
                        .request_body(Some(user.clone()))
                        .build(),
                ),
                (
                    "CancelOrder",
                    link("cancel_order")
                        .parameter("order_id", order)
                        .request_body(Some(user.clone()))
                        .build(),
                ),
            ],
        ),
    ];
    for (path, status, method, named) in links {
        let op = doc.paths.paths.get_mut(path).and_then(|item| match method {
            "post" => item.post.as_mut(),
            _ => item.get.as_mut(),
        });
        if let Some(RefOr::T(response)) = op.and_then(|op| op.responses.responses.get_mut(status)) {
            for (name, l) in named {
                response.links.insert(name.to_owned(), RefOr::T(l));
            }
        }
    }
}

fn link(operation_id: &str) -> LinkBuilder {
    LinkBuilder::new().operation_id(operation_id)
}

/// utoipa 5 writes a link's fields in snake case (`operation_id`); OpenAPI
/// spells them `operationId`, `requestBody`.
fn camel_case_links(doc: &mut serde_json::Value) {
    use serde_json::Value;
    match doc {
        Value::Object(map) => {
            if let Some(Value::Object(links)) = map.get_mut("links") {
                for link in links.values_mut() {
                    if let Value::Object(fields) = link {
                        for (from, to) in [
                            ("operation_id", "operationId"),
                            ("operation_ref", "operationRef"),
                            ("request_body", "requestBody"),
                        ] {
                            if let Some(v) = fields.remove(from) {
                                fields.insert(to.to_owned(), v);
                            }
                        }
                    }
                }
            }
            map.values_mut().for_each(camel_case_links);
        }
        Value::Array(items) => items.iter_mut().for_each(camel_case_links),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order's 409 names every refusal of the script's table that
    /// answers 409, from the table itself.
    #[test]
    fn the_orders_conflict_names_every_refusal_of_the_script() {
        let doc = serde_json::to_value(document()).unwrap();
        let description = doc["paths"]["/api/orders"]["post"]["responses"]["409"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // The list itself, not the notes after it.
        let listed = description
            .strip_prefix("Refused by the sale: ")
            .and_then(|rest| rest.split_once(". "))
            .map_or("", |(list, _)| list);
        for code in [
            Code::SaleNotStarted,
            Code::SaleEnded,
            Code::SalePaused,
            Code::SoldOut,
            Code::InsufficientStock,
            Code::LimitExceeded,
        ] {
            assert!(
                listed.contains(&format!("`{}`", code.as_str())),
                "{description}"
            );
        }
        assert!(!listed.contains("admission_required"), "{description}");
    }
}
