//! Every request body is read in full, within bounds, before anything
//! answers, so that an early answer leaves the connection usable.
//!
//! An HTTP/1.1 server that answers before the client's body has arrived must
//! read that body anyway or close the connection; hyper closes it, after an
//! answer that did not say `Connection: close`, so a keep-alive client's next
//! request on it fails with a transport error (BrokenPipe,
//! RemoteDisconnected). Under a spike the refusals (429 `rate_limited`, 503
//! `overloaded`, 401, 404, ...) are most of the answers: each would cost the
//! client a broken request and a new connection. Reading first keeps them on
//! a connection the client can reuse; orders read their few dozen bytes here
//! instead of in the handler. A body that cannot be read within the bounds
//! (declared too large, too slow, cut) is answered with `Connection: close`,
//! which every client honours. BENCHMARKS.md, "Refusals that keep the
//! connection", compares this with closing after every refusal.

use axum::BoxError;
use axum::body::{Bytes, HttpBody};
use axum::http::request::{Parts, Request};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;

use crate::http::error::ApiError;

/// Largest request body accepted (a product with a 1,024-character title fits).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// `req`'s head and its body read into memory (at most `limit` bytes, by
/// `deadline`), or the answer that closes the connection. Any body type:
/// the order path reads hyper's own, the router's routes axum's.
pub async fn read_whole<B>(
    req: Request<B>,
    limit: usize,
    deadline: Instant,
) -> Result<(Parts, Bytes), Response>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return Ok((parts, Bytes::new()));
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        // Reading it just to throw it away would cost more than a new connection.
        return Err(closing(ApiError::PayloadTooLarge));
    }
    match tokio::time::timeout_at(deadline, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok((parts, collected.to_bytes())),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(closing(ApiError::PayloadTooLarge)),
        Ok(Err(_)) => Err(closing(ApiError::InvalidRequest(
            "the request body could not be read".into(),
        ))),
        Err(_) => Err(closing(ApiError::BodyTimeout)),
    }
}

/// `error`'s answer, telling the client this connection ends with it.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
