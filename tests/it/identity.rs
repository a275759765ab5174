//! Who is asking: buyers are verified (bearer JWTs, or a trusted gateway's
//! header), act only as themselves, and see only their own orders.

use std::path::PathBuf;
use std::time::Duration;

use flashsale::app::App;
use flashsale::config::AuthSettings;
use jsonwebtoken::{Algorithm, EncodingKey};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Backend, JWT_SECRET, TestApp, assert_refused, now_ms, settings_for, sign_jwt, spawn_app_cli,
    spawn_app_with, token, unique, until,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jwt")
        .join(name)
}

/// The fixtures' ES256 and RS256 signing keys.
fn private_keys() -> (EncodingKey, EncodingKey) {
    let pem = |name| std::fs::read(fixture(name)).expect("fixture key");
    (
        EncodingKey::from_ec_pem(&pem("ec-private.pem")).expect("an EC key"),
        EncodingKey::from_rsa_pem(&pem("rsa-private.pem")).expect("an RSA key"),
    )
}

fn now_s() -> i64 {
    now_ms() / 1000
}

async fn spawn_with_secret() -> TestApp {
    spawn_app_with(|s| s.http.auth = AuthSettings::hmac(JWT_SECRET)).await
}

impl TestApp {
    async fn as_buyer(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .request(method, self.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send().await.expect("answered")
    }
}

async fn json_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn buyers_see_and_change_only_their_own_orders() {
    use reqwest::Method;
    let app = spawn_with_secret().await;
    let sku = app.new_sale(10, 5).await;
    let (a, b) = (token(1001), token(1002));

    // A orders without naming herself: the token says who she is.
    let (status, order) = json_of(
        app.as_buyer(
            &a,
            Method::POST,
            "/api/orders",
            Some(json!({"product_id": sku, "quantity": 1})),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{order}");
    assert_eq!(order["user_id"], 1001);
    let id = order["order_id"].as_str().unwrap().to_owned();
    app.drained(&sku, 1).await;

    // B cannot order as A, nor read, list or cancel A's order.
    let as_a = json!({"user_id": 1001, "product_id": sku, "quantity": 1});
    assert_refused(
        app.as_buyer(&b, Method::POST, "/api/orders", Some(as_a))
            .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let order_path = format!("/api/orders/{id}");
    assert_refused(
        app.as_buyer(&b, Method::GET, &order_path, None).await,
        StatusCode::NOT_FOUND,
        "order_not_found",
    )
    .await;
    assert_refused(
        app.as_buyer(&b, Method::GET, "/api/users/1001/orders", None)
            .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    for action in ["cancel"] {
        let path = format!("/api/orders/{id}/{action}");
        // Without a body, with a JSON null (also "no body"), and claiming to be A.
        assert_refused(
            app.as_buyer(&b, Method::POST, &path, Some(Value::Null))
                .await,
            StatusCode::NOT_FOUND,
            "order_not_found",
        )
        .await;
        assert_refused(
            app.as_buyer(&b, Method::POST, &path, None).await,
            StatusCode::NOT_FOUND,
            "order_not_found",
        )
        .await;
        assert_refused(
            app.as_buyer(&b, Method::POST, &path, Some(json!({"user_id": 1001})))
                .await,
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    // With identity on, no buyer marks an order paid, not even its owner:
    // only the payment side does (a signed notification, `payments.rs`).
    let pay = format!("/api/orders/{id}/pay");
    for buyer in [&a, &b] {
        assert_refused(
            app.as_buyer(buyer, Method::POST, &pay, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
        )
        .await;
    }
    // Nothing changed: A's order stands, the stock and A's count too.
    assert_eq!(app.stock(&sku).await, Some(9));
    assert_eq!(app.bought(&sku, 1001).await, 1);
    let (status, seen) = json_of(app.as_buyer(&a, Method::GET, &order_path, None).await).await;
    assert_eq!(
        (status, seen["status"].as_str()),
        (StatusCode::OK, Some("confirmed"))
    );
    // A stranger's 404 is the same answer as for an id that never existed.
    let made_up = format!("{sku}:{}", "0".repeat(36));
    let (_, never) = json_of(
        app.as_buyer(&b, Method::GET, &format!("/api/orders/{made_up}"), None)
            .await,
    )
    .await;
    let (_, hidden) = json_of(app.as_buyer(&b, Method::GET, &order_path, None).await).await;
    assert_eq!(never, hidden);

    // A can list, and cancel (her own id in the body is fine).
    let (status, list) = json_of(
        app.as_buyer(&a, Method::GET, "/api/users/1001/orders", None)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["orders"][0]["order_id"], id.as_str());
    let (status, cancelled) = json_of(
        app.as_buyer(
            &a,
            Method::POST,
            &format!("/api/orders/{id}/cancel"),
            Some(json!({"user_id": 1001})),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, cancelled["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
}

#[tokio::test]
async fn idempotency_keys_belong_to_the_verified_buyer() {
    let app = spawn_with_secret().await;
    let sku = app.new_sale(10, 5).await;
    let body = json!({"product_id": sku, "quantity": 1});
    let keyed = |token: String| {
        app.client
            .post(app.url("/api/orders"))
            .bearer_auth(token)
            .header("Idempotency-Key", "same-key")
            .json(&body)
            .send()
    };
    let (_, first) = json_of(keyed(token(2001)).await.unwrap()).await;
    let (status, other) = json_of(keyed(token(2002)).await.unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_ne!(
        first["order_id"], other["order_id"],
        "another buyer's key is not a replay"
    );
    assert_eq!(other["user_id"], 2002);
    let (_, again) = json_of(keyed(token(2001)).await.unwrap()).await;
    assert_eq!(again["order_id"], first["order_id"]);
    assert_eq!(app.stock(&sku).await, Some(8));
}

/// Every token that must not pass, against a server that verifies ES256
/// with a PEM public key, a required issuer and audience, and no leeway.
#[tokio::test]
async fn tokens_that_do_not_verify_get_401_and_change_nothing() {
    let app = spawn_app_with(|s| {
        s.http.auth = AuthSettings {
            jwt_public_key_file: Some(fixture("ec-public.pem")),
            jwt_issuer: Some("https://login.example".into()),
            jwt_audience: Some("flashsale".into()),
            jwt_leeway: Duration::ZERO,
            ..AuthSettings::default()
        };
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    let (ec, rsa) = private_keys();
    let good = json!({"sub": "3001", "iss": "https://login.example", "aud": "flashsale", "exp": now_s() + 600});
    let with = |patch: Value| {
        let mut claims = good.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims
    };
    let es = |claims: Value| sign_jwt(Algorithm::ES256, None, &ec, claims);
    let valid = es(good.clone());
    let mut tampered = valid.clone();
    tampered.replace_range(tampered.len() - 6.., "AAAAAA");
    // An HMAC token keyed with the public key's own bytes: the classic
    // algorithm confusion.
    let public_pem = std::fs::read(fixture("ec-public.pem")).unwrap();
    let confused = sign_jwt(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(&public_pem).unwrap(),
        good.clone(),
    );
    let b64 = |v: Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let alg_none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT"})),
        b64(good.clone())
    );
    let refused: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("malformed", Some("not-a-jwt".into())),
        ("bad signature", Some(tampered)),
        (
            "signed by another key",
            Some(sign_jwt(Algorithm::RS256, None, &rsa, good.clone())),
        ),
        (
            "wrong issuer",
            Some(es(with(json!({"iss": "https://evil.example"})))),
        ),
        ("no issuer", Some(es(with(json!({"iss": null}))))),
        (
            "wrong audience",
            Some(es(with(json!({"aud": "another-service"})))),
        ),
        ("expired", Some(es(with(json!({"exp": now_s() - 5}))))),
        ("no expiry", Some(es(with(json!({"exp": null}))))),
        (
            "not yet valid",
            Some(es(with(json!({"nbf": now_s() + 600})))),
        ),
        ("alg none", Some(alg_none)),
        ("HMAC token to a public key", Some(confused)),
        (
            "user claim not a user id",
            Some(es(with(json!({"sub": "alice"})))),
        ),
        ("user id 0", Some(es(with(json!({"sub": 0}))))),
        // A user id's canonical digits only: one buyer, one spelling.
        ("signed user id", Some(es(with(json!({"sub": "+3001"}))))),
        ("leading zero", Some(es(with(json!({"sub": "03001"}))))),
        (
            "user id with a fraction",
            Some(es(with(json!({"sub": 3001.0})))),
        ),
    ];
    for (what, token) in refused {
        let mut req = app
            .client
            .post(app.url("/api/orders"))
            .json(&json!({"product_id": sku, "quantity": 1}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer", "{what}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized", "{what}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(app.stock(&sku).await, Some(10), "nothing was ordered");
    assert_eq!(app.stream_len(&sku).await, 0);
    // The good one passes (so the refusals above were for their reasons).
    let resp = app
        .client
        .post(app.url("/api/orders"))
        .bearer_auth(valid)
        .json(&json!({"product_id": sku, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}

#[tokio::test]
async fn a_jwks_file_verifies_rs256_and_es256_tokens_by_key_id() {
    let app = spawn_app_with(|s| {
        s.http.auth = AuthSettings {
            jwt_jwks_file: Some(fixture("jwks.json")),
            ..AuthSettings::default()
        };
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    let (ec, rsa) = private_keys();
    let claims = |user: u64| json!({"sub": user, "exp": now_s() + 600});
    let cases = [
        (
            sign_jwt(Algorithm::RS256, Some("rsa-1"), &rsa, claims(4001)),
            StatusCode::ACCEPTED,
        ),
        (
            sign_jwt(Algorithm::ES256, Some("ec-1"), &ec, claims(4002)),
            StatusCode::ACCEPTED,
        ),
        // The EC key's signature under the RSA key's id, an unknown id, none.
        (
            sign_jwt(Algorithm::ES256, Some("rsa-1"), &ec, claims(4003)),
            StatusCode::UNAUTHORIZED,
        ),
        (
            sign_jwt(Algorithm::RS256, Some("rsa-2"), &rsa, claims(4004)),
            StatusCode::UNAUTHORIZED,
        ),
        (
            sign_jwt(Algorithm::RS256, None, &rsa, claims(4005)),
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (i, (token, expected)) in cases.into_iter().enumerate() {
        let resp = app
            .client
            .post(app.url("/api/orders"))
            .bearer_auth(token)
            .json(&json!({"product_id": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), expected, "case {i}");
    }
    assert_eq!(app.stock(&sku).await, Some(8));
    assert_eq!(app.bought(&sku, 4001).await, 1);
    assert_eq!(app.bought(&sku, 4002).await, 1);
}

/// A remembered token still ends at its expiry: the cache never outlives it.
#[tokio::test]
async fn a_cached_token_stops_working_when_it_expires() {
    let app = spawn_app_with(|s| {
        s.http.auth = AuthSettings {
            jwt_leeway: Duration::ZERO,
            ..AuthSettings::hmac(JWT_SECRET)
        }
    })
    .await;
    let exp = now_s() + 2;
    let short = sign_jwt(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap(),
        json!({"sub": "5001", "exp": exp}),
    );
    let list = || {
        app.client
            .get(app.url("/api/users/5001/orders"))
            .bearer_auth(&short)
            .send()
    };
    assert_eq!(list().await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        list().await.unwrap().status(),
        StatusCode::OK,
        "answered again (from the cache)"
    );
    // Until the second after its `exp`.
    tokio::time::sleep(until((exp + 1) * 1000)).await;
    assert_refused(
        list().await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
}

/// The gateway's header is believed from the gateway's address only; from
/// any other peer it is ignored (and, with no JWT configured, that is a 401).
#[tokio::test]
async fn a_gateway_header_is_honoured_only_from_trusted_addresses() {
    // Set as an operator sets it: through `serve`'s command line.
    let app = spawn_app_cli(
        &[
            "--auth-user-header=X-User-Id",
            "--auth-trusted-proxies=10.9.0.0/16, 127.0.0.2",
        ],
        |_| {},
    )
    .await;
    let sku = app.new_sale(10, 5).await;
    let from = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let order = |client: reqwest::Client, user: &str| {
        let req = client
            .post(app.url("/api/orders"))
            .header("X-User-Id", user)
            .json(&json!({"product_id": sku, "quantity": 1}));
        async move { req.send().await.unwrap() }
    };
    assert_refused(
        order(from("127.0.0.1"), "6001").await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let (status, placed) = json_of(order(from("127.0.0.2"), "6001").await).await;
    assert_eq!(
        (status, placed["user_id"].as_u64()),
        (StatusCode::ACCEPTED, Some(6001))
    );
    // Only a user id's canonical digits name a buyer.
    for bad in ["not-a-number", "+6001", "06001", "0", "6001.0"] {
        assert_refused(
            order(from("127.0.0.2"), bad).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        )
        .await;
    }
    // A gateway that appends its header after the client's own: neither
    // value is believed.
    let twice = from("127.0.0.2")
        .post(app.url("/api/orders"))
        .header("X-User-Id", "6002")
        .header("X-User-Id", "6001")
        .json(&json!({"product_id": sku, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_refused(twice, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.stock(&sku).await, Some(9));
    assert_eq!(app.bought(&sku, 6001).await, 1);
}

#[tokio::test]
async fn serve_refuses_to_start_without_an_identity_configuration() {
    let base = || settings_for(Backend::Single, &unique("t"), &unique("fs_test_"));
    let refused = [
        (AuthSettings::default(), "AUTH=none"),
        (
            AuthSettings {
                jwt_secret: Some("short".into()),
                ..AuthSettings::default()
            },
            "JWT_SECRET",
        ),
        (
            AuthSettings {
                user_header: Some("x-user-id".parse().unwrap()),
                ..AuthSettings::default()
            },
            "AUTH_TRUSTED_PROXIES",
        ),
        (
            AuthSettings {
                jwt_secret: Some(JWT_SECRET.into()),
                jwt_public_key_file: Some(fixture("ec-public.pem")),
                ..AuthSettings::default()
            },
            "only one",
        ),
        (
            AuthSettings {
                jwt_public_key_file: Some(fixture("ec-public.pem")),
                jwt_algorithm: Some(Algorithm::HS256),
                ..AuthSettings::default()
            },
            "JWT_ALGORITHM",
        ),
        (
            AuthSettings {
                jwt_public_key_file: Some(fixture("missing.pem")),
                ..AuthSettings::default()
            },
            "missing.pem",
        ),
        (
            AuthSettings {
                jwt_secret: Some(JWT_SECRET.into()),
                ..AuthSettings::off()
            },
            "AUTH=none",
        ),
    ];
    for (auth, says) in refused {
        let mut settings = base();
        settings.http.auth = auth;
        let err = App::build(&settings).await.err().expect("refused");
        let err = flashsale::domain::Chain(&err).to_string();
        assert!(err.contains(says), "says {says:?}: {err}");
    }
    let mut settings = base();
    settings.http.auth = AuthSettings::off();
    assert!(App::build(&settings).await.is_ok(), "AUTH=none starts");
}

#[tokio::test]
async fn lookups_are_throttled_per_address() {
    let app = spawn_app_with(|s| {
        s.http.auth = AuthSettings::hmac(JWT_SECRET);
        s.http.limits.lookup_rate = flashsale::config::RateLimit::new(1, 5);
    })
    .await;
    let sku = app.new_sale(10, 5).await;
    let buyer = token(7001);
    let mut answers = Vec::new();
    // Guessing ids: each a fresh made-up one.
    for i in 0..8 {
        let path = format!("/api/orders/{sku}:{i:036x}");
        answers.push(
            app.as_buyer(&buyer, reqwest::Method::GET, &path, None)
                .await
                .status(),
        );
    }
    assert_eq!(
        &answers[..5],
        [StatusCode::NOT_FOUND; 5],
        "the burst is answered"
    );
    assert!(
        answers[5..].contains(&StatusCode::TOO_MANY_REQUESTS),
        "then throttled: {answers:?}"
    );
}
