//! The waiting room: joining, the draw, the pace, admissions on the order path.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, Polling, TestApp, assert_error, assert_refused, eventually, eventually_some,
    fast_workers, now_ms, poll_for, product_body, spawn_app, spawn_app_with, unique, until,
};

/// A sale with a room: `stock` units, one per buyer, starting `starts_in_ms`
/// from now (negative: started), its ceiling `ceiling` places a second.
async fn room_sale(
    app: &TestApp,
    stock: u64,
    starts_in_ms: i64,
    ceiling: u32,
    admission_secs: u32,
) -> String {
    let id = unique("room-");
    let mut body = product_body(&id, stock, 1);
    body["start_time"] = json!(now_ms() + starts_in_ms);
    body["waiting_room"] = json!({
        "ceiling_per_sec": ceiling,
        "admission_secs": admission_secs,
        "join_early_secs": 600,
    });
    app.sale_from(body).await
}

async fn join(app: &TestApp, sku: &str, user: u64) -> (StatusCode, Value) {
    join_with_proof(app, sku, user, None).await
}

/// Joins, with `Join-Proof: proof` when given.
async fn join_with_proof(
    app: &TestApp,
    sku: &str,
    user: u64,
    proof: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = app
        .client
        .post(app.url(&format!("/api/sales/{sku}/queue")))
        .json(&json!({"user_id": user}));
    if let Some(proof) = proof {
        req = req.header("Join-Proof", proof);
    }
    let resp = req.send().await.expect("answered");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `POST /api/admin/products/{sku}/room` with `body`: the answer.
pub(crate) async fn set_room(app: &TestApp, sku: &str, body: Value) -> (StatusCode, Value) {
    let resp = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/room")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("answered");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn ticket(app: &TestApp, sku: &str, user: u64) -> String {
    let (status, body) = join(app, sku, user).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["ticket"].as_str().expect("a ticket").to_owned()
}

async fn standing(app: &TestApp, sku: &str, ticket: &str) -> (StatusCode, Value) {
    app.get_json(&format!("/api/sales/{sku}/queue/{ticket}"))
        .await
}

async fn admission(app: &TestApp, sku: &str, ticket: &str) -> String {
    eventually_some("admitted", Duration::from_secs(10), || async {
        let (_, s) = standing(app, sku, ticket).await;
        (s["status"] == "admitted").then(|| s["admission"].as_str().unwrap().to_owned())
    })
    .await
}

async fn order_with(
    app: &TestApp,
    sku: &str,
    user: u64,
    admission: Option<&str>,
) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url("/api/orders"))
        .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}));
    if let Some(a) = admission {
        req = req.header("Admission-Token", a);
    }
    req.send().await.expect("answered")
}

#[tokio::test]
async fn without_a_room_nothing_changes() {
    let app = spawn_app().await;
    let sku = app.new_sale(5, 1).await;
    let (status, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(product["waiting_room"], Value::Null);
    let (status, body) = join(&app, &sku, 1).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "no_waiting_room");
    // An admission header is ignored where no room asks for one.
    let resp = order_with(&app, &sku, 1, Some("1.99999999999999.00")).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(
        app.place_order(2, &sku, 1).await.status(),
        StatusCode::ACCEPTED
    );
}

#[tokio::test]
async fn joining_again_gives_the_same_ticket_and_a_ticket_cannot_be_moved() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 10, -1_000, 5, 60).await;
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(
        product["waiting_room"],
        json!({"ceiling_per_sec": 5, "admission_secs": 60, "join_early_secs": 600})
    );
    let (status, first) = join(&app, &sku, 1).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["new"], true);
    let (_, again) = join(&app, &sku, 1).await;
    assert_eq!(again["new"], false);
    assert_eq!(again["ticket"], first["ticket"]);
    let t = first["ticket"].as_str().unwrap();
    let (status, _) = standing(&app, &sku, t).await;
    assert_eq!(status, StatusCode::OK);

    // Another user's, another number, another sale: no such ticket.
    let other_sale = room_sale(&app, 10, -1_000, 5, 60).await;
    let moved = t.replacen("1.", "2.", 1);
    let renumbered = t.replacen(".l1.", ".l2.", 1);
    for (sale, forged) in [
        (&sku, moved.as_str()),
        (&sku, renumbered.as_str()),
        (&other_sale, t),
    ] {
        let (status, body) = standing(&app, sale, forged).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{forged}: {body}");
        assert_eq!(body["error"], "ticket_not_found");
    }
}

