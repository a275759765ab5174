//! The buyer's page (`/sale/{product_id}`): a static page under the pages'
//! CSP, and the page in a real browser, end to end over the public API:
//! countdown, join, place, admission, order, confirmed; sold out; a
//! shop's bearer token.

use std::time::Duration;

use flashsale::config::AuthSettings;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::helpers::{
    JWT_SECRET, TestApp, eventually, now_ms, product_body, spawn_app, spawn_app_with, token, unique,
};

async fn get(app: &TestApp, path: &str) -> reqwest::Response {
    app.client
        .get(app.url(path))
        .send()
        .await
        .expect("answered")
}

fn header(resp: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> &str {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The pages' policy: this origin's script, style and data, nothing
/// inline, never framed.
fn assert_strict_csp(resp: &reqwest::Response) {
    let csp = header(resp, CONTENT_SECURITY_POLICY);
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} in {csp:?}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(header(resp, "x-content-type-options"), "nosniff");
    assert_eq!(header(resp, "x-frame-options"), "DENY");
}

#[tokio::test]
async fn the_page_is_static_html_under_a_strict_csp_with_its_own_assets() {
    let app = spawn_app().await;
    let sku = app.new_sale(5, 1).await;

    let page = get(&app, &format!("/sale/{sku}")).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(header(&page, CONTENT_TYPE), "text/html; charset=utf-8");
    assert_strict_csp(&page);
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"data-auth="none""#),
        "AUTH=none: a user id field"
    );
    assert!(html.contains(r#"<script src="/sale/assets/sale.js" defer></script>"#));
    assert!(html.contains(r#"href="/sale/assets/sale.css""#));
    // Static: the id is read from the path by the script, never written in.
    assert!(!html.contains(&sku));
    let unknown = get(&app, "/sale/nobody-sells-this").await;
    assert_eq!(unknown.status(), StatusCode::OK);
    assert_eq!(unknown.text().await.unwrap(), html);

    // An id that cannot be a product's: the API's 404.
    for path in ["/sale/no%20such%20id", "/sale/%3Cscript%3E"] {
        let resp = get(&app, path).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "product_not_found", "{path}");
    }

    for (path, content_type, marker) in [
        (
            "/sale/assets/sale.js",
            "text/javascript; charset=utf-8",
            "\"use strict\";",
        ),
        (
            "/sale/assets/sale.css",
            "text/css; charset=utf-8",
            ".countdown",
        ),
    ] {
        let resp = get(&app, path).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_eq!(header(&resp, CONTENT_TYPE), content_type, "{path}");
        assert_strict_csp(&resp);
        assert!(resp.text().await.unwrap().contains(marker), "{path}");
    }

    // Public routes' guards hold here too: more than 64 headers, 431.
    let mut req = app.client.get(app.url(&format!("/sale/{sku}")));
    for i in 0..70 {
        req = req.header(format!("x-filler-{i}"), "1");
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

#[tokio::test]
async fn with_verified_buyers_the_page_says_so_and_needs_no_admin_routes() {
    let app = spawn_app_with(|s| {
        s.http.auth = AuthSettings::hmac(JWT_SECRET);
        s.http.admin_routes = false;
    })
    .await;
    let page = get(&app, "/sale/sku-1").await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_strict_csp(&page);
    assert!(page.text().await.unwrap().contains(r#"data-auth="buyer""#));
}

/// A sale with a waiting room starting `starts_in_ms` from now.
async fn room_sale(app: &TestApp, stock: u64, starts_in_ms: i64, ceiling: u32) -> String {
    let id = unique("room-");
    let mut body = product_body(&id, stock, 1);
    body["title"] = json!("Phone X1");
    body["start_time"] = json!(now_ms() + starts_in_ms);
    body["waiting_room"] = json!({
        "ceiling_per_sec": ceiling,
        "admission_secs": 120,
        "join_early_secs": 600,
    });
    app.sale_from(body).await
}

async fn phase(browser: &Browser) -> String {
    browser
        .eval("return document.body.dataset.phase;")
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn text(browser: &Browser, css: &str) -> String {
    browser.text(css).await.unwrap_or_default()
}

async fn visible(browser: &Browser, css: &str) -> bool {
    let css = serde_json::to_string(css).unwrap();
    browser
        .eval(&format!(
            "const el = document.querySelector({css}); return !!el && el.checkVisibility() && !el.disabled;"
        ))
        .await
        == true
}

async fn wait_for_phase(browser: &Browser, wanted: &str, limit: Duration) {
    eventually(&format!("the page in phase {wanted}"), limit, || async {
        phase(browser).await == wanted
    })
    .await;
}

/// A countdown as the page writes it: `m:ss`, or `h:mm:ss`.
fn is_clock(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[tokio::test]
async fn in_a_browser_a_buyer_waits_in_line_orders_and_sees_it_confirmed() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    // One unit; three early joiners ahead of the page's buyer, who joins
    // after the start: the late joiner's place is 4, and the room admits
    // it at 1 a second.
    let sku = room_sale(&app, 1, 5_000, 1).await;
    for user in 101..=103 {
        crate::room::ticket(&app, &sku, user).await;
    }

    browser.goto(&app.url(&format!("/sale/{sku}"))).await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    assert_eq!(text(&browser, "#title").await, "Phone X1");
    assert!(
        text(&browser, "#countdown-label")
            .await
            .starts_with("Starts in")
    );
    let countdown = text(&browser, "#countdown").await;
    assert!(is_clock(&countdown), "{countdown:?}");
    assert!(
        text(&browser, "#when-note")
            .await
            .contains("The line is open")
    );
    assert!(
        visible(&browser, "#join").await,
        "joining opens 600 s early"
    );
    assert!(
        !visible(&browser, "#buy").await,
        "no buying without an admission"
    );
    // The style applied (the CSP let it in).
    let numerals = browser
        .eval("return getComputedStyle(document.getElementById('countdown')).fontVariantNumeric;")
        .await;
    assert_eq!(numerals, "tabular-nums");
    // AUTH=none: the user id field, labelled.
    assert!(visible(&browser, "#user-id").await);
    assert_eq!(text(&browser, "label[for=user-id]").await, "Your user id");

    // Every call to the room from here on, with when it was sent and when
    // its answer said to ask again.
    browser
        .eval(
            "window.roomCalls = []; const send = window.fetch;
             window.fetch = async (url, init) => {
               const at = performance.now();
               const answer = await send(url, init);
               if (String(url).includes('/queue')) {
                 const body = await answer.clone().json().catch(() => ({}));
                 window.roomCalls.push({at, after: body.poll_after_ms ?? null, status: body.status});
               }
               return answer;
             }; return null;",
        )
        .await;

    // Joining without a user id: told so, in the status region.
    browser.click("#join").await;
    assert!(text(&browser, "#status").await.contains("user id"));
    assert_eq!(
        browser
            .eval("return document.getElementById('status').getAttribute('aria-live');")
            .await,
        "polite"
    );
    browser.type_into("#user-id", "7").await;

    eventually(
        "the sale starts on the page",
        Duration::from_secs(15),
        || async {
            text(&browser, "#countdown-label")
                .await
                .starts_with("On sale now")
        },
    )
    .await;
    browser.click("#join").await;
    eventually(
        "the page shows place 4",
        Duration::from_secs(10),
        || async { phase(&browser).await == "waiting" && text(&browser, "#place").await == "4" },
    )
    .await;
    assert!(!text(&browser, "#ahead").await.is_empty());
    let eta = text(&browser, "#eta").await;
    assert!(
        eta.contains('–') || eta.starts_with("about") || eta == "any moment",
        "{eta:?}"
    );
    assert!(text(&browser, "#line-note").await.contains("estimate"));

    wait_for_phase(&browser, "admitted", Duration::from_secs(20)).await;
    // Asked again when told, never sooner: the join, at least one poll
    // while waiting, the poll that found the turn.
    let calls = browser.eval("return window.roomCalls;").await;
    let calls = calls.as_array().expect("the room's calls");
    assert!(calls.len() >= 3, "{calls:?}");
    assert_eq!(calls.last().unwrap()["status"], "admitted", "{calls:?}");
    for pair in calls.windows(2) {
        let waited = pair[1]["at"].as_f64().unwrap() - pair[0]["at"].as_f64().unwrap();
        let told = pair[0]["after"]
            .as_f64()
            .expect("a waiting answer says when");
        assert!(
            waited >= told - 5.0,
            "asked after {waited} ms, told {told}: {calls:?}"
        );
    }
    assert!(text(&browser, "#status").await.contains("your turn"));
    assert!(is_clock(&text(&browser, "#admission-left").await));
    assert!(visible(&browser, "#buy").await);
    browser.click("#buy").await;
    wait_for_phase(&browser, "done", Duration::from_secs(20)).await;
    assert_eq!(text(&browser, "#order-status").await, "confirmed");
    assert!(text(&browser, "#status").await.contains("confirmed"));
    let order_id = text(&browser, "#order-id").await;
    assert_eq!(app.order_rows(&sku).await, vec![(order_id, 7, 1)]);

    // A second buyer on the sold-out sale.
    browser.goto(&app.url(&format!("/sale/{sku}"))).await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    browser
        .eval("document.getElementById('user-id').value = ''; return null;")
        .await;
    browser.type_into("#user-id", "8").await;
    browser.click("#join").await;
    wait_for_phase(&browser, "over", Duration::from_secs(10)).await;
    assert_eq!(text(&browser, "#status").await, "Sold out.");
    assert_eq!(text(&browser, "#stock").await, "sold out");
    assert!(!visible(&browser, "#join").await);
    browser.quit().await;
}

#[tokio::test]
async fn in_a_browser_at_a_phones_width_a_turn_left_unused_runs_out() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let id = unique("room-");
    let mut body = product_body(&id, 5, 1);
    body["waiting_room"] =
        // 5 s: an admission runs from when the buyer's place was admitted, and a
        // loaded machine's page may poll a second or two late (at 2 s it
        // could miss its whole turn; it was robust only while a room that
        // had admitted everyone moved the expiry on at every reading, issue 68).
        json!({"ceiling_per_sec": 50, "admission_secs": 5, "join_early_secs": 600});
    let sku = app.sale_from(body).await;

    browser.set_window_size(360, 780).await;
    browser.goto(&app.url(&format!("/sale/{sku}"))).await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    browser.type_into("#user-id", "9").await;
    browser.click("#join").await;
    wait_for_phase(&browser, "admitted", Duration::from_secs(20)).await;
    // Nothing wider than the screen; the button within reach.
    let fits = browser
        .eval(
            "const r = document.getElementById('buy').getBoundingClientRect();
             return document.documentElement.scrollWidth <= window.innerWidth
               && r.left >= 0 && r.right <= window.innerWidth;",
        )
        .await;
    assert_eq!(fits, true);
    let width = browser.eval("return window.innerWidth;").await;
    assert!(width.as_u64().is_some_and(|w| w <= 360), "{width}");
    // The buyer does not buy: when the time left reaches 0 the page asks,
    // and the turn is over.
    wait_for_phase(&browser, "over", Duration::from_secs(20)).await;
    let status = text(&browser, "#status").await;
    assert!(status.starts_with("Your turn ran out at"), "{status}");
    assert!(!visible(&browser, "#buy").await);
    assert!(!visible(&browser, "#join").await);
    assert!(app.order_rows(&sku).await.is_empty());
    browser.quit().await;
}

#[tokio::test]
async fn in_a_browser_the_shops_token_is_sent_as_a_bearer_and_leaves_the_address_bar() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|s| s.http.auth = AuthSettings::hmac(JWT_SECRET)).await;
    // No waiting room: a countdown, then a Buy button that orders at once.
    let sku = unique("sku-");
    let mut body = product_body(&sku, 3, 1);
    body["start_time"] = json!(now_ms() + 4_000);
    let sku = app.sale_from(body).await;

    let jwt = token(42);
    browser
        .goto(&app.url(&format!("/sale/{sku}#token={jwt}")))
        .await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    let address = browser.eval("return location.href;").await;
    assert_eq!(address, app.url(&format!("/sale/{sku}")).as_str());
    assert!(
        !visible(&browser, "#user-id").await,
        "a verified buyer has no id field"
    );
    assert!(!visible(&browser, "#join").await, "no waiting room");
    assert!(
        text(&browser, "#countdown-label")
            .await
            .starts_with("Starts in")
    );
    assert!(
        !visible(&browser, "#buy").await,
        "shown, but disabled before the start"
    );
    eventually("Buy at the start", Duration::from_secs(15), || async {
        visible(&browser, "#buy").await
    })
    .await;
    browser.click("#buy").await;
    wait_for_phase(&browser, "done", Duration::from_secs(20)).await;
    // Only a bearer token names user 42: the page sent the fragment's.
    let order_id = text(&browser, "#order-id").await;
    assert_eq!(app.order_rows(&sku).await, vec![(order_id, 42, 1)]);

    // Another page of the shop's, without the fragment: the token stays
    // with the tab, and goes with the join, the polls and the order. This
    // room asks a proof of work: the page solves the challenge for the
    // buyer the token names (it learns who from the challenge's answer).
    let room = room_sale(&app, 2, -1_000, 50).await;
    let (status, _) = crate::room::set_room(&app, &room, json!({"join_difficulty": 10})).await;
    assert_eq!(status, StatusCode::OK);
    browser.goto(&app.url(&format!("/sale/{room}"))).await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    browser.click("#join").await;
    wait_for_phase(&browser, "admitted", Duration::from_secs(20)).await;
    browser.click("#buy").await;
    wait_for_phase(&browser, "done", Duration::from_secs(20)).await;
    let order_id = text(&browser, "#order-id").await;
    assert_eq!(app.order_rows(&room).await, vec![(order_id, 42, 1)]);
    browser.quit().await;
}

/// A sale an operator paused: the page says so, offers no purchase, and
/// offers it again by itself once the sale resumes.
#[tokio::test]
async fn in_a_browser_a_paused_sale_says_so_and_comes_back_by_itself() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let sku = app.new_sale(5, 1).await;
    let admin = |action: &'static str| {
        let app = &app;
        let sku = sku.clone();
        async move {
            let resp = app
                .client
                .post(app.url(&format!("/api/admin/products/{sku}/{action}")))
                .bearer_auth(crate::helpers::ADMIN_TOKEN)
                .send()
                .await
                .expect("answered");
            assert_eq!(resp.status(), StatusCode::OK);
        }
    };
    admin("pause").await;
    browser.goto(&app.url(&format!("/sale/{sku}"))).await;
    eventually("the page says paused", Duration::from_secs(10), || async {
        text(&browser, "#countdown").await == "is paused"
    })
    .await;
    assert!(text(&browser, "#when-note").await.contains("paused"));
    assert!(
        !visible(&browser, "#buy").await,
        "a purchase offered while paused"
    );
    admin("resume").await;
    eventually(
        "the purchase offered again",
        Duration::from_secs(15),
        || async { visible(&browser, "#buy").await },
    )
    .await;
    assert!(
        text(&browser, "#countdown-label")
            .await
            .starts_with("On sale now")
    );
    browser.quit().await;
}

/// Enter in the user-id field does what the visible button does (the form
/// has two fields and no submit button: a browser submits nothing by
/// itself).
#[tokio::test]
async fn in_a_browser_enter_in_the_user_field_joins_the_line() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let sku = room_sale(&app, 5, -1_000, 50).await;
    browser.goto(&app.url(&format!("/sale/{sku}"))).await;
    wait_for_phase(&browser, "idle", Duration::from_secs(10)).await;
    browser.type_into("#user-id", "42\u{E007}").await;
    // Past "joining" (the page's join sent, not yet answered): the join
    // landed. Reading "not idle" let the test's own join below race the
    // page's, and win (`new: true`), one run in three.
    eventually("Enter joined the line", Duration::from_secs(10), || async {
        !matches!(phase(&browser).await.as_str(), "idle" | "joining")
    })
    .await;
    let joined: Value = app
        .client
        .post(app.url(&format!("/api/sales/{sku}/queue")))
        .json(&json!({"user_id": 42}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(joined["new"], false, "the page's buyer joined: {joined}");
    browser.quit().await;
}
