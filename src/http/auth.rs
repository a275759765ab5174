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
//! Verifying a signature costs CPU on every request (measured: ES256 150 µs,
//! RS256 51 µs, HMAC 1 µs; BENCHMARKS.md), so a verified token is remembered, by its SHA-256, until it expires:
//! a buyer's repeated requests cost one hash and one map lookup. The memory
//! is bounded ([`AuthSettings::token_cache_entries`]); a full cache only
//! means more verifying, never a wrong answer.
//!
//! `AUTH=none` turns all of this off, for local trials: the body's `user_id`
//! is then believed. The service refuses to start with neither an identity
//! source nor that explicit choice.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{HeaderName, header};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::domain::UserId;

/// How buyers are identified (from `AUTH*` and `JWT_*`; see the README).
#[derive(Clone)]
pub struct AuthSettings {
    /// `AUTH=none`: no identity at all (local trials only).
    pub off: bool,
    /// HMAC secret (at least 32 bytes).
    pub jwt_secret: Option<String>,
    /// A PEM public key (RSA, EC or Ed25519).
    pub jwt_public_key_file: Option<PathBuf>,
    /// A JWKS document (`{"keys": [...]}`); tokens pick a key by `kid`.
    pub jwt_jwks_file: Option<PathBuf>,
    /// The one algorithm accepted; by default the key's own (HS256 for a secret).
    pub jwt_algorithm: Option<Algorithm>,
    /// Required `iss`, when set.
    pub jwt_issuer: Option<String>,
    /// Required `aud`, when set.
    pub jwt_audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub jwt_leeway: Duration,
    /// The claim that carries the user id (a number, or digits in a string).
    pub jwt_user_claim: String,
    /// A gateway's header naming the authenticated user.
    pub user_header: Option<HeaderName>,
    /// The only peers whose `user_header` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Verified tokens remembered at most (0: verify every request).
    pub token_cache_entries: usize,
}

/// `JWT_LEEWAY_SECS`, `JWT_USER_CLAIM` and `AUTH_TOKEN_CACHE_SIZE` by default.
pub const JWT_LEEWAY_SECS: u64 = 30;
pub const JWT_USER_CLAIM: &str = "sub";
pub const AUTH_TOKEN_CACHE_SIZE: usize = 100_000;

impl Default for AuthSettings {
    /// Nothing configured: [`Auth::new`] refuses it.
    fn default() -> Self {
        Self {
            off: false,
            jwt_secret: None,
            jwt_public_key_file: None,
            jwt_jwks_file: None,
            jwt_algorithm: None,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_leeway: Duration::from_secs(JWT_LEEWAY_SECS),
            jwt_user_claim: JWT_USER_CLAIM.into(),
            user_header: None,
            trusted_proxies: Vec::new(),
            token_cache_entries: AUTH_TOKEN_CACHE_SIZE,
        }
    }
}

impl AuthSettings {
    /// `AUTH=none`.
    pub fn off() -> Self {
        Self {
            off: true,
            ..Self::default()
        }
    }

    /// HMAC-signed tokens with this secret.
    pub fn hmac(secret: &str) -> Self {
        Self {
            jwt_secret: Some(secret.to_owned()),
            ..Self::default()
        }
    }

    fn anything_set(&self) -> bool {
        self.jwt_secret.is_some()
            || self.jwt_public_key_file.is_some()
            || self.jwt_jwks_file.is_some()
            || self.user_header.is_some()
            || !self.trusted_proxies.is_empty()
    }
}

impl std::fmt::Debug for AuthSettings {
    /// Without the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("off", &self.off)
            .field(
                "jwt_secret",
                &self.jwt_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("jwt_public_key_file", &self.jwt_public_key_file)
            .field("jwt_jwks_file", &self.jwt_jwks_file)
            .field("jwt_algorithm", &self.jwt_algorithm)
            .field("jwt_issuer", &self.jwt_issuer)
            .field("jwt_audience", &self.jwt_audience)
            .field("jwt_leeway", &self.jwt_leeway)
            .field("jwt_user_claim", &self.jwt_user_claim)
            .field("user_header", &self.user_header)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("token_cache_entries", &self.token_cache_entries)
            .finish()
    }
}

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

/// An address range: `10.0.0.0/8`, `::1`, `127.0.0.1/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or a range (a.b.c.d/n)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { addr, prefix })
    }
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// `AUTH_TRUSTED_PROXIES`: the gateway's addresses, as one value (clap
/// would take a `Vec` for a list of values, and panic at start when its
/// parser gives a whole list for each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<IpNet>);

impl std::str::FromStr for TrustedProxies {
    type Err = String;