#[tokio::test]
async fn an_order_needs_the_buyers_own_valid_admission_for_that_sale() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 10, -1_000, 1000, 60).await;
    let other = room_sale(&app, 10, -1_000, 1000, 60).await;
    let t1 = ticket(&app, &sku, 1).await;
    let a1 = admission(&app, &sku, &t1).await;
    let t_other = ticket(&app, &other, 1).await;
    let a_other = admission(&app, &other, &t_other).await;

    // Refused, with nothing changed: no admission, another buyer's, another
    // sale's, a forged one.
    let later = {
        let (user, rest) = a1.split_once('.').unwrap();
        let (expires, tag) = rest.split_once('.').unwrap();
        format!(
            "{user}.{}.{tag}",
            expires.parse::<i64>().unwrap() + 3_600_000
        )
    };
    for (user, token) in [
        (1, None),
        (2, Some(a1.as_str())),
        (1, Some(a_other.as_str())),
        (1, Some(later.as_str())),
        (1, Some("garbage")),
    ] {
        let resp = order_with(&app, &sku, user, token).await;
        assert_refused(resp, StatusCode::FORBIDDEN, "admission_required").await;
    }
    assert_eq!(app.stock(&sku).await, Some(10));
    assert_eq!(app.stream_len(&sku).await, 0);
    // An instance that has never read the room refuses too (the order
    // script does), and then knows.
    let beside = app.serve_beside(|_| {}).await.ready().await;
    for _ in 0..2 {
        let resp = app
            .client
            .post(format!("{}/api/orders", beside.base))
            .json(&json!({"user_id": 1, "product_id": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_refused(resp, StatusCode::FORBIDDEN, "admission_required").await;
    }
    assert_eq!(app.stock(&sku).await, Some(10));

    // The buyer's own: accepted, once (the per-user limit still holds).
    assert_eq!(
        order_with(&app, &sku, 1, Some(&a1)).await.status(),
        StatusCode::ACCEPTED
    );
    let resp = order_with(&app, &sku, 1, Some(&a1)).await;
    assert_refused(resp, StatusCode::CONFLICT, "limit_exceeded").await;
    assert_eq!(app.stock(&sku).await, Some(9));
}

#[tokio::test]
async fn an_admission_expires() {
    let app = spawn_app().await;
    // 1 s admissions, and a line long enough that it is still moving.
    let admission_secs = 1;
    let sku = room_sale(&app, 100, -1_000, 4, admission_secs).await;
    let t1 = ticket(&app, &sku, 1).await;
    for user in 2..=30 {
        ticket(&app, &sku, user).await;
    }
    let a1 = admission(&app, &sku, &t1).await;
    // Its whole life, and a little more.
    let life = Duration::from_secs(admission_secs.into());
    tokio::time::sleep(life + life * 3 / 10).await;
    let resp = order_with(&app, &sku, 1, Some(&a1)).await;
    assert_refused(resp, StatusCode::FORBIDDEN, "admission_expired").await;
    let (_, s) = standing(&app, &sku, &t1).await;
    assert_eq!(s["status"], "expired", "{s}");
    assert_eq!(app.stock(&sku).await, Some(100));
}

/// Spearman's rank correlation of two orderings of the same n items.
fn rank_correlation(a: &[u64], b: &[u64]) -> f64 {
    let n = a.len() as f64;
    let d2: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[tokio::test]
async fn early_joiners_are_shuffled_at_the_start_and_late_ones_follow_in_order() {
    let app = spawn_app().await;
    let n = 120u64;
    let sku = room_sale(&app, 1_000, 2_500, 50, 60).await;
    let mut tickets = Vec::new();
    for user in 1..=n {
        tickets.push(ticket(&app, &sku, user).await);
    }
    // Before the start: everyone waits for the draw.
    let (_, s) = standing(&app, &sku, &tickets[0]).await;
    assert_eq!(s["status"], "waiting", "{s}");
    assert_eq!(s["place"], Value::Null);
    assert!(s["draw_at"].as_i64().unwrap() > now_ms());
    // Told to ask again at the draw (2.5 s away), not before.
    let until_draw = s["draw_at"].as_i64().unwrap() - now_ms();
    let poll = s["poll_after_ms"].as_i64().unwrap();
    assert!(
        (1_000..=2_600).contains(&poll) && poll >= until_draw - 200,
        "{s}"
    );
    // The first poll after the start has the room read again (the draw
    // needs the final count of early joiners); until then, still waiting.
    eventually("the draw", Duration::from_secs(15), || async {
        standing(&app, &sku, &tickets[0]).await.1["place"].is_u64()
    })
    .await;

    let mut places = Vec::new();
    for t in &tickets {
        let (_, s) = standing(&app, &sku, t).await;
        assert!(s["place"].is_u64(), "{s}");
        places.push(s["place"].as_u64().unwrap());
    }
    let mut sorted = places.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=n).collect::<Vec<_>>(),
        "a permutation of the early joiners"
    );
    let join_order: Vec<u64> = (1..=n).collect();
    let rho = rank_correlation(&join_order, &places);
    assert!(rho.abs() < 0.3, "join order and place correlate: {rho}");

    let late = ticket(&app, &sku, n + 1).await;
    let later = ticket(&app, &sku, n + 2).await;
    let (_, a) = standing(&app, &sku, &late).await;
    let (_, b) = standing(&app, &sku, &later).await;
    assert_eq!(
        (a["place"].as_u64(), b["place"].as_u64()),
        (Some(n + 1), Some(n + 2))
    );
}

#[tokio::test]
async fn a_late_joiner_is_never_placed_by_a_count_read_before_the_draw() {
    let app = spawn_app().await;
    let n = 20u64;
    let starts_at = now_ms() + 1_500;
    let sku = room_sale(&app, 100, starts_at - now_ms(), 1, 60).await;
    // The instance reads the room while they join, before the start.
    for user in 1..=n {
        ticket(&app, &sku, user).await;
    }
    tokio::time::sleep(until(starts_at + 300)).await;
    // The first to join after the start, answered from that reading: its
    // count of early joiners may be short, so no place yet (the page
    // would have shown a place near the front); then behind all of them.
    let (status, joined) = join(&app, &sku, n + 1).await;
    assert_eq!(status, StatusCode::OK, "{joined}");
    assert!(
        joined["place"].is_null() || joined["place"] == n + 1,
        "{joined}"
    );
    let late = joined["ticket"].as_str().unwrap().to_owned();
    eventually(
        "the late joiner's place",
        Duration::from_secs(5),
        || async { standing(&app, &sku, &late).await.1["place"].is_u64() },
    )
    .await;
    assert_eq!(standing(&app, &sku, &late).await.1["place"], n + 1);
}

#[tokio::test]
async fn the_line_moves_at_its_pace_and_the_pace_changes_live() {
    let app = spawn_app().await;
    let starts_at = now_ms() + 1_500;
    let sku = room_sale(&app, 1_000, starts_at - now_ms(), 10, 60).await;
    let mut tickets = Vec::new();
    for user in 1..=100 {
        tickets.push(ticket(&app, &sku, user).await);
    }
    let admitted = |tickets: Vec<String>| {
        let (app, sku) = (&app, sku.clone());
        async move {
            let mut n = 0;
            for t in &tickets {
                if standing(app, &sku, t).await.1["status"] == "admitted" {
                    n += 1;
                }
            }
            n
        }
    };
    // Until the start: the line cannot move before it.
    tokio::time::sleep(until(starts_at)).await;
    // Once the line moves (the instance's first reading after the start
    // has landed: later on a loaded machine), what three seconds at 10/s
    // add, give or take a reading (the instance reads the room about once
    // a second). The early joiners were shuffled at the start: any of
    // them may be first.
    let moving = eventually_some("the line moves", Duration::from_secs(15), || {
        let moving = admitted(tickets.clone());
        async move { Some(moving.await).filter(|n| *n > 0) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let later = admitted(tickets.clone()).await;
    assert!(
        (10..=55).contains(&(later - moving)) && later < tickets.len(),
        "{moving} then {later} admitted 3 s later, at 10/s"
    );

    let (status, _) = set_room(&app, &sku, json!({"ceiling_per_sec": 1000})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(product["waiting_room"]["ceiling_per_sec"], 1000);
    eventually(
        "everyone admitted at the new pace",
        Duration::from_secs(5),
        || {
            let tickets = tickets.clone();
            let admitted = &admitted;
            async move { admitted(tickets).await == 100 }
        },
    )
    .await;
}

#[tokio::test]
async fn a_sold_out_sale_tells_its_waiting_buyers_at_once() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 1, -1_000, 1, 60).await;
    let first = ticket(&app, &sku, 1).await;
    let mut waiting = Vec::new();
    for user in 2..=5 {
        waiting.push(ticket(&app, &sku, user).await);
    }
    let a = admission(&app, &sku, &first).await;
    assert_eq!(
        order_with(&app, &sku, 1, Some(&a)).await.status(),
        StatusCode::ACCEPTED
    );
    eventually(
        "sold out, said to everyone",
        Duration::from_secs(3),
        || async {
            let mut all = true;
            for t in &waiting {
                all &= standing(&app, &sku, t).await.1["status"] == "sold_out";
            }
            all
        },
    )
    .await;
    // While the sale is open units may come back: ask again, not too often.
    let (_, s) = standing(&app, &sku, &waiting[0]).await;
    assert_eq!(s["poll_after_ms"], 5_000, "{s}");
    let (status, body) = join(&app, &sku, 9).await;
    assert_error(status, &body, StatusCode::CONFLICT, "sold_out");
}

/// The server paces polls: a ticket farther back is told to ask again
/// later (about an eighth of its wait, 1 to 30 s).
#[tokio::test]
async fn a_ticket_farther_back_is_told_to_poll_less_often() {
    let app = spawn_app().await;
    // Open, one buyer a second: the 60th waits about a minute.
    let sku = room_sale(&app, 1_000, -1_000, 1, 60).await;
    let mut tickets = Vec::new();
    for user in 1..=60 {
        tickets.push(ticket(&app, &sku, user).await);
    }
    let (_, near) = standing(&app, &sku, &tickets[2]).await;
    let (_, far) = standing(&app, &sku, &tickets[59]).await;
    assert_eq!(near["status"], "waiting", "{near}");
    assert_eq!(far["status"], "waiting", "{far}");
    let (near, far) = (
        near["poll_after_ms"].as_u64().unwrap(),
        far["poll_after_ms"].as_u64().unwrap(),
    );
    assert_eq!(near, 1_000, "near the front: every second");
    assert!((5_000..=8_000).contains(&far), "about a minute away: {far}");
}

#[tokio::test]
async fn the_room_shows_on_the_metrics_and_the_dashboard() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 100, 60_000, 2, 60).await;
    for user in 1..=7 {
        ticket(&app, &sku, user).await;
    }
    // Once the background renewal of this instance's reading of the room
    // has counted them.
    app.get_json("/metrics").await;
    eventually(
        "the metrics count the joiners",
        Duration::from_secs(10),
        || async {
            // Before the start: the operator's scrape (the admin token).
            let text = app.metrics_text().await;
            let series = |name: &str| format!("flashsale_{name}{{product_id=\"{sku}\"}}");
            [
                (series("room_joined"), "7"),
                (series("room_waiting"), "7"),
                (series("room_admitted"), "0"),
                (series("room_admit_per_sec"), "2"),
                (series("room_wait_seconds"), "4"),
            ]
            .iter()
            .all(|(s, v)| text.lines().any(|l| l == format!("{s} {v}")))
        },
    )
    .await;

    let cookie = crate::dashboard::session_cookie(&app).await;
    let data = crate::dashboard::data(&app, &cookie).await;
    let room = &data["sales"][0]["room"];
    assert_eq!(
        (
            room["joined"].as_u64(),
            room["waiting"].as_u64(),
            room["admit_per_sec"].as_f64()
        ),
        (Some(7), Some(7), Some(2.0)),
        "{data}"
    );
}

/// Polls and joins for ids no sale has are answered from the instance's
/// read of the registry, as orders for them are: no Redis script each.
#[tokio::test]
async fn polls_and_joins_for_sales_nobody_opened_cost_redis_nothing() {
    let app = spawn_app().await;
    let real = room_sale(&app, 10, -1_000, 5, 60).await;
    let t = ticket(&app, &real, 1).await;
    // The registry has been read since the sale opened (by this instance).
    eventually(
        "a fresh read of the registry",
        Duration::from_secs(5),
        || async {
            let (status, _) = standing(&app, "made-up-0", "x.e1.00").await;
            status == StatusCode::NOT_FOUND && {
                let before = app.sales.counts().get(flashsale::sale::Counter::RoomCalls);
                standing(&app, "made-up-1", "x.e1.00").await;
                app.sales.counts().get(flashsale::sale::Counter::RoomCalls) == before
            }
        },
    )
    .await;
    let before = app.sales.counts().get(flashsale::sale::Counter::RoomCalls);
    for n in 0..300 {
        let (status, body) = standing(&app, &format!("made-up-{n}"), &t).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "product_not_found");
        // Memory's registry read may be a moment old: it does not say more.
        assert!(
            body["message"].as_str().unwrap().contains("moments ago"),
            "{body}"
        );
    }
    for n in 0..50 {
        let (status, body) = join(&app, &format!("made-up-{n}"), 2).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "product_not_found");
    }
    for n in 0..50 {
        let (status, body) = app
            .get_json(&format!("/api/sales/made-up-{n}/challenge"))
            .await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "product_not_found");
    }
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::RoomCalls) - before,
        0,
        "room scripts for 400 polls, joins and challenges of ids nobody opened"
    );
    // The real sale still answers.
    assert_eq!(standing(&app, &real, &t).await.0, StatusCode::OK);
}

