//! The HTTP layer's log lines: one per failed request (5xx, with its error's
//! cause chain), and at debug level a span and a line per request. Called by
//! the request guard (`limits::guarded`), which every request goes through:
//! here rather than in a layer of its own, since an extra `from_fn` layer had
//! a measurable cost on the sold-out path even with debug off (BENCHMARKS.md,
//! "Metrics and request logs").

use std::time::Instant;

use axum::http::request::Parts;
use axum::response::Response;
use tracing::Span;

use crate::http::error::Failure;

/// The one log line of a failed request, with its error's whole cause chain:
/// a warning for a dependency that failed (503), an error for a bug (500).
pub(crate) fn failure(response: &Response) {
    let Some(failure) = response.extensions().get::<Failure>() else {
        return;
    };
    let code = failure.0.code();
    if code != "internal" {
        tracing::warn!(error = %failure.chain(), code, "request failed: a dependency");
    } else {
        tracing::error!(error = %failure.chain(), code, "request failed");
    }
}

/// At debug level: a `request` span (method, path) for the handling, which
/// the handlers' logs carry; disabled otherwise.
pub(crate) fn request_span(parts: &Parts) -> Span {
    tracing::debug_span!("request", method = %parts.method, path = %parts.uri.path())
}

/// At debug level: one line per request, in its span, with status and latency.
pub(crate) fn handled(span: &Span, response: &Response, started: Option<Instant>) {
    let Some(started) = started else {
        return;
    };
    span.in_scope(|| {
        tracing::debug!(
            status = response.status().as_u16(),
            latency_us = started.elapsed().as_micros() as u64,
            "request"
        )
    });
}
