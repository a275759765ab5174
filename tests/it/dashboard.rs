//! The operator's dashboard: its login, its shared reads, and the page in a
//! real browser.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::Value;

use flashsale::config::RedisTarget;

use crate::browser::Browser;
use crate::helpers::{
    ADMIN_TOKEN, Backend, TestApp, assert_error, eventually, eventually_some, spawn_app_on,
    spawn_app_with,
};
use crate::proxy::Proxy;

/// A client that shows redirects instead of following them, and keeps no cookies.
fn raw_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

async fn log_in(app: &TestApp, token: &str) -> reqwest::Response {
    raw_client()
        .post(app.url("/admin/login"))
        .form(&[("token", token)])
        .send()
        .await
        .expect("answered")
}

/// The `name=value` part of a login's cookie.
pub(crate) async fn session_cookie(app: &TestApp) -> String {
    let resp = log_in(app, ADMIN_TOKEN).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let cookie = resp.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    cookie.split(';').next().unwrap().to_owned()
}

async fn get_with(app: &TestApp, path: &str, cookie: Option<&str>) -> reqwest::Response {
    let mut req = raw_client().get(app.url(path));
    if let Some(cookie) = cookie {
        req = req.header(COOKIE, cookie);
    }
    req.send().await.expect("answered")
}

pub(crate) async fn data(app: &TestApp, cookie: &str) -> Value {
    let resp = get_with(app, "/admin/dashboard/data", Some(cookie)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.expect("JSON")
}

/// Without a session: the page is the login form, the data a JSON 401.
async fn without_a_session_the_login_form(app: &TestApp) {
    let page = get_with(app, "/admin/dashboard", None).await;
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    let form = page.text().await.unwrap();
    assert!(form.contains("action=\"/admin/login\""), "{form}");
    let refused = get_with(app, "/admin/dashboard/data", None).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
}

/// Behind a TLS-terminating proxy the cookie is Secure too.
async fn behind_tls_the_cookie_is_secure(app: &TestApp) {
    let behind_tls = raw_client()
        .post(app.url("/admin/login"))
        .header("X-Forwarded-Proto", "https")
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    let set = behind_tls.headers()[SET_COOKIE].to_str().unwrap();
    assert!(set.split("; ").any(|a| a == "Secure"), "{set}");
}

/// A session cookie changed by hand (a later expiry) proves nothing.
async fn a_later_expiry_written_by_hand_proves_nothing(app: &TestApp, cookie: &str) {
    let (name, value) = cookie.split_once('=').unwrap();
    let (expires, rest) = value.split_once('.').unwrap();
    let later = expires.parse::<u128>().unwrap() + 86_400_000;
    let forged = format!("{name}={later}.{rest}");
    let resp = get_with(app, "/admin/dashboard/data", Some(&forged)).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn login_exchanges_the_admin_token_for_a_signed_http_only_cookie() {
    let app = spawn_app_with(|_| {}).await;
    without_a_session_the_login_form(&app).await;

    // A wrong token: the form again, with the reason, and no cookie.
    let wrong = log_in(&app, "test-admin-token-0123456780").await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(SET_COOKIE).is_none());
    assert!(wrong.text().await.unwrap().contains("wrong token"));

    // The right one: a redirect to the page and a cookie that scripts
    // cannot read, other sites cannot send, that names no secret and ends.
    let ok = log_in(&app, ADMIN_TOKEN).await;
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    assert_eq!(ok.headers()[LOCATION], "/admin/dashboard");
    let set = ok.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    let attributes: Vec<&str> = set.split("; ").collect();
    for wanted in ["HttpOnly", "SameSite=Strict", "Path=/admin", "Max-Age=900"] {
        assert!(attributes.contains(&wanted), "{wanted} in {set}");
    }
    assert!(!attributes.contains(&"Secure"), "plain HTTP: {set}");
    assert!(!set.contains(ADMIN_TOKEN));
    let cookie = set.split(';').next().unwrap();
    let page = get_with(&app, "/admin/dashboard", Some(cookie)).await;
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("/admin/assets/dashboard.js")
    );

    behind_tls_the_cookie_is_secure(&app).await;
    a_later_expiry_written_by_hand_proves_nothing(&app, cookie).await;

    // Another site's page cannot sign the operator out: refused, logged,
    // the session still good.
    let forged = raw_client()
        .post(app.url("/admin/logout"))
        .header(COOKIE, cookie)
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let still = get_with(&app, "/admin/dashboard/data", Some(cookie)).await;
    assert_eq!(still.status(), StatusCode::OK, "the session survives");
    let log = app.admin_log().await;
    assert_eq!(log["entries"][0]["action"], "dashboard.forged", "{log}");

    // Signing out drops the cookie.
    let out = raw_client()
        .post(app.url("/admin/logout"))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    let set = out.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        set.starts_with("flashsale_admin=;") && set.contains("Max-Age=0"),
        "{set}"
    );
}