/// Polls every ticket every 100 ms until `done` holds for every answer;
/// admitted buyers order at once (each once). Returns the highest place
/// told `admitted` and how many orders were accepted.
async fn poll_all(
    app: &TestApp,
    sku: &str,
    tickets: &[(u64, String)],
    ordered: &mut std::collections::HashSet<u64>,
    done: &str,
) -> (u64, usize) {
    let (mut most, mut accepted) = (0, 0);
    let mut polling = Polling::at_most(format!("all {done}"), Duration::from_secs(30));
    loop {
        polling.next().await;
        let mut all_done = true;
        for (user, t) in tickets {
            let (status, s) = standing(app, sku, t).await;
            assert_eq!(status, StatusCode::OK, "{s}");
            all_done &= s["status"] == done;
            if s["status"] == "admitted" {
                most = most.max(s["place"].as_u64().unwrap());
                if !ordered.contains(user) {
                    let a = s["admission"].as_str().unwrap();
                    let resp = order_with(app, sku, *user, Some(a)).await;
                    if resp.status() == StatusCode::ACCEPTED {
                        ordered.insert(*user);
                        accepted += 1;
                    }
                }
            }
        }
        if all_done {
            return (most, accepted);
        }
    }
}

/// The room's figure in /metrics.
async fn room_metric(app: &TestApp, sku: &str, name: &str) -> u64 {
    let text = app.metrics_text().await;
    let series = format!("flashsale_{name}{{product_id=\"{sku}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
        .parse()
        .unwrap()
}

/// The room's `admitted` figure is what buyers were told: through a
/// sell-out, units coming back, and the end; once sold out or over,
/// nobody is shown waiting.
#[tokio::test]
async fn the_admitted_figure_is_what_buyers_were_told() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 12, 1_200, 20, 60).await;
    let tickets = line_up(&app, &sku, 1..=60).await;
    let mut ordered = std::collections::HashSet::new();
    let (told, accepted) = poll_all(&app, &sku, &tickets, &mut ordered, "sold_out").await;
    assert_eq!(accepted, 12);
    let figure = room_metric(&app, &sku, "room_admitted").await;
    assert_eq!(
        figure, told,
        "admitted figure vs the last place told admitted"
    );
    assert_eq!(room_metric(&app, &sku, "room_waiting").await, 0);
    assert_eq!(room_metric(&app, &sku, "room_wait_seconds").await, 0);

    // Three buyers cancel: admission goes on from what was admitted
    // (never re-admitting places), and the figure follows what buyers are
    // told until it is sold out again.
    app.drained(&sku, 12).await;
    for (id, user, _) in app.order_rows(&sku).await.iter().take(3) {
        assert_eq!(app.act(id, "cancel", *user as u64).await.0, StatusCode::OK);
    }
    let (mut told_after, mut accepted) = (told, 0);
    let mut polling = Polling::at_most("the returned units bought", Duration::from_secs(60));
    while accepted < 3 {
        polling.next().await;
        let (most, a) = poll_all(&app, &sku, &tickets, &mut ordered, "sold_out").await;
        told_after = told_after.max(most);
        accepted += a;
    }
    assert_eq!(accepted, 3, "the returned units went to buyers in line");
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, told_after);
    assert_eq!(room_metric(&app, &sku, "room_waiting").await, 0);

    // A sale that ends with buyers still waiting.
    let id = unique("room-");
    let mut body = product_body(&id, 1_000, 1);
    body["start_time"] = json!(now_ms() + 1_000);
    body["end_time"] = json!(now_ms() + 3_500);
    body["waiting_room"] =
        json!({"ceiling_per_sec": 10, "admission_secs": 60, "join_early_secs": 600});
    let ends = app.sale_from(body).await;
    let mut tickets = Vec::new();
    for user in 1..=60 {
        tickets.push((user, ticket(&app, &ends, user).await));
    }
    let (told, _) = poll_all(&app, &ends, &tickets, &mut Default::default(), "ended").await;
    assert!(told > 0 && told < 60, "{told}");
    assert_eq!(room_metric(&app, &ends, "room_admitted").await, told);
    assert_eq!(room_metric(&app, &ends, "room_waiting").await, 0);
}

