//! The dashboard's login sessions: `ADMIN_TOKEN` is exchanged once, in a
//! form's body, for a cookie that names no secret and proves itself: its
//! expiry and a random nonce, signed with HMAC-SHA256 keyed by the admin
//! token. Any instance with the same token accepts it, it ends at its
//! expiry or at its logout (the nonce is then kept in the books until the
//! expiry, for every instance to refuse it: see `dashboard::signed_in`),
//! and changing `ADMIN_TOKEN` ends them all.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::{hex, unhex};

/// The cookie's name.
pub const COOKIE: &str = "flashsale_admin";
/// The cookie is sent only to the dashboard's paths.
pub const COOKIE_PATH: &str = "/admin";

/// A valid session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Its random part (hex): names it (the admin log shows its first 8
    /// digits; a cookie cannot be made from it without the token).
    pub nonce: String,
    /// When it expires (epoch ms).
    pub expires_ms: i64,
}

impl Session {
    /// Who acts in it, for the admin log.
    pub fn actor(&self) -> String {
        format!("session:{}", &self.nonce[..self.nonce.len().min(8)])
    }
}

/// Issues and checks session cookies for one admin token.
#[derive(Clone)]
pub struct Sessions {
    key: Vec<u8>,
    lifetime: Duration,
}

impl std::fmt::Debug for Sessions {
    /// Without the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    pub fn new(admin_token: &str, lifetime: Duration) -> Self {
        Self {
            key: admin_token.as_bytes().to_vec(),
            lifetime,
        }
    }

    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// A new session's cookie value, valid for [`Self::lifetime`] from now
    /// (`<expires_ms>.<nonce>.<mac>`, hex).
    pub fn issue(&self) -> String {
        let mut nonce = [0u8; 16];
        if getrandom::fill(&mut nonce).is_err() {
            // Without randomness the nonce only stops being unique; the
            // signature still proves the issuer.
            nonce = now().as_nanos().to_le_bytes();
        }
        let expires = (now() + self.lifetime).as_millis();
        let claims = format!("{expires}.{}", hex(&nonce));
        format!("{claims}.{}", hex(&self.sign(&claims)))
    }

    /// Whether `value` is a session this key issued that has not expired.
    pub fn valid(&self, value: &str) -> bool {
        self.read(value).is_some()
    }

    /// The session `value` names, if this key issued it and it has not
    /// expired.
    pub fn read(&self, value: &str) -> Option<Session> {
        let (claims, mac) = value.rsplit_once('.')?;
        let (expires, nonce) = claims.split_once('.')?;
        let expires = expires.parse::<u128>().ok()?;
        let mac = unhex(mac)?;
        let mut check = self.mac();
        check.update(claims.as_bytes());
        // Constant time (the library's `verify`), then the expiry.
        (check.verify_slice(&mac).is_ok() && now().as_millis() < expires).then(|| Session {
            nonce: nonce.to_owned(),
            expires_ms: i64::try_from(expires).unwrap_or(i64::MAX),
        })
    }

    /// The session's anti-CSRF token: an HMAC of its nonce (hex, 32
    /// digits), served inside the page; an action must carry it.
    pub fn csrf(&self, session: &Session) -> String {
        let mut mac = self.mac();
        mac.update(b"csrf\0");
        mac.update(session.nonce.as_bytes());
        hex(&mac.finalize().into_bytes()[..16])
    }

    fn mac(&self) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(b"flashsale dashboard session\0");
        mac
    }

    fn sign(&self, claims: &str) -> Vec<u8> {
        let mut mac = self.mac();
        mac.update(claims.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "dashboard-test-token-0123456789";

    #[test]
    fn a_session_is_valid_for_its_issuer_until_it_expires() {
        let sessions = Sessions::new(TOKEN, Duration::from_secs(60));
        let cookie = sessions.issue();
        assert!(sessions.valid(&cookie));
        assert!(!cookie.contains(TOKEN));
        assert_ne!(sessions.issue(), cookie, "each session is its own");
        // Another token (another deployment, or the token changed): refused.
        assert!(!Sessions::new("another-token-0123456789", Duration::from_secs(60)).valid(&cookie));
        let expired = Sessions::new(TOKEN, Duration::ZERO).issue();
        assert!(!sessions.valid(&expired));
    }

    #[test]
    fn a_changed_cookie_is_refused() {
        let sessions = Sessions::new(TOKEN, Duration::from_secs(60));
        let cookie = sessions.issue();
        let (expires, rest) = cookie.split_once('.').unwrap();
        let later: u128 = expires.parse::<u128>().unwrap() + 3_600_000;
        assert!(!sessions.valid(&format!("{later}.{rest}")), "a longer life");
        let mut flipped = cookie.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(!sessions.valid(&String::from_utf8(flipped).unwrap()));
        for junk in ["", ".", "1.2.3", "abc", "99999999999.00.zz"] {
            assert!(!sessions.valid(junk), "{junk:?}");
        }
    }
}
