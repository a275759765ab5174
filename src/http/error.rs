//! The one mapping from failures to HTTP answers. Every error body is
//! `{"error": "<code>", "message": "<text for a human>"}`. A failure of a
//! dependency or a bug keeps its cause (the error's `source` chain), which
//! the client never sees: the answer carries the error in a response
//! extension ([`Failure`]), and the request guard logs it, once, with
//! the whole chain (`limits::guarded`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The cause of a 5xx: any error, kept whole for the log.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

use crate::domain::Invalid;
pub use crate::domain::answer::Code;
use crate::sale::{Rejection, SaleError};
use crate::store::StoreError;

/// Everything a handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("request body is too large")]
    PayloadTooLarge,
    /// The client did not send its whole body within the request timeout.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("{0}")]
    HeadersTooLarge(String),
    #[error("request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("no such route")]
    RouteNotFound,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("{0}")]
    ProductNotFound(&'static str),
    #[error("no order with this id")]
    OrderNotFound,
    /// Accepted but not in the books yet (a payment notification for it).
    #[error("the order is accepted and not in the books yet; send again shortly")]
    OrderPending,
    /// A payment notification whose signature does not verify (which part
    /// failed is logged, not said).
    #[error("the webhook signature does not verify")]
    InvalidSignature,
    /// A payment for another amount or currency than the order's: recorded,
    /// the order unchanged.
    #[error("the amount or currency is not the order's; recorded, the order is unchanged")]
    AmountMismatch,
    #[error("this payment id was recorded for another order")]
    PaymentIdReused,
    #[error("a product with this id exists")]
    ProductExists,
    /// Opens at `starts_at` (epoch ms); `Retry-After` says how long until then.
    #[error("the sale has not started; it opens at {starts_at} (epoch ms)")]
    SaleNotStarted { starts_at: i64, in_ms: u64 },
    #[error("the sale has ended")]
    SaleEnded,
    /// An operator paused the sale; `Retry-After` says when to look again.
    #[error("the sale is paused; try again shortly")]
    SalePaused,
    /// Closed early or retired: the sale cannot be opened again.
    #[error("this sale is closed (closed early or retired); it cannot be opened again")]
    SaleClosed,
    #[error("sold out")]
    SoldOut,
    #[error("only {left} units left")]
    InsufficientStock { left: u64 },
    #[error("over the per-user limit: this user may buy {allowance} more units")]
    LimitExceeded { allowance: u64 },
    #[error("this Idempotency-Key was used for a different order")]
    IdempotencyKeyReused,
    #[error("the order is {0}")]
    InvalidTransition(String),
    /// The sale has a waiting room: orders need an admission from it.
    #[error("{0}")]
    AdmissionRequired(&'static str),
    #[error("the admission has expired; join the waiting room again")]
    AdmissionExpired,
    #[error("this sale has no waiting room")]
    NoWaitingRoom,
    /// The room asks a proof of work before a join.
    #[error("{0}")]
    ChallengeRequired(String),
    /// Joining opens at `opens_at` (epoch ms).
    #[error("the waiting room opens at {opens_at} (epoch ms)")]
    QueueNotOpen { opens_at: i64 },
    #[error("no such ticket in this sale's waiting room")]
    TicketNotFound,
    /// Accepted in Redis, but not confirmed by the replicas WAIT asked for.
    #[error(
        "the order was not confirmed by Redis replicas in time; retry with the same Idempotency-Key to learn its outcome (it was taken back, unless another request with the key answered it)"
    )]
    NotReplicated(#[source] SaleError),
    /// Too many requests from this user or address: retry after this long.
    #[error("too many requests; retry in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// More orders in flight than the service decides at once: shed at once: nothing waits.
    #[error("the service is at capacity; retry shortly")]
    Overloaded,
    /// A dependency is down or slow; the cause is logged, not shown.
    #[error("a dependency is unavailable; retry shortly")]
    Unavailable(#[source] Cause),
    /// A bug or corrupt data; the cause is logged, not shown.
    #[error("internal error")]
    Internal(#[source] Cause),
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Machine-readable; one of [`Code`].
    error: &'static str,
    /// For a human; may change.
    message: String,
    /// `sale_not_started` only: when the sale opens (epoch ms, by the
    /// server's clock); the `Retry-After` header says the seconds until then.
    #[serde(skip_serializing_if = "Option::is_none")]
    starts_at: Option<i64>,
}

/// The HTTP status of each code.
pub fn status(code: Code) -> StatusCode {
    match code {
        Code::InvalidRequest => StatusCode::BAD_REQUEST,
        Code::Unauthorized | Code::InvalidSignature => StatusCode::UNAUTHORIZED,
        Code::Forbidden
        | Code::AdmissionRequired
        | Code::AdmissionExpired
        | Code::ChallengeRequired => StatusCode::FORBIDDEN,
        Code::NotFound
        | Code::ProductNotFound
        | Code::OrderNotFound
        | Code::NoWaitingRoom
        | Code::TicketNotFound => StatusCode::NOT_FOUND,
        Code::OrderPending
        | Code::ProductExists
        | Code::SaleNotStarted
        | Code::SaleEnded
        | Code::SalePaused
        | Code::SaleClosed
        | Code::SoldOut
        | Code::InsufficientStock
        | Code::LimitExceeded
        | Code::InvalidTransition
        | Code::QueueNotOpen => StatusCode::CONFLICT,
        Code::AmountMismatch | Code::PaymentIdReused | Code::IdempotencyKeyReused => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Code::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Code::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Code::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Overloaded | Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl ApiError {
    /// The error's code (and so its HTTP status).
    pub fn kind(&self) -> Code {
        match self {
            Self::InvalidRequest(_) => Code::InvalidRequest,
            Self::PayloadTooLarge => Code::PayloadTooLarge,
            Self::BodyTimeout => Code::RequestTimeout,
            Self::HeadersTooLarge(_) => Code::HeadersTooLarge,
            Self::UnsupportedMediaType => Code::UnsupportedMediaType,
            Self::Unauthorized(_) => Code::Unauthorized,
            Self::Forbidden(_) => Code::Forbidden,
            Self::RouteNotFound => Code::NotFound,
            Self::MethodNotAllowed => Code::MethodNotAllowed,
            Self::ProductNotFound(_) => Code::ProductNotFound,
            Self::OrderNotFound => Code::OrderNotFound,
            Self::OrderPending => Code::OrderPending,
            Self::InvalidSignature => Code::InvalidSignature,
            Self::AmountMismatch => Code::AmountMismatch,
            Self::PaymentIdReused => Code::PaymentIdReused,
            Self::ProductExists => Code::ProductExists,
            Self::SaleNotStarted { .. } => Code::SaleNotStarted,
            Self::SaleEnded => Code::SaleEnded,
            Self::SalePaused => Code::SalePaused,
            Self::SaleClosed => Code::SaleClosed,
            Self::SoldOut => Code::SoldOut,
            Self::InsufficientStock { .. } => Code::InsufficientStock,
            Self::LimitExceeded { .. } => Code::LimitExceeded,
            Self::IdempotencyKeyReused => Code::IdempotencyKeyReused,
            Self::InvalidTransition(_) => Code::InvalidTransition,
            Self::AdmissionRequired(_) => Code::AdmissionRequired,
            Self::ChallengeRequired(_) => Code::ChallengeRequired,
            Self::AdmissionExpired => Code::AdmissionExpired,
            Self::NoWaitingRoom => Code::NoWaitingRoom,
            Self::QueueNotOpen { .. } => Code::QueueNotOpen,
            Self::TicketNotFound => Code::TicketNotFound,
            Self::RateLimited { .. } => Code::RateLimited,
            Self::Overloaded => Code::Overloaded,
            Self::Unavailable(_) | Self::NotReplicated(_) => Code::Unavailable,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// The machine-readable code, as in the body's `error` field.
    pub fn code(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// A failed request's error, whole, for the one log line the request
/// guard writes about it (5xx answers only).
#[derive(Debug, Clone)]
pub struct Failure(pub std::sync::Arc<ApiError>);

impl Failure {
    /// The error and its causes, outermost first: `a: b: c`.
    pub fn chain(&self) -> String {
        let mut out = self.0.to_string();
        let mut next = std::error::Error::source(&*self.0);
        while let Some(cause) = next {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }
}

/// The answer to an order without an admission, for a sale with a room.
pub const ADMISSION_REQUIRED: &str = "this sale admits buyers through its waiting room: join it (POST /api/sales/{product_id}/queue) and order with the admission it gives (header Admission-Token)";

/// The answer to an order for a product with no sale. It may come from
/// this instance's read of the registry, up to UNKNOWN_PRODUCT_CACHE_MS
/// old: it does not claim more than it knows.
pub const NOT_ON_SALE: &str =
    "no sale is open for this product id (a sale opened moments ago may take a moment to be seen)";

impl ApiError {
    /// The body of the refusals a sale's crowd gets by the thousand, whose
    /// text never changes: written once, not serialized per answer. A test
    /// checks each against the serialized body.
    fn constant_body(&self) -> Option<&'static [u8]> {
        Some(match self {
            Self::SoldOut => br#"{"error":"sold_out","message":"sold out"}"#,
            Self::SaleEnded => br#"{"error":"sale_ended","message":"the sale has ended"}"#,
            Self::ProductNotFound(NOT_ON_SALE) => {
                br#"{"error":"product_not_found","message":"no sale is open for this product id (a sale opened moments ago may take a moment to be seen)"}"#
            }
            Self::Overloaded => {
                br#"{"error":"overloaded","message":"the service is at capacity; retry shortly"}"#
            }
            _ => return None,
        })
    }
}

/// How long a client refused `sale_paused` is told to wait (`Retry-After`).
pub const PAUSED_RETRY_SECS: u64 = 5;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        let (status, code) = (status(kind), kind.as_str());
        let starts_at = match &self {
            Self::SaleNotStarted { starts_at, .. } => Some(*starts_at),
            _ => None,
        };
        let mut response = match self.constant_body() {
            Some(body) => {
                let mut response = Response::new(Body::from(Bytes::from_static(body)));
                *response.status_mut() = status;
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            None => (
                status,
                Json(ErrorBody {
                    error: code,
                    message: self.to_string(),
                    starts_at,
                }),
            )
                .into_response(),
        };
        let retry_after = match &self {
            Self::RateLimited { retry_after_secs } => Some(HeaderValue::from(*retry_after_secs)),
            // Rounded up: a client that waits this long finds the sale open.
            Self::SaleNotStarted { in_ms, .. } => {
                Some(HeaderValue::from(in_ms.div_ceil(1000).max(1)))
            }
            Self::SalePaused => Some(HeaderValue::from(PAUSED_RETRY_SECS)),
            _ if status == StatusCode::SERVICE_UNAVAILABLE => Some(HeaderValue::from_static("1")),
            _ => None,
        };
        let headers = response.headers_mut();
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, value);
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // Shedding (`overloaded`) is by design and counted, not logged.
        if matches!(
            self,
            Self::Unavailable(_) | Self::Internal(_) | Self::NotReplicated(_)
        ) {
            response
                .extensions_mut()
                .insert(Failure(std::sync::Arc::new(self)));
        }
        response
    }
}

/// Which store failed, as the first link of a cause chain (`redis: ...`).
#[derive(Debug, thiserror::Error)]
#[error("redis")]
struct Redis(#[source] SaleError);

#[derive(Debug, thiserror::Error)]
#[error("mysql")]
struct Mysql(#[source] StoreError);

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        Self::InvalidRequest(e.0)
    }
}

/// A sale's refusal of an order, as the client hears it.
impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::NoSale => Self::ProductNotFound(NOT_ON_SALE),
            Rejection::NotStarted {
                starts_at_ms,
                in_ms,
            } => Self::SaleNotStarted {
                starts_at: starts_at_ms,
                in_ms,
            },
            Rejection::Ended => Self::SaleEnded,
            Rejection::SoldOut => Self::SoldOut,
            Rejection::InsufficientStock { left } => Self::InsufficientStock { left },
            Rejection::LimitExceeded { allowance } => Self::LimitExceeded { allowance },
            Rejection::AdmissionRequired => Self::AdmissionRequired(ADMISSION_REQUIRED),
            Rejection::Paused { .. } => Self::SalePaused,
        }
    }
}

impl From<SaleError> for ApiError {
    fn from(e: SaleError) -> Self {
        match e {
            e @ SaleError::NotReplicated { .. } => Self::NotReplicated(e),
            e if e.is_unavailable() => Self::Unavailable(Box::new(Redis(e))),
            e => Self::Internal(Box::new(Redis(e))),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::ProductExists => Self::ProductExists,
            e if e.is_unavailable() => Self::Unavailable(Box::new(Mysql(e))),
            e => Self::Internal(Box::new(Mysql(e))),
        }
    }
}

impl From<crate::bookkeeping::BookkeepingError> for ApiError {
    fn from(e: crate::bookkeeping::BookkeepingError) -> Self {
        use crate::bookkeeping::BookkeepingError as B;
        match e {
            B::NotFound => Self::OrderNotFound,
            B::Pending => Self::OrderPending,
            B::PaymentIdReused => Self::PaymentIdReused,
            B::NoProduct => Self::ProductNotFound("no product with this id"),
            B::SaleClosed => Self::SaleClosed,
            B::Forbidden => Self::Forbidden("this order belongs to another user"),
            B::InvalidTransition(status) => Self::InvalidTransition(status),
            B::TooFewLeft(left) => Self::InsufficientStock { left },
            B::SaleEnded => Self::SaleEnded,

            B::Sale(e) => e.into(),
            B::Store(e) => e.into(),
            // Only operator commands are refused (`recover`); no route gets it.
            e @ (B::Corrupt(_) | B::Refused(_)) => Self::Internal(Box::new(e)),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::PayloadTooLarge
        } else {
            Self::InvalidRequest(e.body_text())
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        Self::InvalidRequest(e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::InvalidRequest(e.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each code is one text, and `docs/api.md`'s table gives each with its
    /// status (the OpenAPI document lists [`Code::ALL`] itself).
    #[test]
    fn every_code_is_unique_and_documented_with_its_status() {
        let doc = include_str!("../../docs/api.md");
        let mut seen = std::collections::BTreeSet::new();
        for code in Code::ALL {
            assert!(seen.insert(code.as_str()), "{code:?} repeats a text");
            let status = status(*code);
            assert!(status.is_client_error() || status.is_server_error());
            let row = format!("| {} |", status.as_u16());
            let listed = doc
                .lines()
                .any(|l| l.starts_with(&row) && l.contains(&format!("`{}`", code.as_str())));
            assert!(
                listed,
                "docs/api.md does not list {} ({status})",
                code.as_str()
            );
        }
    }

    /// A refusal the sale decides answers the code its table names.
    #[test]
    fn a_refusal_answers_its_own_code() {
        for why in [
            Rejection::NoSale,
            Rejection::NotStarted {
                starts_at_ms: 10,
                in_ms: 5,
            },
            Rejection::Ended,
            Rejection::SoldOut,
            Rejection::InsufficientStock { left: 1 },
            Rejection::LimitExceeded { allowance: 0 },
            Rejection::AdmissionRequired,
            Rejection::Paused { since_ms: 1 },
        ] {
            assert_eq!(ApiError::from(why).kind(), why.code(), "{why:?}");
        }
    }

    /// The bodies written once are the bodies serde would write.
    #[test]
    fn constant_bodies_are_the_serialized_ones() {
        let mut constant = 0;
        for e in [
            ApiError::SoldOut,
            ApiError::SaleEnded,
            ApiError::Overloaded,
            ApiError::ProductNotFound(NOT_ON_SALE),
            ApiError::ProductNotFound("no product with this id"),
            ApiError::OrderNotFound,
        ] {
            let Some(body) = e.constant_body() else {
                continue;
            };
            constant += 1;
            let serialized = serde_json::to_vec(&ErrorBody {
                error: e.code(),
                message: e.to_string(),
                starts_at: None,
            })
            .unwrap();
            assert_eq!(
                String::from_utf8_lossy(body),
                String::from_utf8_lossy(&serialized)
            );
        }
        assert_eq!(constant, 4, "sold_out, sale_ended, overloaded, not on sale");
    }
}
