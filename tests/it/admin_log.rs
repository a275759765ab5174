//! The admin log: every admin action through the API and the dashboard,
//! and every failed admin authentication, with who (a fingerprint, never
//! the secret) and from where; dashboard sessions a logout ended on every
//! instance.

use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, now_ms, product_body, spawn_app, unique};

/// A page of the log, newest first: (entries, next cursor).
async fn log_page(app: &TestApp, query: &str) -> (Vec<Value>, Value) {
    let page = app.admin_log_page(query).await;
    (
        page["entries"].as_array().expect("entries").clone(),
        page["next"].clone(),
    )
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

#[tokio::test]
async fn every_admin_action_is_logged_with_who_from_where_and_the_values_before_and_after() {
    let app = spawn_app().await;
    let me = format!(
        "token:{}",
        flashsale::http::operators::admin_log::fingerprint(ADMIN_TOKEN.as_bytes())
    );

    // A sale with a room: created, opened, its bounds changed, closed.
    let sku = unique("sku-");
    let mut body = product_body(&sku, 10, 1);
    body["waiting_room"] =
        json!({"ceiling_per_sec": 50, "admission_secs": 60, "join_early_secs": 600});
    app.sale_from(body).await;
    let bounds = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/room")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"ceiling_per_sec": 20, "floor_per_sec": 5}))
        .send()
        .await
        .expect("answered");
    assert_eq!(bounds.status(), StatusCode::OK);
    app.close_sale(&sku).await;
    // A wrong token, twice; a read (not an action: not logged).
    for _ in 0..2 {
        let refused = app
            .client
            .get(app.url("/api/admin/events"))
            .bearer_auth("not-the-admin-token-0123456789")
            .send()
            .await
            .expect("answered");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    }
    let read = app.audit(&sku).await;
    assert_eq!(read["ok"], true);

    let (entries, _) = log_page(&app, "").await;
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "auth.failed",
            "auth.failed",
            "sale.close",
            "room.bounds",
            "sale.open",
            "product.create"
        ],
        "newest first, nothing else"
    );
    let ours = &entries[2..];
    for e in ours {
        assert_eq!(e["actor"], me, "{e}");
        assert_eq!(e["address"], "127.0.0.1", "{e}");
        assert_eq!(e["product_id"], sku, "{e}");
        assert!(e["at"].as_i64().unwrap() <= now_ms());
    }
    let room = &entries[3];
    assert_eq!(room["status"], 200);
    assert_eq!(
        room["asked"],
        json!({"ceiling_per_sec": 20, "floor_per_sec": 5})
    );
    assert_eq!(room["before"]["ceiling_per_sec"], 50, "{room}");
    assert_eq!(room["after"]["ceiling_per_sec"], 20, "{room}");
    assert_eq!(room["after"]["floor_per_sec"], 5, "{room}");
    assert_eq!(entries[5]["asked"]["product_id"], sku);
    let failed = &entries[0];
    assert_eq!(failed["status"], 401);
    assert_eq!(failed["address"], "127.0.0.1");
    assert_ne!(failed["actor"], me);
    // Who is a fingerprint: the secret is nowhere in the log.
    let whole = serde_json::to_string(&entries).unwrap();
    assert!(!whole.contains(ADMIN_TOKEN));
    assert!(!whole.contains("not-the-admin-token"));

    // A page at a time, by the cursor.
    let (first, next) = log_page(&app, "?limit=4").await;
    assert_eq!(first.len(), 4);
    let (rest, end) = log_page(&app, &format!("?limit=4&before={next}")).await;
    assert_eq!(rest.len(), 2);
    assert_eq!(end, Value::Null);
    assert_eq!(rest[1]["action"], "product.create");
    let bad = app
        .client
        .get(app.url("/api/admin/log?limit=0"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

/// The status of `GET url` with `cookie`.
async fn status_with_cookie(url: String, cookie: &str) -> StatusCode {
    no_redirects()
        .get(url)
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .status()
}

/// A dashboard cookie copied before its logout stops working, on the
/// instance that logged out and on every other; the sign-in, the sign-out
/// and a refused sign-in are in the admin log with the client's address.
#[tokio::test]
async fn a_logout_ends_the_session_on_every_instance() {
    let app = spawn_app().await;
    let other = app.serve_beside(|_| {}).await;
    let login = |token: &'static str| {
        no_redirects()
            .post(app.url("/admin/login"))
            .form(&[("token", token)])
            .send()
    };
    let refused = login("not-the-admin-token-0123456789").await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let ok = login(ADMIN_TOKEN).await.unwrap();
    let cookie = ok.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let data = |base: String| status_with_cookie(format!("{base}/admin/dashboard/data"), &cookie);
    assert_eq!(data(app.base.clone()).await, StatusCode::OK);
    assert_eq!(data(other.base.clone()).await, StatusCode::OK);

    let out = no_redirects()
        .post(app.url("/admin/logout"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    // The copy kept before the logout: refused everywhere.
    assert_eq!(data(app.base.clone()).await, StatusCode::UNAUTHORIZED);
    assert_eq!(data(other.base.clone()).await, StatusCode::UNAUTHORIZED);
    let page = status_with_cookie(format!("{}/admin/dashboard", other.base), &cookie).await;
    assert_eq!(page, StatusCode::UNAUTHORIZED);

    let (entries, _) = log_page(&app, "").await;
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["dashboard.logout", "dashboard.login", "auth.failed"]
    );
    assert_eq!(entries[0]["actor"], entries[1]["actor"], "one session");
    assert!(
        entries[0]["actor"]
            .as_str()
            .unwrap()
            .starts_with("session:")
    );
    for e in &entries {
        assert_eq!(e["address"], "127.0.0.1", "{e}");
    }
}

/// The command line's actions are in the admin log too: `flashsale
/// recover`, run by an operator after Redis lost a sale.
#[tokio::test]
async fn a_recovery_from_the_command_line_is_logged() {
    let app = spawn_app().await;
    let sku = app.new_sale(10, 1).await;
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
    app.drained(&sku, 1).await;
    let mut r = app.redis.clone();
    for name in ["sale", "stock", "bought", "idem", "orders", "accepted"] {
        let _: () = redis::cmd("DEL")
            .arg(app.key(&sku, name))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args(["recover", "--product", &sku])
        .env("REDIS_URL", crate::helpers::REDIS_URL)
        .env("REDIS_KEY_PREFIX", &app.prefix)
        .env("DATABASE_URL", &app.settings.db.url)
        .env("USER", "ops-ana")
        .env("RUST_LOG", "error")
        .output()
        .await
        .expect("flashsale recover runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (entries, _) = log_page(&app, "").await;
    let recovered = entries
        .iter()
        .find(|e| e["action"] == "sale.recover")
        .expect("the recovery logged");
    assert_eq!(recovered["product_id"], sku);
    assert!(
        recovered["actor"]
            .as_str()
            .unwrap()
            .starts_with("cli:ops-ana@"),
        "{recovered}"
    );
    assert_eq!(recovered["after"]["stock"], 9, "{recovered}");
}