#[tokio::test]
async fn a_dashboard_session_ends_at_its_expiry() {
    let app = spawn_app_with(|s| s.http.dashboard_session = Duration::from_secs(1)).await;
    let cookie = session_cookie(&app).await;
    let resp = get_with(&app, "/admin/dashboard/data", Some(&cookie)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Past the session's life.
    tokio::time::sleep(app.settings.http.dashboard_session + Duration::from_millis(100)).await;
    for path in ["/admin/dashboard/data", "/admin/dashboard"] {
        let resp = get_with(&app, path, Some(&cookie)).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
}

#[tokio::test]
async fn without_the_admin_routes_there_is_no_dashboard() {
    let app = spawn_app_with(|s| s.http.admin_routes = false).await;
    assert_eq!(
        log_in(&app, ADMIN_TOKEN).await.status(),
        StatusCode::NOT_FOUND
    );
    let page = get_with(&app, "/admin/dashboard", None).await;
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
}

crate::on_both_backends!(the_numbers_match_redis_and_mysql);

async fn the_numbers_match_redis_and_mysql(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = app.new_sale(10, 1).await;
    app.accept_orders(&sku, 1..=3).await;
    let cookie = session_cookie(&app).await;
    eventually("3 orders persisted", Duration::from_secs(10), || async {
        app.persisted(&sku).await.0 == 3
    })
    .await;
    // A read after the orders were persisted (one read per tick).
    let snapshot = eventually_some(
        "a read with the 3 orders persisted, within 5 s",
        Duration::from_secs(5),
        || async {
            let snapshot = data(&app, &cookie).await;
            (snapshot["sales"][0]["persisted"] == 3).then_some(snapshot)
        },
    )
    .await;
    let sale = &snapshot["sales"][0];
    assert_eq!(sale["product_id"], sku.as_str());
    assert_eq!(sale["stock"], app.stock(&sku).await.unwrap());
    assert_eq!(sale["initial"], 10);
    assert_eq!(sale["accepted"], 3);
    assert_eq!(sale["persisted"], 3);
    assert_eq!(sale["pending"], 0);
    assert_eq!(sale["lag"], 0);
    assert_eq!(sale["dead_letters"], 0);
    assert_eq!(sale["state"], "live");
    assert_eq!(snapshot["instance"]["orders_total"]["accepted"], 3);
    let consumers = sale["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{sale}");
    assert_eq!(consumers[0]["name"], "w");
}

#[tokio::test]
async fn viewers_share_one_read_per_tick() {
    let app = spawn_app_with(|_| {}).await;
    let sku = app.new_sale(10, 1).await;
    let cookie = session_cookie(&app).await;
    assert_eq!(
        data(&app, &cookie).await["sales"][0]["product_id"],
        sku.as_str()
    );

    // Eight viewers polling at once for about three seconds: each answer
    // is a read's, and there is at most one read per tick.
    let started = std::time::Instant::now();
    let viewers: Vec<_> = (0..8)
        .map(|_| {
            let (url, cookie) = (app.url("/admin/dashboard/data"), cookie.clone());
            tokio::spawn(async move {
                let client = raw_client();
                let mut seen = Vec::new();
                for _ in 0..15 {
                    let resp = client.get(&url).header(COOKIE, &cookie).send().await;
                    let snapshot: Value = resp.unwrap().json().await.unwrap();
                    seen.push(snapshot["at_ms"].as_i64().unwrap());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                seen
            })
        })
        .collect();
    let mut reads = Vec::new();
    for viewer in viewers {
        reads.extend(viewer.await.unwrap());
    }
    let elapsed = started.elapsed();
    reads.sort_unstable();
    reads.dedup();
    let ticks = elapsed.as_secs_f64().ceil() as usize + 1;
    assert!(
        reads.len() <= ticks,
        "{} reads in {elapsed:?} for 120 answers",
        reads.len()
    );
    for pair in reads.windows(2) {
        assert!(
            pair[1] - pair[0] >= 990,
            "reads {pair:?} less than a tick apart"
        );
    }
}

#[tokio::test]
async fn while_redis_is_down_the_data_says_so_at_once() {
    let redis = Proxy::start("127.0.0.1:6379").await;
    let app = spawn_app_with(|s| {
        s.redis.target = RedisTarget::Single(format!("redis://127.0.0.1:{}", redis.port));
        s.redis.timeout = Duration::from_millis(300);
        s.workers = None;
    })
    .await;
    let sku = app.new_sale(5, 1).await;
    let cookie = session_cookie(&app).await;
    assert_eq!(
        data(&app, &cookie).await["sales"][0]["product_id"],
        sku.as_str()
    );

    redis.set_on(false);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let asked = std::time::Instant::now();
    let snapshot = data(&app, &cookie).await;
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert!(snapshot["redis_error"].is_string(), "{snapshot}");
    assert_eq!(snapshot["sales"], serde_json::json!([]));

    redis.set_on(true);
    eventually("the sale is back", Duration::from_secs(10), || async {
        let snapshot = data(&app, &cookie).await;
        snapshot["redis_error"].is_null() && snapshot["sales"][0]["stock"] == 5
    })
    .await;
}

/// The text of a sale's field on the page.
async fn field(browser: &Browser, sku: &str, name: &str) -> Option<String> {
    browser
        .text(&format!(
            "section[data-product=\"{sku}\"] [data-field=\"{name}\"]"
        ))
        .await
}

#[tokio::test]
async fn the_dashboard_in_a_browser_shows_a_live_sale_as_redis_has_it() {
    let app = spawn_app_with(|s| {
        if let Some(w) = s.workers.as_mut() {
            w.books_every = Duration::from_millis(300);
            w.retire_every = Duration::from_millis(200);
            w.retire.after = Duration::ZERO;
        }
    })
    .await;
    let sku = app.new_sale(40, 2).await;
    app.accept_orders(&sku, 1..=6).await;
    let Some(browser) = Browser::start().await else {
        return;
    };

    // The page asks for the token; the browser signs in with the form.
    browser.goto(&app.url("/admin/dashboard")).await;
    assert!(
        browser
            .text("form[action=\"/admin/login\"]")
            .await
            .is_some()
    );
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in").await;
    eventually(
        "the dashboard after signing in",
        Duration::from_secs(10),
        || async { browser.text("#instance h2").await.is_some() },
    )
    .await;

    // The fleet: this process (API and workers), with its release.
    eventually("the fleet shown", Duration::from_secs(10), || async {
        let row = browser.text("#fleet tbody tr").await.unwrap_or_default();
        let releases = browser.text("#fleet-releases").await.unwrap_or_default();
        row.contains(flashsale::domain::release::VERSION)
            && row.contains(flashsale::domain::release::COMMIT)
            && row.contains("API + workers")
            && releases.starts_with("One release running")
    })
    .await;

    // The admin log on the page: this sign-in, from this address.
    eventually("the admin log shown", Duration::from_secs(10), || async {
        browser
            .text("#admin-log tbody tr:first-child")
            .await
            .is_some_and(|row| row.contains("dashboard.login") && row.contains("127.0.0.1"))
    })
    .await;

    // The cookie is out of the page's reach (HttpOnly) and Strict.
    let cookies = browser.cookies().await;
    let session = cookies
        .iter()
        .find(|c| c["name"] == "flashsale_admin")
        .unwrap_or_else(|| panic!("no session cookie in {cookies:?}"));
    assert_eq!(session["httpOnly"], true);
    assert_eq!(session["sameSite"], "Strict");
    assert_eq!(browser.eval("return document.cookie;").await, "");

    // The numbers on the page are Redis's.
    let redis_stock = || async { app.stock(&sku).await.unwrap().to_string() };
    eventually(
        "the page shows the sale",
        Duration::from_secs(10),
        || async { field(&browser, &sku, "stock").await == Some(redis_stock().await) },
    )
    .await;
    assert_eq!(field(&browser, &sku, "stock").await.unwrap(), "34");
    assert_eq!(field(&browser, &sku, "initial").await.unwrap(), "40");
    assert_eq!(field(&browser, &sku, "accepted").await.unwrap(), "6");
    let dead: u64 = redis::cmd("XLEN")
        .arg(app.key(&sku, "dead"))
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    assert_eq!(
        field(&browser, &sku, "dead_letters").await.unwrap(),
        dead.to_string()
    );
    eventually(
        "persisted and balanced",
        Duration::from_secs(15),
        || async {
            field(&browser, &sku, "persisted").await.as_deref() == Some("6")
                && field(&browser, &sku, "books")
                    .await
                    .is_some_and(|b| b.starts_with("books balanced"))
        },
    )
    .await;
    assert_eq!(app.persisted(&sku).await.0, 6);
    // No events pushed from this process (no EVENT_WEBHOOK_URL): it says so.
    assert_eq!(
        browser
            .text("#instance [data-field=\"events\"]")
            .await
            .as_deref(),
        Some("not pushed from here")
    );
    // A sale without a waiting room shows no room figures.
    let room_shown = format!(
        "return document.querySelector('section[data-product=\"{sku}\"] .room').offsetParent !== null;"
    );
    assert_eq!(browser.eval(&room_shown).await, false);
    // A sale with a room shows its pace, the pace's bounds and the buyers
    // holding an admission against its cap.
    let room_sku = crate::helpers::unique("room-");
    let mut body = crate::helpers::product_body(&room_sku, 10, 1);
    body["start_time"] = serde_json::json!(crate::helpers::now_ms() + 60_000);
    body["waiting_room"] =
        serde_json::json!({"ceiling_per_sec": 40, "floor_per_sec": 4, "active_cap": 10});
    app.sale_from(body).await;
    eventually("the room's figures", Duration::from_secs(15), || async {
        field(&browser, &room_sku, "room_bounds").await.as_deref() == Some("4–40")
    })
    .await;
    assert_eq!(
        field(&browser, &room_sku, "room_active").await.as_deref(),
        Some("0 of 10")
    );
    let pace = field(&browser, &room_sku, "room_pace")
        .await
        .unwrap_or_default();
    assert!(pace.starts_with("40"), "{pace}");

    // More orders: the page follows without a reload.
    let before = browser.eval("return document.body.dataset.ticks;").await;
    app.accept_orders(&sku, 7..=15).await;
    eventually(
        "the page shows the new orders",
        Duration::from_secs(10),
        || async { field(&browser, &sku, "accepted").await.as_deref() == Some("15") },
    )
    .await;
    assert_eq!(
        field(&browser, &sku, "stock").await.unwrap(),
        redis_stock().await
    );
    assert_eq!(field(&browser, &sku, "stock").await.unwrap(), "25");
    assert_ne!(
        browser.eval("return document.body.dataset.ticks;").await,
        before
    );
    let accepted_total = browser
        .text("#instance [data-total=\"accepted\"]")
        .await
        .unwrap();
    assert_eq!(accepted_total, "15");
    eventually("all persisted", Duration::from_secs(15), || async {
        field(&browser, &sku, "persisted").await.as_deref() == Some("15")
    })
    .await;

    // The screenshot, a test artifact (the README shows one).
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"));
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(dir.join("dashboard.png"), &png).expect("screenshot saved");
    eprintln!("screenshot: {}", dir.join("dashboard.png").display());

    // Closed with its orders unpaid: ended, and why it is not retired.
    app.close_sale(&sku).await;
    eventually(
        "the page says why the sale is not retired",
        Duration::from_secs(10),
        || async {
            field(&browser, &sku, "state").await.as_deref() == Some("ended · not retired: unpaid")
        },
    )
    .await;
    let png = browser.screenshot().await;
    std::fs::write(dir.join("dashboard-ended.png"), &png).expect("screenshot saved");
    browser.quit().await;
}

/// The page's token, from the page itself (`<meta name="csrf-token">`).
async fn csrf_of(app: &TestApp, cookie: &str) -> String {
    let page = get_with(app, "/admin/dashboard", Some(cookie))
        .await
        .text()
        .await
        .unwrap();
    let at = page
        .find("name=\"csrf-token\" content=\"")
        .expect("the token in the page")
        + 27;
    page[at..at + 32].to_owned()
}

async fn action(
    app: &TestApp,
    cookie: &str,
    token: Option<&str>,
    origin: Option<&str>,
    body: serde_json::Value,
) -> (StatusCode, Value) {
    let mut req = raw_client()
        .post(app.url("/admin/dashboard/action"))
        .header(COOKIE, cookie)
        .json(&body);
    if let Some(token) = token {
        req = req.header("x-csrf-token", token);
    }
    if let Some(origin) = origin {
        req = req.header("origin", origin);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A forged cross-site request (another site's page posting with the
/// operator's cookie) is refused: without the page's token, or from
/// another origin; the page's own request goes through, answers as the
/// API does, and is in the admin log under the session.
#[tokio::test]
async fn a_dashboard_action_needs_the_pages_token_and_origin() {
    let app = spawn_app_with(|_| {}).await;
    let sku = app.new_sale(5, 1).await;
    let cookie = session_cookie(&app).await;
    let token = csrf_of(&app, &cookie).await;
    let pause = serde_json::json!({"product_id": sku, "action": "pause"});

    let (status, body) = action(&app, &cookie, None, None, pause.clone()).await;
    assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, _) = action(
        &app,
        &cookie,
        Some("0".repeat(32).as_str()),
        None,
        pause.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another token");
    let (status, _) = action(
        &app,
        &cookie,
        Some(&token),
        Some("https://evil.example"),
        pause.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another origin");
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::ACCEPTED,
        "nothing paused"
    );

    let origin = app.base.clone();
    let (status, body) = action(&app, &cookie, Some(&token), Some(&origin), pause).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["paused"].as_i64().is_some(), "{body}");
    assert_eq!(
        app.place_order(2, &sku, 1).await.status(),
        StatusCode::CONFLICT,
        "paused"
    );
    // Refused as the API refuses it.
    let take = serde_json::json!({"product_id": sku, "action": "restock", "units": -100});
    let (status, body) = action(&app, &cookie, Some(&token), None, take).await;
    assert_error(status, &body, StatusCode::CONFLICT, "insufficient_stock");

    let log = app.admin_log().await;
    let entries = log["entries"].as_array().unwrap();
    assert_eq!(entries[0]["action"], "sale.restock");
    assert_eq!(entries[0]["status"], 409);
    assert_eq!(entries[1]["action"], "sale.pause");
    assert_eq!(entries[1]["product_id"], sku);
    assert!(
        entries[1]["actor"]
            .as_str()
            .unwrap()
            .starts_with("session:")
    );
    // The three forged posts are in the log too, refused, with what they
    // asked, under the session whose cookie they carried.
    for forged in &entries[2..5] {
        assert_eq!(forged["action"], "dashboard.forged", "{forged}");
        assert_eq!(forged["status"], 403, "{forged}");
        assert_eq!(forged["actor"], entries[1]["actor"], "{forged}");
        assert_eq!(forged["asked"]["action"], "pause", "{forged}");
    }
}

/// A restock from the page is applied once per key: the page sends the
/// same key for a double click and for a retry after no answer, and the
/// answer says whether this call moved the stock.
#[tokio::test]
async fn a_restock_from_the_page_is_applied_once_per_key() {
    let app = spawn_app_with(|_| {}).await;
    let sku = app.new_sale(5, 1).await;
    let cookie = session_cookie(&app).await;
    let token = csrf_of(&app, &cookie).await;
    let restock = |units: i64, key: &str| serde_json::json!({"product_id": sku, "action": "restock", "units": units, "restock_key": key});
    let (status, first) = action(&app, &cookie, Some(&token), None, restock(3, "k-1")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["applied"], true, "{first}");
    assert_eq!(first["stock"], 8, "{first}");
    let (status, again) = action(&app, &cookie, Some(&token), None, restock(3, "k-1")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["applied"], false,
        "the same key: done before: {again}"
    );
    assert_eq!(again["stock"], 8, "applied once: {again}");
    assert_eq!(app.stock(&sku).await, Some(8));
    // Another key is another restock.
    let (_, other) = action(&app, &cookie, Some(&token), None, restock(-2, "k-2")).await;
    assert_eq!(other["applied"], true, "{other}");
    assert_eq!(other["stock"], 6, "{other}");
    let (status, body) = action(
        &app,
        &cookie,
        Some(&token),
        None,
        restock(1, &"x".repeat(129)),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    // The admin log keeps each restock's stock before it, as the API's.
    let log = app.admin_log().await;
    let first = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["action"] == "sale.restock")
        .cloned()
        .unwrap();
    assert_eq!(first["before"]["stock"], 5, "{first}");
    assert_eq!(first["after"]["stock"], 8, "{first}");
}

/// The controls in a browser, by the page's own buttons: pause (orders
/// refused), resume, restock (the units sell), close (after a
/// confirmation); the sale itself created and opened by the page's form.
#[tokio::test]
async fn in_a_browser_the_operator_pauses_resumes_restocks_and_closes_a_sale() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|_| {}).await;
    browser.goto(&app.url("/admin/dashboard")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in").await;
    eventually("signed in", Duration::from_secs(10), || async {
        browser.text("#new-sale h2").await.is_some()
    })
    .await;
    let sku = crate::helpers::unique("sku-");
    browser
        .type_into("#create [name=\"product_id\"]", &sku)
        .await;
    browser.type_into("#create [name=\"title\"]", "Phone").await;
    browser
        .eval(
            "const f = document.getElementById('create').elements; \
             f.available_qty.value = '2'; f.limit_per_user.value = '5'; return true;",
        )
        .await;
    browser.click("#create button[type=\"submit\"]").await;
    eventually("created and open", Duration::from_secs(10), || async {
        browser
            .text("#create-result")
            .await
            .is_some_and(|t| t.contains("created and open"))
    })
    .await;
    assert_eq!(app.stock(&sku).await, Some(2));
    let card = format!("section[data-product=\"{sku}\"]");
    let badge = format!("{card} [data-field=\"state\"]");
    eventually("the sale on the page", Duration::from_secs(10), || async {
        browser
            .text(&badge)
            .await
            .is_some_and(|s| s.starts_with("live"))
    })
    .await;

    // The card says what the operator acts on: the price, the limit per
    // buyer, the time left; paused since when, once paused.
    let fact = |name: &str| {
        let css = format!("{card} [data-field=\"{name}\"]");
        let browser = &browser;
        async move { browser.text(&css).await }
    };
    assert_eq!(fact("price").await.as_deref(), Some("9.99"));
    assert_eq!(fact("limit").await.as_deref(), Some("5"));
    assert!(
        fact("time_left")
            .await
            .is_some_and(|t| t.starts_with("ends in")),
        "the time left"
    );
    assert_eq!(fact("paused_since").await.as_deref(), Some("—"));
    browser.click(&format!("{card} [data-act=\"pause\"]")).await;
    eventually("paused", Duration::from_secs(10), || async {
        browser.text(&badge).await.as_deref() == Some("paused")
    })
    .await;
    eventually("paused since", Duration::from_secs(10), || async {
        fact("paused_since").await.is_some_and(|t| t != "—")
    })
    .await;
    assert_eq!(
        app.place_order(1, &sku, 1).await.status(),
        StatusCode::CONFLICT
    );
    browser
        .click(&format!("{card} [data-act=\"resume\"]"))
        .await;
    eventually("live again", Duration::from_secs(10), || async {
        browser
            .text(&badge)
            .await
            .is_some_and(|s| s.starts_with("live"))
    })
    .await;

    browser
        .eval(&format!(
            "document.querySelector('{card} [data-field=\"units\"]').value = ''; return true;"
        ))
        .await;
    browser
        .type_into(&format!("{card} [data-field=\"units\"]"), "3")
        .await;
    // A double click: one restock (the button waits for its answer, and
    // the page's key makes a second send the same restock).
    browser
        .eval(&format!(
            "const b = document.querySelector('{card} [data-act=\"restock\"]'); \
             b.click(); b.click(); return true;"
        ))
        .await;
    let result = format!("{card} [data-field=\"control-result\"]");
    eventually("restocked", Duration::from_secs(10), || async {
        browser
            .text(&result)
            .await
            .is_some_and(|t| t.contains("stock 5 of 5"))
    })
    .await;
    assert_eq!(app.stock(&sku).await, Some(5), "restocked once");
    // Taking units away asks first; answered no, nothing is sent.
    browser
        .eval(&format!(
            "window.confirm = (m) => {{ window.asked = m; return false; }}; \
             document.querySelector('{card} [data-field=\"units\"]').value = '-1'; \
             document.querySelector('{card} [data-act=\"restock\"]').click(); return true;"
        ))
        .await;
    let asked = browser.eval("return window.asked;").await;
    assert!(
        asked.as_str().is_some_and(|m| m.contains("Take 1 units")),
        "asked: {asked}"
    );
    assert_eq!(app.stock(&sku).await, Some(5), "nothing taken away");
    for user in 1..=5 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }

    // The restocked units sold, as the page shows it: the README's picture.
    eventually(
        "the page shows them sold",
        Duration::from_secs(10),
        || async {
            browser
                .text(&format!("{card} [data-field=\"stock\"]"))
                .await
                .as_deref()
                == Some("0")
        },
    )
    .await;
    let shot = browser.screenshot().await;
    std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/target/tmp")).unwrap();
    std::fs::write(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/tmp/dashboard-controls.png"
        ),
        shot,
    )
    .unwrap();

    // Close: the page asks first (answered yes here).
    browser
        .eval("window.confirm = () => true; return true;")
        .await;
    browser.click(&format!("{card} [data-act=\"close\"]")).await;
    eventually("closed", Duration::from_secs(10), || async {
        browser
            .text(&result)
            .await
            .is_some_and(|t| t.starts_with("close: done"))
    })
    .await;
    let resp = app.place_order(9, &sku, 1).await;
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "sale_ended");
    // The card says what comes next for a closed sale.
    let retires = format!("{card} [data-field=\"retires\"]");
    eventually("the retirement's word", Duration::from_secs(10), || async {
        browser
            .text(&retires)
            .await
            .is_some_and(|t| t.contains("retire") && t.contains("Past sales"))
    })
    .await;
    // Each action in the admin log, under the page's session.
    let log = app.admin_log().await;
    let ours: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["product_id"] == sku.as_str())
        .filter(|e| {
            e["actor"]
                .as_str()
                .is_some_and(|a| a.starts_with("session:"))
        })
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        ours,
        [
            "sale.close",
            "sale.restock",
            "sale.resume",
            "sale.pause",
            "product.create"
        ]
    );
    // The log panel, this sale's entries only: each with its date, what
    // was asked and the values before and after.
    browser
        .eval(&format!(
            "const f = document.getElementById('log-sale'); f.value = '{sku}'; \
             f.dispatchEvent(new Event('change')); return true;"
        ))
        .await;
    let rows = || async {
        browser
            .eval(
                "return [...document.querySelectorAll('#admin-log tbody tr')] \
                 .map(r => [...r.cells].map(c => c.textContent));",
            )
            .await
    };
    let shown = eventually_some("this sale's entries", Duration::from_secs(10), || async {
        let rows = rows().await;
        let all_ours = rows
            .as_array()
            .is_some_and(|r| r.len() == 5 && r.iter().all(|row| row[2] == sku.as_str()));
        all_ours.then_some(rows)
    })
    .await;
    let restock = shown
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[1] == "sale.restock")
        .expect("the restock's entry");
    let when = restock[0].as_str().unwrap();
    assert!(
        when.chars().filter(char::is_ascii_digit).count() >= 8,
        "a date and a time: {when}"
    );
    assert!(
        restock[6].as_str().unwrap().contains("\"units\":3"),
        "asked: {restock}"
    );
    let change = restock[7].as_str().unwrap();
    assert!(
        change.contains(" → ") && change.contains("\"stock\":5"),
        "before → after: {restock}"
    );
    browser.quit().await;
}