/// A room sale before its start: orders hear `sale_not_started` with
/// `Retry-After`, with or without an admission, before and after this
/// instance learned of the room.
#[tokio::test]
async fn a_room_sale_before_its_start_answers_not_started() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 10, 30_000, 5, 60).await;
    let check = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let retry: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((25..=31).contains(&retry), "Retry-After {retry}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "sale_not_started", "{body}");
    };
    check(order_with(&app, &sku, 1, None).await).await;
    // Joining reads the room: the instance now knows the sale has one.
    ticket(&app, &sku, 1).await;
    check(order_with(&app, &sku, 1, None).await).await;
    check(order_with(&app, &sku, 1, Some("1.99999999999999.00")).await).await;
}

/// Polls are bounded per client address, as documented
/// (`RATE_LIMIT_POLL_PER_SEC` / `_BURST`, set here on the command line).
#[tokio::test]
async fn polls_are_limited_per_address() {
    let app = crate::helpers::spawn_app_cli(
        &[
            "--auth=none",
            "--rate-limit-poll-per-sec=1",
            "--rate-limit-poll-burst=3",
        ],
        |_| {},
    )
    .await;
    let sku = room_sale(&app, 10, 60_000, 5, 60).await;
    let t = ticket(&app, &sku, 1).await;
    for _ in 0..3 {
        assert_eq!(standing(&app, &sku, &t).await.0, StatusCode::OK);
    }
    let resp = app
        .client
        .get(app.url(&format!("/api/sales/{sku}/queue/{t}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited");
}

/// A room sale whose `waiting_room` is `room` (the defaults filled in by
/// the service), `stock` units, one per buyer, starting `starts_in_ms`
/// from now.
async fn room_sale_with(app: &TestApp, stock: u64, starts_in_ms: i64, room: Value) -> String {
    let id = unique("room-");
    let mut body = product_body(&id, stock, 1);
    body["start_time"] = json!(now_ms() + starts_in_ms);
    body["waiting_room"] = room;
    app.sale_from(body).await
}

/// The pace (rounded, buyers per second) as `/metrics` shows it; each
/// scrape lets this instance read the room again (at most once a second).
async fn pace(app: &TestApp, sku: &str) -> u64 {
    room_metric(app, sku, "room_admit_per_sec").await
}

/// Scrapes the pace until it is at `floor` (20 s at most): it only went
/// down on the way, one step at a time (some steps may fall between
/// scrapes), never below `floor`.
async fn pace_steps_down_to(app: &TestApp, sku: &str, floor: u64) {
    let seen = std::cell::RefCell::new(Vec::new());
    let reached = poll_for(Duration::from_secs(20), || async {
        let p = pace(app, sku).await;
        let mut seen = seen.borrow_mut();
        if seen.last() != Some(&p) {
            seen.push(p);
        }
        (p == floor).then_some(())
    })
    .await;
    let seen = seen.into_inner();
    assert!(
        reached.is_some(),
        "the pace never reached its floor: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[1] < w[0]), "{seen:?}");
    assert!(seen.iter().all(|p| *p >= floor), "{seen:?}");
}

/// The pace follows the backend: with no worker persisting, the first
/// order waits; past 2 s the pace halves each second down to its floor
/// (not below); once a worker has persisted what waited, it climbs back
/// to the ceiling.
#[tokio::test]
async fn the_pace_drops_to_its_floor_while_orders_wait_and_climbs_back() {
    let app = spawn_app_with(|s| s.workers = None).await;
    let sku = room_sale_with(
        &app,
        1_000,
        -1_000,
        json!({"ceiling_per_sec": 40, "floor_per_sec": 5, "admission_secs": 60}),
    )
    .await;
    // Joined after the start: user 1 is first in line.
    let first = ticket(&app, &sku, 1).await;
    for user in 2..=600 {
        ticket(&app, &sku, user).await;
    }
    assert_eq!(
        room_metric(&app, &sku, "room_admit_ceiling_per_sec").await,
        40
    );
    assert_eq!(room_metric(&app, &sku, "room_admit_floor_per_sec").await, 5);
    // The first buyer in line orders; nobody persists it.
    let a = admission(&app, &sku, &first).await;
    assert_eq!(
        order_with(&app, &sku, 1, Some(&a)).await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(pace(&app, &sku).await, 40, "no strain yet");
    pace_steps_down_to(&app, &sku, 5).await;
    // It stays at the floor (not below) while the order still waits.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(pace(&app, &sku).await, 5);
    let cookie = crate::dashboard::session_cookie(&app).await;
    let shown = crate::dashboard::data(&app, &cookie).await;
    let room = &shown["sales"][0]["room"];
    assert_eq!(room["admit_per_sec"], 5.0, "{room}");
    assert_eq!(
        (&room["ceiling_per_sec"], &room["floor_per_sec"]),
        (&json!(40), &json!(5)),
        "{room}"
    );
    assert!(room["unpersisted_ms"].as_u64().unwrap() > 2_000, "{room}");

    // A worker comes: the order is persisted and the pace climbs back.
    let _worker = app
        .serve_beside(|s| s.workers = Some(fast_workers("late-worker")))
        .await;
    app.drained(&sku, 1).await;
    eventually(
        "the pace back at its ceiling",
        Duration::from_secs(30),
        || async { pace(&app, &sku).await == 40 },
    )
    .await;
}

/// A ticket for each of `users`, joined in turn: (user, ticket).
async fn line_up(
    app: &TestApp,
    sku: &str,
    users: std::ops::RangeInclusive<u64>,
) -> Vec<(u64, String)> {
    let mut tickets = Vec::new();
    for user in users {
        tickets.push((user, ticket(app, sku, user).await));
    }
    tickets
}

/// Each of `holding` orders `quantity` units with their admission, and is
/// answered 202: the users who ordered.
async fn order_each(
    app: &TestApp,
    sku: &str,
    holding: &[(u64, String)],
    quantity: u64,
) -> Vec<u64> {
    for (user, a) in holding {
        let resp = app
            .client
            .post(app.url("/api/orders"))
            .header("Admission-Token", a)
            .json(&json!({"user_id": user, "product_id": sku, "quantity": quantity}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED, "{user}");
    }
    holding.iter().map(|(user, _)| *user).collect()
}

/// Waits (`limit` at most) until the room has admitted `n` places in all.
async fn until_admitted(app: &TestApp, sku: &str, n: u64, limit: Duration) {
    let what = format!("{n} places admitted");
    eventually(&what, limit, || async {
        room_metric(app, sku, "room_admitted").await >= n
    })
    .await;
}

/// Waits (5 s at most) until the holder of `ticket` is told the sale sold out.
async fn until_told_sold_out(app: &TestApp, sku: &str, ticket: &str) {
    eventually(
        "sold out, said to the line",
        Duration::from_secs(5),
        || async { standing(app, sku, ticket).await.1["status"] == "sold_out" },
    )
    .await;
}

/// Polls each of `tickets`: the users holding an admission, and theirs.
async fn holding(app: &TestApp, sku: &str, tickets: &[(u64, String)]) -> Vec<(u64, String)> {
    let mut holding = Vec::new();
    for (user, t) in tickets {
        let (_, s) = standing(app, sku, t).await;
        if s["status"] == "admitted" {
            holding.push((*user, s["admission"].as_str().unwrap().to_owned()));
        }
    }
    holding
}

/// With an active cap, at most that many buyers hold an admission they
/// have not used, however many poll; an order frees its place in the cap
/// (the line moves on by one), and so does an admission that runs out.
#[tokio::test]
async fn the_active_cap_holds_under_a_crowd_and_frees_a_place_per_order_or_expiry() {
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        1_000,
        1_000,
        json!({"ceiling_per_sec": 100, "active_cap": 10, "admission_secs": 8}),
    )
    .await;
    let tickets = line_up(&app, &sku, 1..=60).await;
    // The crowd polls; returns the users holding an admission.
    let admitted = || holding(&app, &sku, &tickets);
    eventually("the cap reached", Duration::from_secs(10), || async {
        admitted().await.len() >= 10
    })
    .await;
    // At 100/s everyone would have been admitted by now: the cap holds,
    // late joiners included.
    for user in 61..=65 {
        ticket(&app, &sku, user).await;
    }
    for _ in 0..10 {
        let now = admitted().await;
        assert_eq!(now.len(), 10, "{now:?}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(room_metric(&app, &sku, "room_active").await, 10);
    assert_eq!(room_metric(&app, &sku, "room_active_cap").await, 10);
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, 10);

    // Four of them order: four more places are admitted, no more.
    let ordered = order_each(&app, &sku, &admitted().await[..4], 1).await;
    // Admitted and not ordered (an admission stays valid after its use).
    let unused = || async {
        admitted()
            .await
            .into_iter()
            .filter(|(user, _)| !ordered.contains(user))
            .count()
    };
    // The line moved on by four.
    until_admitted(&app, &sku, 14, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, 14);
    assert_eq!(unused().await, 10);

    // The six unused admissions of the first ten run out (8 s): six more.
    // Expired admissions free their places.
    until_admitted(&app, &sku, 20, Duration::from_secs(15)).await;
    assert!(unused().await <= 10);
    assert!(room_metric(&app, &sku, "room_active").await <= 10);
}

/// A sale of several stock shards: a buyer who orders frees their place in
/// the active cap whichever shard decided the order (each shard counts the
/// orders it decides; the room, on shard 0, reads them all).
#[tokio::test]
async fn the_active_cap_of_a_sharded_sale_frees_a_place_per_order_on_any_shard() {
    let app = spawn_app().await;
    let mut body = product_body(&unique("room-"), 1_000, 1);
    body["start_time"] = json!(now_ms() + 1_000);
    body["stock_shards"] = json!(3);
    body["waiting_room"] = json!({"ceiling_per_sec": 100, "active_cap": 6, "admission_secs": 60});
    let sku = app.sale_from(body).await;
    let tickets = line_up(&app, &sku, 1..=30).await;
    let admitted = || holding(&app, &sku, &tickets);
    eventually("the cap reached", Duration::from_secs(10), || async {
        admitted().await.len() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = admitted().await;
    assert_eq!(first.len(), 6, "{first:?}");
    // Some at home on shards 1 and 2 (user_id mod 3; early joiners are
    // admitted in a drawn order: all six on shard 0 once in 729 draws).
    assert!(first.iter().any(|(u, _)| u % 3 != 0), "{first:?}");
    // A bucket long run out on shard 1 (admissions that expired in 1970):
    // it counts for nothing, and the room's next tick drops it.
    let product = flashsale::domain::ProductId::parse(&sku).unwrap();
    let used_1 = app.key(product.shard(1, 3).as_str(), "room_used");
    let mut r = app.redis.clone();
    let _: () = redis::AsyncCommands::hset(&mut r, &used_1, 1, 5)
        .await
        .unwrap();
    order_each(&app, &sku, &first, 1).await;
    // Six orders, six places freed, on whichever shard: the line moves on
    // by six (with shard 0's orders counted alone, by two).
    until_admitted(&app, &sku, 12, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, 12);
    assert_eq!(room_metric(&app, &sku, "room_active").await, 6);
    let old: Option<i64> = redis::AsyncCommands::hget(&mut r, &used_1, 1)
        .await
        .unwrap();
    assert_eq!(old, None, "the expired bucket dropped");
}

/// With buyers ordering as soon as they are admitted, admissions running
/// out every 3 s: the room's count of unused admissions (`room_active`)
/// never reads above the cap (it read 13 for a cap of 10: buyers who had
/// ordered still counted until their second's bucket ran out), while the
/// line cycles through the crowd.
#[tokio::test]
async fn the_active_gauge_never_reads_above_the_cap_as_buyers_order_and_admissions_run_out() {
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        1_000,
        0,
        json!({"ceiling_per_sec": 100, "active_cap": 10, "admission_secs": 3}),
    )
    .await;
    let tickets = line_up(&app, &sku, 1..=80).await;
    let (mut ordered, mut highest) = (std::collections::HashSet::new(), 0);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(9) {
        let fresh: Vec<(u64, String)> = holding(&app, &sku, &tickets)
            .await
            .into_iter()
            .filter(|(user, _)| !ordered.contains(user))
            .collect();
        // The room itself: at most 10 hold an admission they have not used.
        assert!(fresh.len() <= 10, "{} unused admissions", fresh.len());
        // Two in three order at once, the rest let their admission run out.
        let buying: Vec<(u64, String)> = fresh.into_iter().filter(|(u, _)| u % 3 != 0).collect();
        ordered.extend(order_each(&app, &sku, &buying, 1).await);
        highest = highest.max(room_metric(&app, &sku, "room_active").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admitted = room_metric(&app, &sku, "room_admitted").await;
    assert!(admitted > 20, "the line cycled: {admitted} admitted");
    assert!(highest <= 10, "room_active read {highest} for a cap of 10");
}

/// The cap counts what is really held, whatever ran out before: after a
/// batch of admissions expired unused, buyers of the next batch who order
/// (two units each, where the limit allows) free one place each at once,
/// not when the batch expires, and the cap still holds.
#[tokio::test]
async fn the_active_cap_frees_a_place_per_buyer_who_orders_after_unused_expiries() {
    let app = spawn_app().await;
    let id = unique("room-");
    let mut body = product_body(&id, 1_000, 2);
    body["start_time"] = json!(now_ms() + 500);
    body["waiting_room"] = json!({"ceiling_per_sec": 100, "active_cap": 10, "admission_secs": 9});
    let sku = app.sale_from(body).await;
    let tickets = line_up(&app, &sku, 1..=60).await;
    let admitted = || holding(&app, &sku, &tickets);
    // The first ten admitted.
    until_admitted(&app, &sku, 10, Duration::from_secs(10)).await;
    // Nobody orders: the ten run out (9 s) and the next ten come in.
    // The next ten after the first ran out.
    until_admitted(&app, &sku, 20, Duration::from_secs(20)).await;
    let holding = admitted().await;
    assert_eq!(holding.len(), 10, "{holding:?}");
    // Five of them order two units each: five places free at once.
    let t0 = std::time::Instant::now();
    let ordered = order_each(&app, &sku, &holding[..5], 2).await;
    // The line moved on by five.
    until_admitted(&app, &sku, 25, Duration::from_secs(4)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "moved only when the batch ran out"
    );
    // No more than five: ten hold an admission unused.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, 25);
    assert_eq!(room_metric(&app, &sku, "room_active").await, 10);
    let unused = admitted()
        .await
        .into_iter()
        .filter(|(u, _)| !ordered.contains(u))
        .count();
    assert_eq!(unused, 10);
}

/// A pause gives the admissions valid when it began its length again, and
/// the cap counts them as held for that long: after the resume, the line
/// waits for them to run out (later by the pause) before moving on.
#[tokio::test]
async fn the_active_cap_counts_admissions_a_pause_lengthened() {
    let app = spawn_app().await;
    let (admission, pause) = (Duration::from_secs(6), Duration::from_secs(3));
    let sku = room_sale_with(
        &app,
        1_000,
        500,
        json!({"ceiling_per_sec": 100, "active_cap": 10, "admission_secs": admission.as_secs()}),
    )
    .await;
    for user in 1..=40 {
        ticket(&app, &sku, user).await;
    }
    // The cap reached.
    until_admitted(&app, &sku, 10, Duration::from_secs(10)).await;
    let reached = std::time::Instant::now();
    let admin = |action: &'static str| {
        let (app, sku) = (&app, sku.clone());
        async move {
            let resp = app
                .client
                .post(app.url(&format!("/api/admin/products/{sku}/{action}")))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{action}");
        }
    };
    admin("pause").await;
    tokio::time::sleep(pause).await;
    admin("resume").await;
    // Past the admissions' own 6 s, within the 6 + 3 s the pause gave
    // them: still ten held, the line stands.
    while reached.elapsed() < admission + pause / 3 {
        assert_eq!(room_metric(&app, &sku, "room_admitted").await, 10);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Then they run out: the next ten.
    // The next ten.
    until_admitted(&app, &sku, 20, Duration::from_secs(10)).await;
    assert_eq!(room_metric(&app, &sku, "room_admitted").await, 20);
}

/// While a sale is paused its line stands still, whoever joins meanwhile
/// (a join moved the line on over the buyers in it, at the pace since the
/// last reading: joins during a pause went on admitting).
#[tokio::test]
async fn joins_during_a_pause_do_not_move_the_line() {
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        1_000,
        -1_000,
        json!({"ceiling_per_sec": 2, "admission_secs": 60}),
    )
    .await;
    for user in 1..=10 {
        ticket(&app, &sku, user).await;
    }
    until_admitted(&app, &sku, 2, Duration::from_secs(10)).await;
    let resp = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/pause")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let admitted = || async {
        let (status, room) = set_room(&app, &sku, json!({"join_difficulty": 0})).await;
        assert_eq!(status, StatusCode::OK, "{room}");
        room["admitted"].as_u64().unwrap()
    };
    let at_pause = admitted().await;
    // 3 s of joins, one every 150 ms (at 2/s, the line would have moved
    // on 6 places).
    for user in 11..=30 {
        ticket(&app, &sku, user).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(admitted().await, at_pause);
}

/// Units an operator adds to a sold-out room sale (a restock) go to the
/// next places in line, as many as were added: the line moves again from
/// where it stood, and a bot without an admission gets none.
#[tokio::test]
async fn a_restock_of_a_sold_out_room_sale_moves_the_line_on() {
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        2,
        -1_000,
        json!({"ceiling_per_sec": 2, "admission_secs": 60}),
    )
    .await;
    let mut tickets = Vec::new();
    for user in 1..=10 {
        tickets.push(ticket(&app, &sku, user).await);
    }
    for (i, t) in tickets[..2].iter().enumerate() {
        let a = admission(&app, &sku, t).await;
        let resp = order_with(&app, &sku, i as u64 + 1, Some(&a)).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }
    until_told_sold_out(&app, &sku, &tickets[9]).await;
    let admitted = room_metric(&app, &sku, "room_admitted").await as usize;
    assert!(
        (2..=4).contains(&admitted),
        "the room stood at {admitted} admitted"
    );
    // Three units more: the places after those admitted, in order, buy them.
    let resp = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"units": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bot = order_with(&app, &sku, 99, None).await;
    assert_refused(bot, StatusCode::FORBIDDEN, "admission_required").await;
    let mut bought = 0;
    for (i, t) in tickets.iter().enumerate().skip(2) {
        if bought == 3 {
            break;
        }
        let a = admission(&app, &sku, t).await;
        let resp = order_with(&app, &sku, i as u64 + 1, Some(&a)).await;
        if resp.status() == StatusCode::ACCEPTED {
            bought += 1;
        }
    }
    assert_eq!(bought, 3, "the restocked units went to the line");
    until_told_sold_out(&app, &sku, &tickets[9]).await;
    // The room admitted more from where it stood, about the units added.
    let moved = room_metric(&app, &sku, "room_admitted").await as usize;
    assert!(
        moved > admitted && moved <= admitted + 3 + 2,
        "{admitted} -> {moved}"
    );
    app.drained(&sku, 5).await;
}

/// Units that come back to a sold-out room sale (a cancel, unpaid orders'
/// timeouts) go to the next places in line:
/// tickets that heard `sold_out` hear `admitted` again in line order, and a
/// bot ordering without an admission gets nothing at any point.
#[tokio::test]
async fn returned_units_go_to_the_next_in_line_and_never_to_a_bot() {
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        2,
        -1_000,
        json!({"ceiling_per_sec": 2, "admission_secs": 60}),
    )
    .await;
    // Late joiners: served in the order they joined (user n at place n).
    let mut tickets = Vec::new();
    for user in 1..=8 {
        tickets.push(ticket(&app, &sku, user).await);
    }
    let bot = || async {
        let resp = order_with(&app, &sku, 99, None).await;
        assert_refused(resp, StatusCode::FORBIDDEN, "admission_required").await;
    };
    let mut orders = Vec::new();
    for (i, t) in tickets[..2].iter().enumerate() {
        let a = admission(&app, &sku, t).await;
        let resp = order_with(&app, &sku, i as u64 + 1, Some(&a)).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let order: Value = resp.json().await.unwrap();
        orders.push(order["order_id"].as_str().unwrap().to_owned());
    }
    bot().await;
    until_told_sold_out(&app, &sku, &tickets[7]).await;
    let admitted = room_metric(&app, &sku, "room_admitted").await;
    assert!(
        (2..=4).contains(&admitted),
        "the room stood at {admitted} admitted"
    );
    app.drained(&sku, 2).await;

    // A unit comes back: the next place in line is admitted.
    assert_eq!(app.cancel(&orders[0], 1).await.status(), StatusCode::OK);
    let next = admitted as usize; // place admitted + 1, user admitted + 1
    bot().await;
    let a = admission(&app, &sku, &tickets[next]).await;
    bot().await;
    let resp = order_with(&app, &sku, next as u64 + 1, Some(&a)).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // Sold out again: places two or more behind it never got in.
    until_told_sold_out(&app, &sku, &tickets[7]).await;
    assert!(room_metric(&app, &sku, "room_admitted").await <= admitted + 2);
    for t in &tickets[next + 2..] {
        assert_eq!(standing(&app, &sku, t).await.1["status"], "sold_out");
    }
    bot().await;
    app.drained(&sku, 3).await;

    // Unpaid orders time out: their units go to the line as well.
    let swept = app.overdue_sweeper().sweep().await.expect("a sweep");
    assert_eq!(swept.expired, 2, "{swept:?}");
    bot().await;
    let last = tickets.len() - 1;
    let a = admission(&app, &sku, &tickets[last]).await;
    let resp = order_with(&app, &sku, last as u64 + 1, Some(&a)).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    bot().await;
}

/// The bounds are checked where they come in (a sale's creation, the live
/// change), and a live change keeps what it does not name.
#[tokio::test]
async fn room_bounds_are_checked_and_changed_live() {
    let app = spawn_app().await;
    for (room, why) in [
        (
            json!({"ceiling_per_sec": 10, "floor_per_sec": 11}),
            "a floor above the ceiling",
        ),
        (
            json!({"ceiling_per_sec": 10, "floor_per_sec": 0}),
            "a floor of 0",
        ),
        (
            json!({"ceiling_per_sec": 10, "active_cap": 0}),
            "a cap of 0",
        ),
        (
            json!({"ceiling_per_sec": 10, "active_cap": 10_000_001}),
            "a cap too high",
        ),
    ] {
        let mut body = product_body(&unique("room-"), 10, 1);
        body["waiting_room"] = room;
        let resp = app.create_product(&body).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{why}");
    }
    let sku = room_sale_with(&app, 10, 60_000, json!({"ceiling_per_sec": 50})).await;
    // The floor defaults to a tenth of the ceiling; no cap.
    assert_eq!(room_metric(&app, &sku, "room_admit_floor_per_sec").await, 5);
    assert_eq!(room_metric(&app, &sku, "room_active_cap").await, 0);
    let set = |body: Value| set_room(&app, &sku, body);
    for bad in [
        json!({}),
        json!({"floor_per_sec": 0}),
        json!({"ceiling_per_sec": 100_001}),
        json!({"active_cap": 10_000_001}),
        json!({"active_cap": -1}),
    ] {
        let (status, body) = set(bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, room) = set(json!({"active_cap": 7, "floor_per_sec": 20})).await;
    assert_eq!(status, StatusCode::OK, "{room}");
    assert_eq!(
        (
            &room["ceiling_per_sec"],
            &room["floor_per_sec"],
            &room["active_cap"]
        ),
        (&json!(50), &json!(20), &json!(7))
    );
    // A ceiling below the floor takes the floor down with it.
    let (_, room) = set(json!({"ceiling_per_sec": 8})).await;
    assert_eq!(
        (
            &room["ceiling_per_sec"],
            &room["floor_per_sec"],
            &room["active_cap"]
        ),
        (&json!(8), &json!(8), &json!(7))
    );
    assert_eq!(room["admit_per_sec"], 8.0);
    // The books keep the bounds (a sale opened again by recovery has them).
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert_eq!(
        product["waiting_room"],
        json!({"ceiling_per_sec": 8, "floor_per_sec": 8, "active_cap": 7,
               "admission_secs": 120, "join_early_secs": 600}),
        "{product}"
    );
    // The bounds' earlier names are still accepted, in and out of a sale.
    let (status, room) = set(json!({"admit_per_sec": 9, "admit_floor_per_sec": 3})).await;
    assert_eq!(status, StatusCode::OK, "{room}");
    assert_eq!(
        (&room["ceiling_per_sec"], &room["floor_per_sec"]),
        (&json!(9), &json!(3))
    );
    let earlier = json!({"admit_per_sec": 10, "admit_floor_per_sec": 2});
    let old_names = room_sale_with(&app, 10, 60_000, earlier).await;
    let (_, product) = app.get_json(&format!("/api/products/{old_names}")).await;
    assert_eq!(product["waiting_room"]["ceiling_per_sec"], 10, "{product}");
    assert_eq!(product["waiting_room"]["floor_per_sec"], 2, "{product}");
    let (_, room) = set(json!({"active_cap": 0})).await;
    assert_eq!(room["active_cap"], Value::Null);
    assert_eq!(room_metric(&app, &sku, "room_active_cap").await, 0);
}

/// A room that asks a proof of work: a join without one, with another
/// buyer's, with another sale's or a made-up challenge, is refused 403
/// `challenge_required` without a Redis call (for seconds: nor does it
/// renew the room's reading, nor does asking the challenge); a solved
/// challenge joins.
/// The difficulty changes live (0: joining is free again).
#[tokio::test]
async fn a_join_costs_a_proof_of_work_when_the_room_asks_one() {
    use flashsale::sale::room::pow;
    let app = spawn_app().await;
    let sku = room_sale_with(
        &app,
        10,
        60_000,
        json!({"ceiling_per_sec": 10, "join_difficulty": 12}),
    )
    .await;
    let other = room_sale_with(
        &app,
        10,
        60_000,
        json!({"ceiling_per_sec": 10, "join_difficulty": 12}),
    )
    .await;
    let (status, c) = app.get_json(&format!("/api/sales/{sku}/challenge")).await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(c["difficulty"], 12);
    assert!(c["expires_at"].as_i64().unwrap() > now_ms() + 60_000, "{c}");
    let challenge = c["challenge"].as_str().unwrap().to_owned();
    let (_, c2) = app.get_json(&format!("/api/sales/{other}/challenge")).await;
    let other_challenge = c2["challenge"].as_str().unwrap().to_owned();
    assert_ne!(challenge, other_challenge);

    // A proof for buyer 2 that does not also hold for buyer 1.
    let (user, stolen) = (2..)
        .map(|u| (u, pow::solve(&challenge, u, 12)))
        .find(|(_, n)| !pow::holds(&challenge, 1, n, 12))
        .unwrap();
    let before = app.sales.counts().get(flashsale::sale::Counter::RoomCalls);
    for (proof, why) in [
        (None, "no proof"),
        (Some(format!("{challenge}.{stolen}")), "another buyer's"),
        (
            Some(format!(
                "{other_challenge}.{}",
                pow::solve(&other_challenge, 1, 12)
            )),
            "another sale's",
        ),
        (Some(format!("{}.1", "0".repeat(32))), "a made-up challenge"),
        (Some("not a proof".into()), "no challenge at all"),
    ] {
        let (status, body) = join_with_proof(&app, &sku, 1, proof.as_deref()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("challenge_required")),
            "{why}: {body}"
        );
    }
    // Nor do they keep the room's reading fresh: a crowd refused for
    // seconds, asking the challenge again and again, costs no tick either.
    for _ in 0..25 {
        let (status, _) = join(&app, &sku, 1).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = app.get_json(&format!("/api/sales/{sku}/challenge")).await;
        assert_eq!(status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        app.sales.counts().get(flashsale::sale::Counter::RoomCalls),
        before,
        "refused joins and challenge requests cost Redis nothing"
    );
    // The rightful buyer's proof joins.
    let (status, body) =
        join_with_proof(&app, &sku, user, Some(&format!("{challenge}.{stolen}"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mine = pow::solve(&challenge, 1, 12);
    let (status, body) = join_with_proof(&app, &sku, 1, Some(&format!("{challenge}.{mine}"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["ticket"].is_string());

    // Live: no difficulty, no proof needed.
    let (status, _) = set_room(&app, &sku, json!({"join_difficulty": 0})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = join(&app, &sku, 3).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, product) = app.get_json(&format!("/api/products/{sku}")).await;
    assert!(
        product["waiting_room"].get("join_difficulty").is_none(),
        "{product}"
    );
}

/// Polling sooner than `poll_after_ms` gains nothing and costs Redis
/// nothing: 200 polls within about a second are answered the same from
/// the instance's reading, which it renews at most once a second.
#[tokio::test]
async fn early_polls_are_answered_from_memory() {
    let app = spawn_app().await;
    let sku = room_sale(&app, 100, -1_000, 1, 60).await;
    let _first = ticket(&app, &sku, 1).await;
    let mut tickets = Vec::new();
    for user in 2..=40 {
        tickets.push(ticket(&app, &sku, user).await);
    }
    let t = tickets.last().unwrap();
    let (_, s) = standing(&app, &sku, t).await;
    assert_eq!(s["status"], "waiting", "{s}");
    let told = s["poll_after_ms"].as_u64().unwrap();
    assert!(told >= 1_000, "{s}");
    let before = app.sales.counts().get(flashsale::sale::Counter::RoomCalls);
    let started = std::time::Instant::now();
    for _ in 0..200 {
        let (status, again) = standing(&app, &sku, t).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(again["place"], s["place"], "{again}");
    }
    let secs = started.elapsed().as_secs_f64();
    let calls = app.sales.counts().get(flashsale::sale::Counter::RoomCalls) - before;
    assert!(
        calls as f64 <= secs.ceil() + 1.0,
        "{calls} room calls for 200 polls in {secs:.2} s"
    );
}