    /// Comma-separated addresses or ranges.
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

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
            && peer.is_some_and(|peer| proxies.iter().any(|p| p.contains(peer.ip())))
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

/// A token's verifier: keys (one, or a JWKS by `kid`), the rules, the claim.
struct Jwt {
    keys: Vec<Key>,
    user_claim: String,
}

struct Key {
    kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

impl Jwt {
    fn new(s: &AuthSettings) -> Result<Option<Self>, AuthError> {
        let sources = [
            s.jwt_secret.is_some(),
            s.jwt_public_key_file.is_some(),
            s.jwt_jwks_file.is_some(),
        ];
        match sources.iter().filter(|set| **set).count() {
            0 if s.jwt_algorithm.is_some()
                || s.jwt_issuer.is_some()
                || s.jwt_audience.is_some() =>
            {
                return Err(AuthError::JwtSettingsWithoutKey);
            }
            0 => return Ok(None),
            1 => {}
            _ => return Err(AuthError::SeveralKeys),
        }
        let keys = key_material(s)?;
        let keys = keys
            .into_iter()
            .map(|(kid, key, default_alg)| {
                let alg = s.jwt_algorithm.unwrap_or(default_alg);
                if alg.family() != key.family() {
                    return Err(AuthError::AlgorithmMismatch(alg));
                }
                Ok(Key {
                    kid,
                    key,
                    validation: validation(s, alg),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(AuthError::Unusable(
                "the JWKS document holds no key for signatures".into(),
            ));
        }
        Ok(Some(Self {
            keys,
            user_claim: s.jwt_user_claim.clone(),
        }))
    }

    /// The user and expiry (epoch s) of a valid token; 401 otherwise.
    fn verify(&self, token: &str) -> Result<(UserId, u64), ApiError> {
        let key = match self.keys.as_slice() {
            [only] if only.kid.is_none() => only,
            keys => {
                let header = jsonwebtoken::decode_header(token).map_err(refused)?;
                match header.kid {
                    Some(kid) => keys
                        .iter()
                        .find(|k| k.kid.as_deref() == Some(kid.as_str()))
                        .ok_or(ApiError::Unauthorized(
                            "the token's key id (kid) is unknown",
                        ))?,
                    None if keys.len() == 1 => &keys[0],
                    None => {
                        return Err(ApiError::Unauthorized("the token names no key id (kid)"));
                    }
                }
            }
        };
        let claims = jsonwebtoken::decode::<serde_json::Map<String, Value>>(
            token,
            &key.key,
            &key.validation,
        )
        .map_err(refused)?
        .claims;
        let user = match claims.get(&self.user_claim) {
            Some(Value::Number(n)) => n.as_u64().and_then(|u| UserId::new(u).ok()),
            Some(Value::String(s)) => UserId::parse(s).ok(),
            _ => None,
        }
        .ok_or(ApiError::Unauthorized(
            "the token's user claim is not a user id",
        ))?;
        // `exp` is required and checked by `decode`.
        let exp = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        Ok((user, exp))
    }
}

/// The keys the settings name, each with its default algorithm.
fn key_material(
    s: &AuthSettings,
) -> Result<Vec<(Option<String>, DecodingKey, Algorithm)>, AuthError> {
    if let Some(secret) = &s.jwt_secret {
        if secret.len() < 32 {
            return Err(AuthError::WeakSecret);
        }
        let key = DecodingKey::from_secret(secret.as_bytes())
            .map_err(|e| AuthError::Unusable(format!("JWT_SECRET: {e}")))?;
        return Ok(vec![(None, key, Algorithm::HS256)]);
    }
    if let Some(path) = &s.jwt_public_key_file {
        let pem = read(path)?;
        let bad = |source| AuthError::BadKey {
            path: path.clone(),
            source,
        };
        // The PEM's key type decides; each constructor refuses the others.
        // (A P-384 key needs JWT_ALGORITHM=ES384.)
        let key = DecodingKey::from_ec_pem(&pem)
            .map(|k| (k, Algorithm::ES256))
            .or_else(|_| DecodingKey::from_rsa_pem(&pem).map(|k| (k, Algorithm::RS256)))
            .or_else(|_| DecodingKey::from_ed_pem(&pem).map(|k| (k, Algorithm::EdDSA)))
            .map_err(bad)?;
        return Ok(vec![(None, key.0, key.1)]);
    }
    let Some(path) = &s.jwt_jwks_file else {
        return Ok(Vec::new());
    };
    let set: JwkSet =
        serde_json::from_slice(&read(path)?).map_err(|source| AuthError::BadJwks {
            path: path.clone(),
            source,
        })?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm, PublicKeyUse};
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let default = match (&jwk.common.key_algorithm, &jwk.algorithm) {
            (Some(alg), _) => match alg {
                KeyAlgorithm::HS256 => Algorithm::HS256,
                KeyAlgorithm::HS384 => Algorithm::HS384,
                KeyAlgorithm::HS512 => Algorithm::HS512,
                KeyAlgorithm::ES256 => Algorithm::ES256,
                KeyAlgorithm::ES384 => Algorithm::ES384,
                KeyAlgorithm::RS256 => Algorithm::RS256,
                KeyAlgorithm::RS384 => Algorithm::RS384,
                KeyAlgorithm::RS512 => Algorithm::RS512,
                KeyAlgorithm::PS256 => Algorithm::PS256,
                KeyAlgorithm::PS384 => Algorithm::PS384,
                KeyAlgorithm::PS512 => Algorithm::PS512,
                KeyAlgorithm::EdDSA => Algorithm::EdDSA,
                _ => continue,
            },
            (None, AlgorithmParameters::EllipticCurve(ec)) => match ec.curve {
                EllipticCurve::P256 => Algorithm::ES256,
                EllipticCurve::P384 => Algorithm::ES384,
                _ => continue,
            },
            (None, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
            (None, AlgorithmParameters::OctetKeyPair(_)) => Algorithm::EdDSA,
            (None, AlgorithmParameters::OctetKey(_)) => Algorithm::HS256,
            (None, _) => continue,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|source| AuthError::BadKey {
            path: path.clone(),
            source,
        })?;
        keys.push((jwk.common.key_id.clone(), key, default));
    }
    Ok(keys)
}

fn read(path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::ReadKey {
        path: path.to_owned(),
        source,
    })
}

/// The rules every token must pass: one algorithm, `exp` required, `nbf`
/// checked when present, `iss` and `aud` required when configured.
fn validation(s: &AuthSettings, alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = s.jwt_leeway.as_secs();
    v.validate_nbf = true;
    let mut required = vec!["exp"];
    if let Some(iss) = &s.jwt_issuer {
        v.set_issuer(&[iss]);
        required.push("iss");
    }
    match &s.jwt_audience {
        Some(aud) => {
            v.set_audience(&[aud]);
            required.push("aud");
        }
        None => v.validate_aud = false,
    }
    v.set_required_spec_claims(&required);
    v
}

/// Why a token was refused, in words a client developer can act on.
fn refused(e: jsonwebtoken::errors::Error) -> ApiError {
    ApiError::Unauthorized(match e.kind() {
        ErrorKind::ExpiredSignature => "the token has expired",
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
        ErrorKind::InvalidIssuer => "the token is from another issuer",
        ErrorKind::InvalidAudience => "the token is for another audience",
        ErrorKind::InvalidSignature => "the token's signature does not verify",
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            "the token's algorithm is not the one accepted"
        }
        ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim (exp, iss or aud)",
        _ => "the token is malformed",
    })
}

/// Verified tokens by SHA-256: user and expiry. Sharded so that concurrent
/// requests rarely meet on a lock; bounded, expired entries dropped when full.
struct TokenCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

const SHARDS: usize = 16;

/// A token's SHA-256 → (user id, `exp` in epoch seconds).
type Shard = HashMap<[u8; 32], (UserId, u64)>;

impl TokenCache {
    fn new(entries: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: entries.div_ceil(SHARDS),
        }
    }

