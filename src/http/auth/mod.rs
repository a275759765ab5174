//! Who is asking: the buyer behind a request, from a credential the service
//! verifies, never from a number in the body.
//!
//! Two sources, either or both:
//! - a bearer JWT, verified with a shared secret (HS256/384/512) or a public
//!   key (RS*, PS*, ES256/384, EdDSA) from a PEM or a JWKS file; issuer,
//!   audience, leeway and the claim that names the user are configurable;
//! - a header set by a gateway that has already authenticated the buyer
//!   (`AUTH_USER_HEADER`, e.g. `X-User-Id`), honoured only when the TCP peer
//!   is one of `AUTH_TRUSTED_PROXIES`; from anyone else it is ignored.
//!
//! Verifying a signature costs CPU on every request (an asymmetric signature
//! far more than an HMAC: BENCHMARKS.md, "Verifying buyers' tokens"), so a verified
//! token is remembered, by its SHA-256, until it expires:
//! a buyer's repeated requests cost one hash and one map lookup. The memory
//! is bounded ([`AuthSettings::token_cache_entries`], `cache`); a full
//! cache only means more verifying, never a wrong answer.
//!
//! `AUTH=none` turns all of this off, for local trials: the body's `user_id`
//! is then believed. The service refuses to start with neither an identity
//! source nor that explicit choice.

mod cache;
mod error;
mod jwt;

use std::net::SocketAddr;

use axum::http::request::Parts;
use axum::http::{HeaderName, header};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::config::AuthSettings;
use crate::domain::UserId;
use cache::TokenCache;
pub use error::AuthError;
use ipnet::IpNet;
use jwt::Jwt;

/// Who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `AUTH=none`: nobody is verified; the body's `user_id` is believed.
    Anyone,
    /// A verified buyer.
    Buyer(UserId),
}

impl Caller {
    /// The user a request acts as: the verified buyer (a `claimed` id must
    /// match it: 403), or with `AUTH=none` the `claimed` one (then required).
    pub fn acting_as(self, claimed: Option<u64>) -> Result<UserId, ApiError> {
        match (self, claimed) {
            (Self::Buyer(me), None) => Ok(me),
            (Self::Buyer(me), Some(claimed)) if claimed == me.get() => Ok(me),
            (Self::Buyer(_), Some(_)) => Err(ApiError::Forbidden(
                "user_id is not the authenticated buyer",
            )),
            (Self::Anyone, Some(claimed)) => Ok(UserId::new(claimed)?),
            (Self::Anyone, None) => Err(ApiError::InvalidRequest(
                "user_id is required (the server runs with AUTH=none)".into(),
            )),
        }
    }

    /// May this caller see `owner`'s orders?
    pub fn may_see(self, owner: UserId) -> bool {
        match self {
            Self::Anyone => true,
            Self::Buyer(me) => me == owner,
        }
    }
}

impl Caller {
    /// Who sent the request with head `parts` from `peer` (a gateway's
    /// header is believed only from its trusted addresses); `None`:
    /// `AUTH=none`.
    pub fn of(
        auth: Option<&Auth>,
        parts: &Parts,
        peer: Option<SocketAddr>,
    ) -> Result<Self, ApiError> {
        match auth {
            None => Ok(Self::Anyone),
            Some(auth) => auth.identify(parts, peer).map(Self::Buyer),
        }
    }
}

/// The verifiers, built once at start.
pub struct Auth {
    jwt: Option<Jwt>,
    header: Option<(HeaderName, Vec<IpNet>)>,
    cache: TokenCache,
}

impl Auth {
    /// `None` for `AUTH=none`; an error for settings that cannot work.
    pub fn new(settings: &AuthSettings) -> Result<Option<Self>, AuthError> {
        if settings.off {
            return match settings.anything_set() {
                true => Err(AuthError::OffButConfigured(
                    "JWT_* or AUTH_USER_HEADER/AUTH_TRUSTED_PROXIES",
                )),
                false => Ok(None),
            };
        }
        let header = match (&settings.user_header, settings.trusted_proxies.is_empty()) {
            (Some(name), false) => Some((name.clone(), settings.trusted_proxies.clone())),
            (None, true) => None,
            _ => return Err(AuthError::HeaderWithoutProxies),
        };
        let jwt = Jwt::new(settings)?;
        if jwt.is_none() && header.is_none() {
            return Err(AuthError::NotConfigured);
        }
        Ok(Some(Self {
            jwt,
            header,
            cache: TokenCache::new(settings.token_cache_entries),
        }))
    }

    /// The buyer a request comes from, or why it is refused (401).
    fn identify(&self, parts: &Parts, peer: Option<SocketAddr>) -> Result<UserId, ApiError> {
        if let Some((name, proxies)) = &self.header
            && peer.is_some_and(|peer| {
                proxies
                    .iter()
                    .any(|p| p.contains(&peer.ip().to_canonical()))
            })
        {
            let mut values = parts.headers.get_all(name).iter();
            if let Some(value) = values.next() {
                // A gateway that appends its header instead of replacing it
                // would pass the client's own value on too: with several,
                // nobody is believed.
                if values.next().is_some() {
                    return Err(ApiError::Unauthorized(
                        "the gateway's user header appears more than once",
                    ));
                }
                return value
                    .to_str()
                    .ok()
                    .and_then(|v| UserId::parse(v).ok())
                    .ok_or(ApiError::Unauthorized(
                        "the gateway's user header does not hold a user id",
                    ));
            }
        }
        let Some(jwt) = &self.jwt else {
            return Err(ApiError::Unauthorized(
                "requests must come through the authenticating gateway",
            ));
        };
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthorized(
                "missing Authorization: Bearer <token>",
            ))?;
        self.verify(jwt, token)
    }

    /// The user a token names: from the cache, else verified (and cached).
    fn verify(&self, jwt: &Jwt, token: &str) -> Result<UserId, ApiError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(user) = self.cache.get(&digest, now) {
            return Ok(user);
        }
        let (user, exp) = jwt.verify(token)?;
        self.cache.insert(digest, user, exp, now);
        Ok(user)
    }

    /// The user a bearer token (without `Bearer `) names, as a request
    /// carrying it would be identified: the cache, else verifying. For the
    /// bench (`flashsale-bench auth`), which times exactly this.
    #[cfg(feature = "bench")]
    pub(crate) fn identify_bearer(&self, token: &str) -> Result<UserId, ApiError> {
        let jwt = self.jwt.as_ref().ok_or(ApiError::Unauthorized(
            "requests must come through the authenticating gateway",
        ))?;
        self.verify(jwt, token)
    }
}
