//! The rehearsal's buyers' bearer tokens, minted by the bench from the key it
//! is given (an HMAC secret, or a PEM private key): `{"sub": "<user>", "exp":
//! now + 1 h}`. Each buyer's token is minted once and reused for all of their
//! requests, as a real client keeps its token; [`Tokens::mint_all`] mints
//! them before the burst, so signing (an RSA signature takes milliseconds)
//! is not part of what is timed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

/// How long a minted token is valid.
const LIFETIME_SECS: u64 = 3600;

/// A signing key and the tokens minted with it so far.
pub struct Tokens {
    key: EncodingKey,
    header: Header,
    /// `Bearer <token>` by user.
    minted: RwLock<HashMap<u64, Arc<str>>>,
}

impl std::fmt::Debug for Tokens {
    /// Without the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("algorithm", &self.header.alg)
            .field("minted", &self.minted().len())
            .finish()
    }
}

impl Tokens {
    /// HMAC-signed tokens (HS256 unless `alg` says HS384/HS512).
    pub fn hmac(secret: &str, alg: Option<Algorithm>) -> anyhow::Result<Self> {
        let key = EncodingKey::from_secret(secret.as_bytes()).context("the JWT secret")?;
        Self::new(key, alg.unwrap_or(Algorithm::HS256))
    }

    /// Tokens signed with the PEM private key at `path`: an EC key (ES256
    /// unless `alg` says ES384), RSA (RS256, or PS*/RS384/RS512) or Ed25519.
    pub fn from_pem(path: &Path, alg: Option<Algorithm>) -> anyhow::Result<Self> {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        // Each constructor refuses the other key types.
        let (key, default) = EncodingKey::from_ec_pem(&pem)
            .map(|k| (k, Algorithm::ES256))
            .or_else(|_| EncodingKey::from_rsa_pem(&pem).map(|k| (k, Algorithm::RS256)))
            .or_else(|_| EncodingKey::from_ed_pem(&pem).map(|k| (k, Algorithm::EdDSA)))
            .with_context(|| {
                format!(
                    "{} holds no EC, RSA or Ed25519 private key (PKCS#8 PEM)",
                    path.display()
                )
            })?;
        Self::new(key, alg.unwrap_or(default))
    }

    fn new(key: EncodingKey, alg: Algorithm) -> anyhow::Result<Self> {
        anyhow::ensure!(
            alg.family() == key.family(),
            "the JWT algorithm {alg:?} does not fit the key ({:?})",
            key.family()
        );
        Ok(Self {
            key,
            header: Header::new(alg),
            minted: RwLock::new(HashMap::new()),
        })
    }

    /// The algorithm the tokens are signed with.
    pub fn algorithm(&self) -> Algorithm {
        self.header.alg
    }

    /// A fresh token for `user` (not remembered).
    pub fn mint(&self, user: u64) -> Result<String, jsonwebtoken::errors::Error> {
        let exp = jsonwebtoken::get_current_timestamp() + LIFETIME_SECS;
        let claims = json!({"sub": user.to_string(), "exp": exp});
        jsonwebtoken::encode(&self.header, &claims, &self.key)
    }

    /// The `Authorization` header value for `user`: the token minted before,
    /// or one minted now and remembered.
    pub fn bearer(&self, user: u64) -> Result<Arc<str>, jsonwebtoken::errors::Error> {
        if let Some(bearer) = self.minted().get(&user) {
            return Ok(bearer.clone());
        }
        let bearer: Arc<str> = format!("Bearer {}", self.mint(user)?).into();
        let mut minted = self.minted.write().unwrap_or_else(|p| p.into_inner());
        Ok(minted.entry(user).or_insert(bearer).clone())
    }

    /// Mints the tokens of `users` not minted yet, on every core; returns
    /// how many it minted.
    pub async fn mint_all(
        self: &Arc<Self>,
        users: impl IntoIterator<Item = u64>,
    ) -> anyhow::Result<usize> {
        let missing: Vec<u64> = {
            let minted = self.minted();
            let mut missing: Vec<u64> = users
                .into_iter()
                .filter(|u| !minted.contains_key(u))
                .collect();
            missing.sort_unstable();
            missing.dedup();
            missing
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut tasks = Vec::new();
        for chunk in missing.chunks(missing.len().div_ceil(threads).max(1)) {
            let (this, chunk) = (self.clone(), chunk.to_vec());
            tasks.push(tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|u| Ok((u, format!("Bearer {}", this.mint(u)?).into())))
                    .collect::<Result<Vec<(u64, Arc<str>)>, jsonwebtoken::errors::Error>>()
            }));
        }
        for task in tasks {
            let part = task.await?.context("minting a token")?;
            self.minted
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .extend(part);
        }
        Ok(missing.len())
    }

    fn minted(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<str>>> {
        self.minted.read().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buyer_keeps_one_token() {
        let tokens = Tokens::hmac("0123456789abcdef0123456789abcdef", None).unwrap();
        let a = tokens.bearer(7).unwrap();
        assert!(a.starts_with("Bearer "));
        assert!(Arc::ptr_eq(&a, &tokens.bearer(7).unwrap()));
        assert_ne!(a, tokens.bearer(8).unwrap());
        assert!(Tokens::hmac("0123456789abcdef0123456789abcdef", Some(Algorithm::ES256)).is_err());
    }
}
