//! Extractors that answer bad input in the API's own error format.

use std::sync::Arc;

use axum::body::Bytes;

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, header, request::Parts};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

use super::auth::{Auth, Caller};
use super::error::ApiError;
use crate::domain::ProductId;

/// A JSON body. Unlike `axum::Json`, a rejection names the offending field
/// (`quantity: invalid type: string "x", expected u64`) and uses the API's
/// error body; too large a body is a 413. A body that may be left out is a
/// `JsonBody<Option<T>>`: no bytes at all, or JSON `null` (the OpenAPI
/// document's optional body), is `None`; when sent, it is checked as any.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = is_json(req.headers());
        let bytes = Bytes::from_request(req, state).await?;
        let left_out = bytes.is_empty() || (is_json && bytes.trim_ascii() == b"null");
        if left_out && let Ok(none) = serde_json::from_value::<T>(serde_json::Value::Null) {
            return Ok(Self(none));
        }
        parse(is_json, &bytes).map(Self)
    }
}

/// The peer address `serve` puts on the router's requests (`None` when a
/// request did not come through it).
pub fn peer(extensions: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|axum::extract::ConnectInfo(addr)| *addr)
}

/// A body read already, checked as [`JsonBody`] checks it.
pub fn json<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T, ApiError> {
    parse(is_json(headers), bytes)
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    // What nearly every client sends, compared first.
    if value.as_bytes() == b"application/json" {
        return true;
    }
    value.to_str().is_ok_and(|ct| {
        let mime = ct.split(';').next().unwrap_or("").trim();
        mime.eq_ignore_ascii_case("application/json")
    })
}

fn parse<T: DeserializeOwned>(is_json: bool, bytes: &[u8]) -> Result<T, ApiError> {
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    // serde would also read a struct from a JSON array; the API takes objects only.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::InvalidRequest(
            "body must be a JSON object".into(),
        ));
    }
    // The plain parse is the fast path; only a refused body is parsed
    // again, tracking the path, to name the field in the message.
    serde_json::from_slice(bytes).map_err(|_| explain::<T>(bytes))
}

/// Why `bytes` is not a `T`, naming the field.
fn explain<T: DeserializeOwned>(bytes: &[u8]) -> ApiError {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(_) => ApiError::InvalidRequest("body: malformed JSON".into()),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." || path == "?" {
                ApiError::InvalidRequest(format!("body: {inner}"))
            } else {
                ApiError::InvalidRequest(format!("{path}: {inner}"))
            }
        }
    }
}

/// The `Idempotency-Key` header, validated (read without copying the header map).
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get("idempotency-key") else {
            return Ok(Self(None));
        };
        let text = value.to_str().map_err(|_| {
            ApiError::InvalidRequest("Idempotency-Key must be visible ASCII".into())
        })?;
        Ok(Self(Some(crate::domain::idempotency_key(text)?.to_owned())))
    }
}

/// A path parameter, rejected in the API's error format.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct PathParam<T>(pub T);

/// The sale a route's path names (`{product_id}`). An id the service could
/// never have created is simply not found: 404 `product_not_found`. Its
/// OpenAPI parameter states [`ProductId::PATTERN`], the domain's rule.
pub struct SalePath(pub ProductId);

impl<S: Send + Sync> FromRequestParts<S> for SalePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let PathParam(text) = PathParam::<String>::from_request_parts(parts, state).await?;
        product_in_path(&text).map(Self)
    }
}

/// The product id of a path with more parameters than [`SalePath`]'s.
pub fn product_in_path(text: &str) -> Result<ProductId, ApiError> {
    ProductId::parse(text).map_err(|_| ApiError::ProductNotFound("no product with this id"))
}

impl utoipa::IntoParams for SalePath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::{ObjectBuilder, Required, Type};
        vec![
            ParameterBuilder::new()
                .name("product_id")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some("The sale's product id"))
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some(ProductId::PATTERN)),
                ))
                .build(),
        ]
    }
}

/// Query parameters, rejected in the API's error format.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct QueryParams<T>(pub T);

/// Proof that the request carried `Authorization: Bearer $ADMIN_TOKEN`.
pub struct Admin;

/// What [`Admin`] checks the credential against: `ADMIN_TOKEN` (`None`:
/// the admin routes answer 401). Taken from any state by `FromRef`.
#[derive(Clone)]
pub struct AdminToken(pub Option<Arc<str>>);

/// How [`Caller`] tells the buyer (`None`: `AUTH=none`, the body's
/// `user_id` is believed). Taken from any state by `FromRef`.
#[derive(Clone)]
pub struct Verifier(pub Option<Arc<Auth>>);

/// The credential of `Authorization: Bearer <credential>`, if sent.
pub(super) fn bearer(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)?
        .as_bytes()
        .strip_prefix(b"Bearer ")
}

impl<S> FromRequestParts<S> for Admin
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let AdminToken(token) = AdminToken::from_ref(state);
        let Some(expected) = token.as_deref() else {
            return Err(ApiError::Unauthorized(
                "admin routes are disabled: the server has no ADMIN_TOKEN",
            ));
        };
        let presented = bearer(&parts.headers).ok_or(ApiError::Unauthorized(
            "missing Authorization: Bearer <ADMIN_TOKEN>",
        ))?;
        // Constant time: the comparison must not reveal how much of a guess was right.
        if bool::from(presented.ct_eq(expected.as_bytes())) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized("wrong admin token"))
        }
    }
}

/// The buyer behind a request (see [`crate::http::auth`]).
impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Verifier: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Verifier(auth) = Verifier::from_ref(state);
        Caller::of(auth.as_deref(), parts, peer(&parts.extensions))
    }
}
