//! Why the identity settings cannot be used.

use std::path::PathBuf;

use jsonwebtoken::Algorithm;

/// Why the identity settings cannot be used: the service does not start.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(
        "no buyer identity configured: set JWT_SECRET, JWT_PUBLIC_KEY_FILE or JWT_JWKS_FILE to verify bearer tokens, or AUTH_USER_HEADER with AUTH_TRUSTED_PROXIES behind a gateway that authenticates buyers; or AUTH=none for a local trial (anyone may then order, read and cancel as anyone)"
    )]
    NotConfigured,
    #[error("AUTH=none, yet identity settings are set ({0}): choose one")]
    OffButConfigured(&'static str),
    #[error("set only one of JWT_SECRET, JWT_PUBLIC_KEY_FILE and JWT_JWKS_FILE")]
    SeveralKeys,
    #[error(
        "JWT_SECRET is shorter than 32 bytes: use a long random secret (e.g. `openssl rand -hex 32`)"
    )]
    WeakSecret,
    #[error("JWT_ALGORITHM={0:?} does not fit the configured key")]
    AlgorithmMismatch(Algorithm),
    #[error("JWT_ALGORITHM or JWT_ISSUER/JWT_AUDIENCE set without a JWT key")]
    JwtSettingsWithoutKey,
    #[error("AUTH_USER_HEADER and AUTH_TRUSTED_PROXIES go together: set both or neither")]
    HeaderWithoutProxies,
    #[error("cannot read {path}")]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no usable key")]
    BadKey {
        path: PathBuf,
        source: jsonwebtoken::errors::Error,
    },
    #[error("{path} is not a JWKS document")]
    BadJwks {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Unusable(String),
}
