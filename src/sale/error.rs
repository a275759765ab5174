//! The one error of `sale`: a failure to get an answer from Redis (a
//! refusal is an answer: see `orders::Decision`).

use std::time::Duration;

/// A failure to get an answer from Redis. `Clone`: the orders that shared
/// a call share its failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SaleError {
    #[error("redis")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis pool")]
    Pool(#[from] bb8::RunError<redis::RedisError>),
    /// The order was accepted, but fewer replicas than asked confirmed it
    /// within the WAIT timeout: it could be lost in a failover.
    #[error("order not confirmed by {wanted} replicas ({acked} did)")]
    NotReplicated { acked: u32, wanted: u32 },
    /// A script or key held something this code did not write: a bug or a
    /// foreign writer, never the caller's fault.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
    /// The task sending the order's call ended without an answer (the
    /// process is shutting down): the order may or may not be placed.
    #[error("the order's call ended without an answer")]
    Dropped,
    /// A sale of several stock shards: units kept moving away from the
    /// buyer's shard while its order looked for them (other buyers took
    /// them first, again and again); the order was not placed. A 503: the
    /// sale may still have units, so `sold_out` would be a lie.
    #[error("the order found no unit after {0} searches while units kept moving")]
    Contended(usize),
}

impl SaleError {
    /// No answer in time, by this process's bound or the client's own:
    /// what was sent may have run.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Redis(e) => e.is_timeout(),
            _ => false,
        }
    }

    /// True when Redis is down, slow or refusing service (a 503, not a bug).
    pub fn is_unavailable(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            Self::Timeout(_)
            | Self::Pool(_)
            | Self::NotReplicated { .. }
            | Self::Dropped
            | Self::Contended(_) => true,
            Self::Redis(e) => match e.kind() {
                ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::AuthenticationFailed
                | ErrorKind::Extension => true,
                // Moved/Ask surface only when the client's own retries ran out
                // (a slot whose master is gone, mid-failover).
                ErrorKind::Server(kind) => matches!(
                    kind,
                    ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::NoPerm
                ),
                _ => e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout(),
            },
            Self::Corrupt(_) => false,
        }
    }
}
