//! Bearer JWTs: the keys (a secret, a PEM public key, or a JWKS chosen by
//! `kid`), the rules (algorithm, issuer, audience, leeway) and the claim
//! that names the buyer.

use std::path::Path;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::error::AuthError;
use crate::config::AuthSettings;
use crate::domain::UserId;
use crate::http::error::ApiError;

/// A token's verifier: keys (one, or a JWKS by `kid`), the rules, the claim.
pub(super) struct Jwt {
    keys: Vec<Key>,
    user_claim: String,
}

struct Key {
    kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

impl Jwt {
    pub(super) fn new(s: &AuthSettings) -> Result<Option<Self>, AuthError> {
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
    pub(super) fn verify(&self, token: &str) -> Result<(UserId, u64), ApiError> {
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
        if matches!(
            jwk.common.public_key_use,
            Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
        ) {
            continue;
        }
        let Some(default) = jwk_algorithm(jwk) else {
            continue;
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|source| AuthError::BadKey {
            path: path.clone(),
            source,
        })?;
        keys.push((jwk.common.key_id.clone(), key, default));
    }
    Ok(keys)
}

/// The algorithm a key of a JWKS is for: its `alg`, else its key type's
/// usual one (`None`: a key this service cannot use).
fn jwk_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    Some(match (&jwk.common.key_algorithm, &jwk.algorithm) {
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
            _ => return None,
        },
        (None, AlgorithmParameters::EllipticCurve(ec)) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        (None, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
        (None, AlgorithmParameters::OctetKeyPair(_)) => Algorithm::EdDSA,
        (None, AlgorithmParameters::OctetKey(_)) => Algorithm::HS256,
        (None, _) => return None,
    })
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