    fn shard(&self, digest: &[u8; 32]) -> &Mutex<Shard> {
        &self.shards[usize::from(digest[0]) % SHARDS]
    }

    fn get(&self, digest: &[u8; 32], now_secs: u64) -> Option<UserId> {
        if self.per_shard == 0 {
            return None;
        }
        let shard = self.shard(digest).lock().unwrap_or_else(|p| p.into_inner());
        // Valid until its `exp` (the leeway is the verifier's to grant).
        shard
            .get(digest)
            .filter(|(_, exp)| *exp > now_secs)
            .map(|(user, _)| *user)
    }

    fn insert(&self, digest: [u8; 32], user: UserId, exp: u64, now_secs: u64) {
        if self.per_shard == 0 || exp <= now_secs {
            return;
        }
        let mut shard = self
            .shard(&digest)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if shard.len() >= self.per_shard {
            shard.retain(|_, (_, e)| *e > now_secs);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(digest, (user, exp));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_ranges_match_their_addresses_only() {
        let parse_proxies = |s: &str| s.parse::<TrustedProxies>().map(|p| p.0);
        let nets = parse_proxies("10.0.0.0/8, 127.0.0.2,::1").unwrap();
        let any = |ip: &str| nets.iter().any(|n| n.contains(ip.parse().unwrap()));
        assert!(any("10.200.3.4"));
        assert!(any("127.0.0.2"));
        assert!(any("::ffff:127.0.0.2"));
        assert!(any("::1"));
        assert!(!any("11.0.0.1"));
        assert!(!any("127.0.0.1"));
        assert!(!any("::2"));
        assert!(parse_proxies("10.0.0.0/33").is_err());
        assert!(parse_proxies("example.com").is_err());
        assert!(parse_proxies("0.0.0.0/0").unwrap()[0].contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_expired_tokens() {
        let uid = |n| UserId::new(n).unwrap();
        let cache = TokenCache::new(SHARDS);
        let d = |i: u8| {
            let mut d = [0; 32];
            d[0] = i;
            d[1] = i;
            d
        };
        cache.insert(d(0), uid(7), 100, 50);
        assert_eq!(cache.get(&d(0), 99), Some(uid(7)));
        assert_eq!(cache.get(&d(0), 100), None, "expired");
        // Shard 0 holds one entry: a second one waits for the first to expire.
        cache.insert(d(16), uid(8), 100, 50);
        assert_eq!(cache.get(&d(16), 60), None);
        cache.insert(d(16), uid(8), 200, 150);
        assert_eq!(cache.get(&d(16), 160), Some(uid(8)));
        assert_eq!(cache.len(), 1);
    }
}