/// The page's other actions: the room's bounds, the events' dead letters
/// replayed; each as the admin API does it, in the admin log.
#[tokio::test]
async fn from_the_dashboard_the_rooms_bounds_change_and_dead_letters_replay() {
    let app = spawn_app_with(|_| {}).await;
    let sku = crate::helpers::unique("room-");
    let mut body = crate::helpers::product_body(&sku, 10, 1);
    body["waiting_room"] = serde_json::json!({"ceiling_per_sec": 50, "admission_secs": 60});
    app.sale_from(body).await;
    let cookie = session_cookie(&app).await;
    let token = csrf_of(&app, &cookie).await;
    let room = serde_json::json!({"product_id": sku, "action": "room", "ceiling_per_sec": 20, "floor_per_sec": 5});
    let (status, body) = action(&app, &cookie, Some(&token), None, room).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            body["ceiling_per_sec"].as_u64(),
            body["floor_per_sec"].as_u64()
        ),
        (Some(20), Some(5))
    );
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(product["waiting_room"]["ceiling_per_sec"], 20, "{product}");
    let (status, body) = action(
        &app,
        &cookie,
        Some(&token),
        None,
        serde_json::json!({"product_id": "", "action": "replay"}),
    )
    .await;
    assert_eq!(
        (status, body["replaying"].as_u64()),
        (StatusCode::OK, Some(0))
    );
    let bad = serde_json::json!({"product_id": sku, "action": "room", "ceiling_per_sec": 0});
    let (status, body) = action(&app, &cookie, Some(&token), None, bad).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    let log = app.admin_log().await;
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        &actions[..3],
        ["room.bounds", "events.replay", "room.bounds"]
    );
    // The change's entry keeps the bounds before it, as the API's does.
    let changed = &log["entries"][2];
    assert_eq!(changed["before"]["ceiling_per_sec"], 50, "{changed}");
    assert_eq!(changed["after"]["ceiling_per_sec"], 20, "{changed}");
}

