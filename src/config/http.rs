//! The API's settings: who buyers are, the bounds on connections, the
//! guards in front of the order path, what is answered from memory.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::domain::Currency;
use crate::domain::webhook::Secret;
use axum::http::HeaderName;
use ipnet::IpNet;
use jsonwebtoken::Algorithm;

/// Who the buyer is (see `http::auth`): bearer JWTs, a trusted gateway's
/// header, or explicitly nobody (`AUTH=none`).
#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// `none`: no buyer identity; the body's `user_id` is believed, so anyone
    /// may order, read and cancel as anyone. For local trials only.
    #[arg(long = "auth", env = "AUTH", value_parser = ["none"])]
    pub auth: Option<String>,
    /// Verify bearer JWTs signed with this HMAC secret (HS256; >= 32 bytes).
    #[arg(long, env = "JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Verify bearer JWTs with this PEM public key (RSA: RS256, EC: ES256, Ed25519: EdDSA).
    #[arg(long, env = "JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,
    /// Verify bearer JWTs with the keys of this JWKS file, chosen by `kid`.
    #[arg(long, env = "JWT_JWKS_FILE")]
    pub jwt_jwks_file: Option<PathBuf>,
    /// The one algorithm accepted (default: the key's own), e.g. ES384, PS256.
    #[arg(long, env = "JWT_ALGORITHM", value_parser = parse_algorithm)]
    pub jwt_algorithm: Option<jsonwebtoken::Algorithm>,
    /// Tokens must carry this `iss`.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Tokens must carry this `aud`.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`.
    #[arg(long, env = "JWT_LEEWAY_SECS", default_value_t = JWT_LEEWAY_SECS)]
    pub jwt_leeway_secs: u64,
    /// The claim that holds the user id (a number, or digits in a string).
    #[arg(long, env = "JWT_USER_CLAIM", default_value = JWT_USER_CLAIM)]
    pub jwt_user_claim: String,
    /// Behind a gateway that authenticates buyers: the header it sets to the
    /// user id (e.g. `X-User-Id`), believed only from AUTH_TRUSTED_PROXIES.
    #[arg(long, env = "AUTH_USER_HEADER")]
    pub auth_user_header: Option<axum::http::HeaderName>,
    /// The gateway's addresses: comma-separated addresses or ranges (`10.0.0.0/8`).
    #[arg(long, env = "AUTH_TRUSTED_PROXIES")]
    pub auth_trusted_proxies: Option<TrustedProxies>,
    /// Verified tokens remembered (by SHA-256, until they expire); 0: verify every request.
    #[arg(long, env = "AUTH_TOKEN_CACHE_SIZE", default_value_t = AUTH_TOKEN_CACHE_SIZE)]
    pub auth_token_cache_size: usize,
}

impl From<AuthArgs> for AuthSettings {
    fn from(a: AuthArgs) -> Self {
        Self {
            off: a.auth.is_some(),
            jwt_secret: a.jwt_secret.filter(|s| !s.is_empty()),
            jwt_public_key_file: a.jwt_public_key_file,
            jwt_jwks_file: a.jwt_jwks_file,
            jwt_algorithm: a.jwt_algorithm,
            jwt_issuer: a.jwt_issuer.filter(|s| !s.is_empty()),
            jwt_audience: a.jwt_audience.filter(|s| !s.is_empty()),
            jwt_leeway: Duration::from_secs(a.jwt_leeway_secs),
            jwt_user_claim: a.jwt_user_claim,
            user_header: a.auth_user_header,
            trusted_proxies: a.auth_trusted_proxies.unwrap_or_default().0,
            token_cache_entries: a.auth_token_cache_size,
        }
    }
}

/// How buyers are identified (from `AUTH*` and `JWT_*`; see docs/security.md).
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
    /// Nothing configured: `http::auth::Auth::new` refuses it.
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

    pub(crate) fn anything_set(&self) -> bool {
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

/// `AUTH_TRUSTED_PROXIES`: the gateway's addresses, as one value (clap
/// would take a `Vec` for a list of values, and panic at start when its
/// parser gives a whole list for each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<IpNet>);

impl std::str::FromStr for TrustedProxies {
    type Err = String;

    /// Comma-separated addresses (`127.0.0.2`, `::1`) or ranges (`10.0.0.0/8`).
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{p:?} is not an address or a range (a.b.c.d/n)"))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// Where payment notifications are heard, and in which currency sales are
/// priced.
#[derive(Debug, Clone)]
pub struct PaymentSettings {
    /// The secrets a notification may be signed with (several during a
    /// rotation).
    pub secrets: Vec<Secret>,
    pub currency: Currency,
}

/// Payments from the payment side (see `http::buyers::payments`).
#[derive(Debug, Clone, Args)]
pub struct PaymentArgs {
    /// The secrets payment notifications are signed with, per Standard
    /// Webhooks (`whsec_<base64>`; comma-separated: several during a
    /// rotation). Set: `POST /api/payments/notifications` is served. Unset:
    /// it is not.
    #[arg(long, env = "PAYMENT_WEBHOOK_SECRETS", hide_env_values = true,
          value_parser = parse_webhook_secrets)]
    pub payment_webhook_secrets: Option<WebhookSecrets>,
    /// The currency sale prices are in (ISO 4217): a payment in another
    /// currency is refused (`amount_mismatch`).
    #[arg(long, env = "SALE_CURRENCY", default_value = "CNY")]
    pub sale_currency: Currency,
}

/// `PAYMENT_WEBHOOK_SECRETS`, parsed.
#[derive(Debug, Clone)]
pub struct WebhookSecrets(pub Vec<Secret>);

fn parse_webhook_secrets(s: &str) -> Result<WebhookSecrets, String> {
    match Secret::parse_list(s) {
        Ok(list) if list.is_empty() => Err("at least one `whsec_` secret".into()),
        Ok(list) => Ok(WebhookSecrets(list)),
        Err(e) => Err(e.to_string()),
    }
}

impl From<PaymentArgs> for Option<PaymentSettings> {
    fn from(a: PaymentArgs) -> Self {
        a.payment_webhook_secrets.map(|s| PaymentSettings {
            secrets: s.0,
            currency: a.sale_currency,
        })
    }
}

/// A JWT algorithm by name (`JWT_ALGORITHM`, the bench's `--jwt-algorithm`).
pub fn parse_algorithm(s: &str) -> Result<jsonwebtoken::Algorithm, String> {
    s.parse().map_err(|_| {
        format!("{s:?}: one of HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_ranges_match_their_addresses_only() {
        let parse_proxies = |s: &str| s.parse::<TrustedProxies>().map(|p| p.0);
        let nets = parse_proxies("10.0.0.0/8, 127.0.0.2,::1").unwrap();
        let any = |ip: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            nets.iter().any(|n| n.contains(&ip.to_canonical()))
        };
        assert!(any("10.200.3.4"));
        assert!(any("127.0.0.2"));
        assert!(any("::ffff:127.0.0.2"));
        assert!(any("::1"));
        assert!(!any("11.0.0.1"));
        assert!(!any("127.0.0.1"));
        assert!(!any("::2"));
        assert!(parse_proxies("10.0.0.0/33").is_err());
        assert!(parse_proxies("example.com").is_err());
        let all = parse_proxies("0.0.0.0/0").unwrap();
        assert!(all[0].contains(&"8.8.8.8".parse::<IpAddr>().unwrap()));
    }
}
