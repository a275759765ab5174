//! Signed server-to-server messages, per the Standard Webhooks scheme
//! (<https://www.standardwebhooks.com>): a message carries `webhook-id`,
//! `webhook-timestamp` (seconds since the epoch) and `webhook-signature`
//! (space-separated `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`); the
//! key is the base64 after a secret's `whsec_` prefix. Several secrets are
//! accepted at once, for a rotation; a timestamp more than
//! [`TOLERANCE_SECS`] away from now is refused (a replay, or a clock gone
//! wrong).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::valid::{Invalid, invalid};

/// How far a message's timestamp may be from now, either way (5 minutes,
/// the scheme's recommendation).
pub const TOLERANCE_SECS: i64 = 300;

/// Longest `webhook-id` taken (the scheme's ids are short: `msg_<ulid>`).
pub const MAX_ID_LEN: usize = 128;

/// A `whsec_` secret, decoded.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
    /// The first 4 bytes of the SHA-256 of the secret as written: shown
    /// (`<secret sha256:…>`, as `--dry-run` shows every secret) instead of
    /// the secret.
    fingerprint: [u8; 4],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<secret sha256:{}>", super::hex::hex(&self.fingerprint))
    }
}

impl Secret {
    /// `whsec_<base64 of 24 to 64 random bytes>`.
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        use sha2::Digest;
        let s = s.trim();
        let b64 = s
            .strip_prefix("whsec_")
            .ok_or_else(|| invalid("a webhook secret starts with `whsec_`"))?;
        let key = STANDARD
            .decode(b64)
            .map_err(|_| invalid("a webhook secret is `whsec_` and base64"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(invalid(format!(
                "a webhook secret holds 24 to 64 bytes (this one {})",
                key.len()
            )));
        }
        let digest = Sha256::digest(s.as_bytes());
        let fingerprint = [digest[0], digest[1], digest[2], digest[3]];
        Ok(Self { key, fingerprint })
    }

    /// Several secrets, comma-separated (a rotation: old and new).
    pub fn parse_list(s: &str) -> Result<Vec<Self>, Invalid> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The `webhook-signature` header's value for a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body)))
    }
}

/// The three headers of a signed message, as received.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Why a message was refused (the sender is told only that it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a webhook-id, webhook-timestamp or webhook-signature header is missing or malformed")]
    Malformed,
    #[error("the webhook-timestamp is more than five minutes from now")]
    Stale,
    #[error("no signature matches any of the secrets")]
    BadSignature,
}

impl Signed<'_> {
    /// Checks the message against `secrets` at `now_secs`; on success,
    /// the message's id.
    pub fn verify(
        &self,
        secrets: &[Secret],
        body: &[u8],
        now_secs: i64,
    ) -> Result<String, Refusal> {
        let id = self
            .id
            .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN && id.is_ascii())
            .ok_or(Refusal::Malformed)?;
        let timestamp: i64 = self
            .timestamp
            .and_then(|t| t.parse().ok())
            .ok_or(Refusal::Malformed)?;
        let signature = self.signature.ok_or(Refusal::Malformed)?;
        if now_secs.abs_diff(timestamp) > TOLERANCE_SECS as u64 {
            return Err(Refusal::Stale);
        }
        let offered: Vec<Vec<u8>> = signature
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|b64| STANDARD.decode(b64).ok())
            .collect();
        let matches = secrets.iter().any(|secret| {
            let expected = secret.mac(id, timestamp, body);
            offered
                .iter()
                .any(|o| bool::from(o.as_slice().ct_eq(&expected)))
        });
        match matches {
            true => Ok(id.to_owned()),
            false => Err(Refusal::BadSignature),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The Standard Webhooks specification's own example (its reference
    // libraries test against it).
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: i64 = 1614265330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn signed<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> Signed<'a> {
        Signed {
            id: Some(id),
            timestamp: Some(ts),
            signature: Some(sig),
        }
    }

    #[test]
    fn signs_and_verifies_the_specifications_example() {
        let secret = Secret::parse(SPEC_SECRET).unwrap();
        assert_eq!(secret.sign(SPEC_ID, SPEC_TS, SPEC_BODY), SPEC_SIG);
        let ts = SPEC_TS.to_string();
        let msg = signed(SPEC_ID, &ts, SPEC_SIG);
        assert_eq!(
            msg.verify(std::slice::from_ref(&secret), SPEC_BODY, SPEC_TS + 10),
            Ok(SPEC_ID.into())
        );
        // Several signatures (a sender mid-rotation), one of them right.
        let both = format!("v1,AAAA {SPEC_SIG}");
        let msg = signed(SPEC_ID, &ts, &both);
        assert!(msg.verify(&[secret], SPEC_BODY, SPEC_TS).is_ok());
    }

    #[test]
    fn refuses_what_was_not_signed_with_a_secret_it_holds() {
        let secret = Secret::parse(SPEC_SECRET).unwrap();
        let other = Secret::parse("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
        let ts = SPEC_TS.to_string();
        let ok = signed(SPEC_ID, &ts, SPEC_SIG);
        assert_eq!(
            ok.verify(std::slice::from_ref(&other), SPEC_BODY, SPEC_TS),
            Err(Refusal::BadSignature)
        );
        // A rotation: the old secret beside the new one still verifies.
        assert!(
            ok.verify(&[other, secret.clone()], SPEC_BODY, SPEC_TS)
                .is_ok()
        );
        // A changed body, id or timestamp breaks the signature.
        let secrets = [secret];
        assert_eq!(
            ok.verify(&secrets, b"{}", SPEC_TS),
            Err(Refusal::BadSignature)
        );
        let later = (SPEC_TS + 1).to_string();
        assert_eq!(
            signed(SPEC_ID, &later, SPEC_SIG).verify(&secrets, SPEC_BODY, SPEC_TS),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            signed("msg_other", &ts, SPEC_SIG).verify(&secrets, SPEC_BODY, SPEC_TS),
            Err(Refusal::BadSignature)
        );
        // Too old, or from too far ahead.
        assert_eq!(
            ok.verify(&secrets, SPEC_BODY, SPEC_TS + 301),
            Err(Refusal::Stale)
        );
        assert_eq!(
            ok.verify(&secrets, SPEC_BODY, SPEC_TS - 301),
            Err(Refusal::Stale)
        );
        // Missing or malformed headers; a v0 scheme or no scheme.
        let none = Signed {
            id: None,
            timestamp: Some(&ts),
            signature: Some(SPEC_SIG),
        };
        assert_eq!(
            none.verify(&secrets, SPEC_BODY, SPEC_TS),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            signed(SPEC_ID, "soon", SPEC_SIG).verify(&secrets, SPEC_BODY, SPEC_TS),
            Err(Refusal::Malformed)
        );
        let unversioned = SPEC_SIG.trim_start_matches("v1,");
        assert_eq!(
            signed(SPEC_ID, &ts, unversioned).verify(&secrets, SPEC_BODY, SPEC_TS),
            Err(Refusal::BadSignature)
        );
    }

    #[test]
    fn secrets_are_whsec_and_long_enough() {
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_not base64!").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err(), "5 bytes");
        let two = Secret::parse_list(&format!(
            "{SPEC_SECRET}, whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        ));
        assert_eq!(two.map(|s| s.len()).ok(), Some(2));
        let shown = format!("{:?}", Secret::parse(SPEC_SECRET).unwrap());
        assert!(shown.starts_with("<secret sha256:"), "{shown}");
        assert!(!shown.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    }
}