/// The room's bounds and the dead letters' replay by the page's own
/// buttons: the bounds change as the API changes them, a bound the API
/// refuses is shown with the API's code, and the replay says how many.
#[tokio::test]
async fn in_a_browser_the_operator_sets_the_rooms_bounds_and_replays_dead_letters() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|_| {}).await;
    let sku = crate::helpers::unique("room-");
    let mut body = crate::helpers::product_body(&sku, 10, 1);
    body["waiting_room"] = serde_json::json!({"ceiling_per_sec": 50, "admission_secs": 60});
    app.sale_from(body).await;
    browser.goto(&app.url("/admin/dashboard")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in").await;
    let card = format!("section[data-product=\"{sku}\"]");
    eventually("the sale on the page", Duration::from_secs(10), || async {
        browser
            .eval(&format!(
                "const r = document.querySelector('{card} .room-controls'); return !!r && !r.hidden;"
            ))
            .await
            == Value::Bool(true)
    })
    .await;
    // The room's fields start at its bounds as they are.
    let shown = browser
        .eval(&format!(
            "return document.querySelector('{card} [data-field=\"ceiling\"]').value;"
        ))
        .await;
    assert_eq!(shown, Value::String("50".into()), "the ceiling shown");
    let set = |ceiling: &'static str, floor: &'static str, cap: &'static str| {
        let (browser, card) = (&browser, card.clone());
        async move {
            for (field, value) in [("ceiling", ceiling), ("floor", floor), ("cap", cap)] {
                browser
                    .eval(&format!(
                        "document.querySelector('{card} [data-field=\"{field}\"]').value = ''; return true;"
                    ))
                    .await;
                browser
                    .type_into(&format!("{card} [data-field=\"{field}\"]"), value)
                    .await;
            }
            browser.click(&format!("{card} [data-act=\"room\"]")).await;
        }
    };
    let result = format!("{card} [data-field=\"control-result\"]");
    set("30", "3", "7").await;
    eventually("the bounds set", Duration::from_secs(10), || async {
        browser
            .text(&result)
            .await
            .is_some_and(|t| t.contains("room: 3–30 /s, cap 7"))
    })
    .await;
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    let room = &product["waiting_room"];
    assert_eq!(
        (
            &room["ceiling_per_sec"],
            &room["floor_per_sec"],
            &room["active_cap"]
        ),
        (
            &serde_json::json!(30),
            &serde_json::json!(3),
            &serde_json::json!(7)
        ),
        "{product}"
    );
    // A ceiling the API refuses: its code on the page, nothing changed.
    set("0", "3", "7").await;
    eventually("the refusal shown", Duration::from_secs(10), || async {
        browser
            .text(&result)
            .await
            .is_some_and(|t| t.starts_with("room refused: invalid_request"))
    })
    .await;
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(product["waiting_room"]["ceiling_per_sec"], 30);

    browser.click("#replay").await;
    eventually("the replay answered", Duration::from_secs(10), || async {
        browser
            .text("#replay-result")
            .await
            .is_some_and(|t| t == "0 dead letters to be delivered again")
    })
    .await;
    let log = app.admin_log().await;
    let ours: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["actor"]
                .as_str()
                .is_some_and(|a| a.starts_with("session:"))
        })
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        &ours[..3],
        ["events.replay", "room.bounds", "room.bounds"],
        "{log}"
    );
    browser.quit().await;
}
