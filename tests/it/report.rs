//! A sale's report: a rehearsed sale with a waiting room, a crowd, signed
//! payments, unpaid orders timing out and a late payment; the report's
//! counts are the books' and the clients' own; it is still there, kept,
//! after the sale retired and its Redis keys are gone; two instances and
//! two workers count into one timeline, nothing twice.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use flashsale::config::Limits;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, PAY_SECRET, Polling, TestApp, eventually, eventually_some, fast_workers, now_ms,
    product_body, spawn_app_cli, unique, until,
};
use crate::payments::amount;

/// A paying service whose workers time unpaid orders out after `timeout`.
async fn spawn_sale_service(timeout: Duration) -> TestApp {
    let secrets = format!("--payment-webhook-secrets={PAY_SECRET}");
    spawn_app_cli(&["--auth=none", &secrets, "--sale-currency=CNY"], |s| {
        s.http.limits = Limits::unlimited();
        let mut w = fast_workers(&unique("w-"));
        w.payment_timeout = timeout;
        w.sweep_every = Duration::from_millis(300);
        s.workers = Some(w);
    })
    .await
}

pub(crate) async fn report(app: &TestApp, sku: &str) -> Value {
    let resp = app
        .client
        .get(app.url(&format!("/api/admin/products/{sku}/report")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

async fn join(app: &TestApp, base: &str, sku: &str, user: u64) -> String {
    let resp = app
        .client
        .post(format!("{base}/api/sales/{sku}/queue"))
        .json(&json!({"user_id": user}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    body["ticket"].as_str().unwrap().to_owned()
}

async fn standing(app: &TestApp, base: &str, sku: &str, ticket: &str) -> Value {
    app.client
        .get(format!("{base}/api/sales/{sku}/queue/{ticket}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// What the clients saw: answers by code, and the orders they got.
#[derive(Default)]
struct Seen {
    answers: BTreeMap<String, u64>,
    orders: Vec<(u64, String)>,
    /// The buyers who sent an order.
    buyers: BTreeSet<u64>,
}

/// The report's buyers who tried are the distinct buyers the clients sent
/// orders as (an estimate: all but exact at these counts).
fn assert_tried(funnel: &Value, seen: &Seen) {
    let tried = funnel["tried"].as_u64().unwrap();
    let sent = seen.buyers.len() as u64;
    assert!(
        tried.abs_diff(sent) <= 1,
        "{tried} tried, {sent} sent: {funnel}"
    );
}

impl Seen {
    async fn order(
        &mut self,
        app: &TestApp,
        base: &str,
        sku: &str,
        user: u64,
        admission: Option<&str>,
    ) {
        let mut req = app
            .client
            .post(format!("{base}/api/orders"))
            .json(&json!({"user_id": user, "product_id": sku, "quantity": 1}));
        if let Some(a) = admission {
            req = req.header("Admission-Token", a);
        }
        self.buyers.insert(user);
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        let code = if status == StatusCode::ACCEPTED {
            self.orders
                .push((user, body["order_id"].as_str().unwrap().to_owned()));
            "accepted".to_owned()
        } else {
            body["error"].as_str().unwrap().to_owned()
        };
        *self.answers.entry(code).or_default() += 1;
    }
}

/// Buyers `users` poll (round robin over `bases`) until each is admitted
/// (and orders, twice for every fifth: the second is over the limit) or
/// hears the sale sold out.
async fn crowd(
    app: &TestApp,
    bases: &[String],
    sku: &str,
    tickets: &[(u64, String)],
    seen: &mut Seen,
) {
    let mut done = HashSet::new();
    let mut polling = Polling::at_most("the crowd done", Duration::from_secs(30));
    while done.len() < tickets.len() {
        polling.next().await;
        for (i, (user, t)) in tickets.iter().enumerate() {
            if done.contains(user) {
                continue;
            }
            let base = &bases[i % bases.len()];
            let s = standing(app, base, sku, t).await;
            match s["status"].as_str() {
                Some("admitted") => {
                    let a = s["admission"].as_str().unwrap().to_owned();
                    seen.order(app, base, sku, *user, Some(&a)).await;
                    if user % 5 == 0 {
                        seen.order(app, base, sku, *user, Some(&a)).await;
                    }
                    done.insert(*user);
                }
                Some("sold_out") | Some("ended") => {
                    done.insert(*user);
                }
                _ => {}
            }
        }
    }
}

/// Retired the moment its last orders time out (a retirer looking every
/// 50 ms), a sale's kept report still counts them: retirement waits until
/// the processes' timelines hold its orders' last changes (it kept
/// `timed_out` 0 for 2 when it retired within the second).
#[tokio::test]
async fn a_sale_retired_as_its_orders_time_out_keeps_them_in_its_report() {
    let app = spawn_sale_service(Duration::from_secs(2)).await;
    let sku = app.new_sale(5, 1).await;
    for user in 1..=3 {
        assert_eq!(
            app.place_order(user, &sku, 1).await.status(),
            StatusCode::ACCEPTED
        );
    }
    app.drained(&sku, 3).await;
    app.close_sale(&sku).await;
    let retirer = app.retiring_workers("retirer", Duration::ZERO);
    let mut passes = crate::helpers::Polling::at_most(
        "retired once its orders timed out",
        Duration::from_secs(30),
    );
    while app.stock(&sku).await.is_some() {
        passes.next().await;
        retirer.retirer().pass().await.expect("a pass");
    }
    let (timed_out,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM tb_order WHERE product_id = ? AND status = 'cancelled'",
    )
    .bind(&sku)
    .fetch_one(&app.mysql)
    .await
    .unwrap();
    assert_eq!(timed_out, 3, "the books");
    let kept = report(&app, &sku).await;
    assert_eq!(kept["kept"], true, "{kept}");
    assert_eq!(
        kept["summary"]["payments"]["timed_out"], 3,
        "the kept report counts every timeout: {}",
        kept["summary"]
    );
}

#[tokio::test]
async fn a_rehearsed_sale_reports_what_the_books_and_the_clients_saw() {
    let app = spawn_sale_service(Duration::from_secs(3)).await;
    let sku = unique("rep-");
    let mut body = product_body(&sku, 20, 1);
    let start = now_ms() + 2_000;
    body["start_time"] = json!(start);
    body["end_time"] = json!(now_ms() + 60_000);
    body["waiting_room"] =
        json!({"ceiling_per_sec": 40, "admission_secs": 60, "join_early_secs": 600});
    app.sale_from(body).await;
    let base = app.url("");
    // 20 join before the start, 10 after it.
    let mut tickets = Vec::new();
    for user in 1..=20 {
        tickets.push((user, join(&app, &base, &sku, user).await));
    }
    let mut seen = Seen::default();
    // Too early: not started.
    seen.order(&app, &base, &sku, 800, None).await;
    tokio::time::sleep(until(start + 200)).await;
    // Bots order without an admission.
    for bot in 900..903 {
        seen.order(&app, &base, &sku, bot, None).await;
    }
    for user in 21..=30 {
        tickets.push((user, join(&app, &base, &sku, user).await));
    }
    crowd(&app, std::slice::from_ref(&base), &sku, &tickets, &mut seen).await;
    assert_eq!(seen.answers["accepted"], 20, "{:?}", seen.answers);
    app.drained(&sku, 20).await;

    // 15 pay; 5 do not and time out; one of those pays late.
    for (_, order) in &seen.orders[..15] {
        let (status, answer) = app
            .notify_of("payment.succeeded", order, &unique("pay-"), &amount(1))
            .await;
        assert_eq!(
            (status, answer["result"].as_str()),
            (StatusCode::OK, Some("paid"))
        );
    }
    let late = &seen.orders[15].1;
    eventually("the unpaid time out", Duration::from_secs(15), || async {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM tb_order WHERE product_id = ? AND status = 'cancelled'",
        )
        .bind(&sku)
        .fetch_one(&app.mysql)
        .await
        .unwrap();
        n == 5
    })
    .await;
    let (_, answer) = app
        .notify_of("payment.succeeded", late, "pay-late", &amount(1))
        .await;
    assert_eq!(answer["result"], "paid_again", "{answer}");

    // The timeline is written a second after each second (later on a
    // busy machine): waited for until every process's count is in.
    eventually("the timeline written", Duration::from_secs(20), || async {
        let s = report(&app, &sku).await["summary"].clone();
        s["accepted"] == 20
            && s["persisted"] == 20
            && s["payments"]["timed_out"] == 5
            && s["funnel"]["requests"] == seen.answers.values().sum::<u64>()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let r = report(&app, &sku).await;
    let s = &r["summary"];
    assert_eq!(r["kept"], false);
    assert_eq!(s["accepted"], 20, "{s}");
    assert_eq!(s["orders"], 20);
    assert_eq!(s["units_sold"], 16, "15 paid and 1 paid late");
    // The money, exact: 16 paid orders at 4999.00, and what was taken for
    // them, in the payments' currency.
    assert_eq!(s["money"]["currency"], "CNY", "{s}");
    assert_eq!(s["money"]["revenue"], "79984", "{s}");
    assert_eq!(s["money"]["received"], "79984", "{s}");
    assert_eq!(s["money"]["refund_due"], "0", "{s}");
    for (code, n) in &seen.answers {
        if code != "accepted" {
            assert_eq!(s["refused"][code], *n, "{code}: {s}");
        }
    }
    assert_eq!(s["refused"]["admission_required"], 3);
    assert_eq!(s["refused"]["sale_not_started"], 1);
    // Every fifth buyer orders twice: the second is over the limit, or
    // sold out when the first took the last unit (who buys is the draw's
    // and the crowd's timing).
    let twice = seen.orders.iter().filter(|(u, _)| u % 5 == 0).count() as u64;
    let last_took_it = seen.orders.last().is_some_and(|(u, _)| u % 5 == 0);
    let over = s["refused"]["limit_exceeded"].as_u64().unwrap();
    assert!(
        over == twice || (last_took_it && over == twice - 1),
        "{twice} bought twice: {s}"
    );
    let f = &s["funnel"];
    assert_eq!(f["joined"], 30, "{f}");
    assert_eq!(f["ordered"], 20);
    assert_eq!(f["paid"], 16);
    assert_tried(f, &seen);
    assert_eq!(
        f["requests"],
        seen.answers.values().sum::<u64>(),
        "every answer counted once"
    );
    let admitted = f["admitted"].as_u64().unwrap();
    assert!((20..=30).contains(&admitted), "{f}");
    let wait = &s["wait"];
    assert_eq!(wait["buyers"], admitted, "{wait}");
    assert!(wait["max_ms"].as_i64().unwrap() >= wait["p50_ms"].as_i64().unwrap());
    let p = &s["payments"];
    assert_eq!(
        (
            &p["paid"],
            &p["paid_late"],
            &p["timed_out"],
            &p["refund_due"]
        ),
        (&json!(15), &json!(1), &json!(5), &json!(0)),
        "{p}"
    );
    // Over time: each second's refusals by reason and payments by result
    // add up to the sale's.
    let over_time = |field: &str, key: &str| -> u64 {
        (r["seconds"].as_array().unwrap().iter())
            .map(|x| x[field][key].as_u64().unwrap_or(0))
            .sum()
    };
    for (code, n) in s["refused"].as_object().unwrap() {
        assert_eq!(over_time("refused_by", code), n.as_u64().unwrap(), "{code}");
    }
    assert_eq!(
        (
            over_time("payments_by", "paid"),
            over_time("payments_by", "paid_again")
        ),
        (15, 1),
        "{r}"
    );
    assert_eq!(s["persisted"], 20);
    assert_eq!(s["books_ok"], true);
    assert!(s["sold_out_after_ms"].as_i64().is_some(), "{s}");
    assert!(s["peak_accepted_per_sec"].as_u64().unwrap() >= 1);
    assert!(s["latency_p50_us"].as_u64().is_some());
    let seconds = r["seconds"].as_array().unwrap();
    let accepted: u64 = seconds
        .iter()
        .map(|x| x["accepted"].as_u64().unwrap())
        .sum();
    assert_eq!(accepted, 20);
    let joins: u64 = seconds.iter().map(|x| x["joins"].as_u64().unwrap()).sum();
    assert_eq!(joins, 30);

    // CSV: a row per second, the same counts.
    let csv = app
        .client
        .get(app.url(&format!("/api/admin/products/{sku}/report/csv")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), seconds.len());
    let from_csv: u64 = rows
        .iter()
        .map(|l| l.split(',').nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(from_csv, 20);

    // Retired: its keys gone, the report kept with the same figures.
    app.close_sale(&sku).await;
    let retirer = app.retiring_workers("retirer", Duration::ZERO);
    eventually("retired and purged", Duration::from_secs(20), || async {
        let pass = retirer.retirer().pass().await.expect("a pass");
        let _ = pass;
        app.stock(&sku).await.is_none()
    })
    .await;
    let kept = report(&app, &sku).await;
    assert_eq!(kept["kept"], true, "{kept}");
    for field in [
        "accepted",
        "units_sold",
        "funnel",
        "payments",
        "money",
        "refused",
        "books_ok",
    ] {
        assert_eq!(kept["summary"][field], s[field], "{field}");
    }
    // Its timeline's rows went with its keys: the kept report holds its
    // seconds, every one the live report had, unchanged, and those the
    // timelines wrote since, before it was kept (the close, its events; a
    // process may write a second or two after the purge).
    let kept_seconds = kept["seconds"].as_array().unwrap();
    assert!(kept_seconds.len() >= seconds.len(), "{kept}");
    for (live, kept) in seconds.iter().zip(kept_seconds) {
        assert_eq!(
            (&live["t"], &live["accepted"], &live["units"]),
            (&kept["t"], &kept["accepted"], &kept["units"]),
            "a second kept as it was"
        );
    }
    let purged_s = kept["made_ms"].as_i64().unwrap().div_euclid(1000) - 2;
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM tb_sale_second WHERE product_id = ? AND second < ?",
    )
    .bind(&sku)
    .bind(purged_s)
    .fetch_one(&app.mysql)
    .await
    .unwrap();
    assert_eq!(left, 0, "the timeline's rows of a purged sale");
    // `flashsale report`, as an operator runs it: the kept report.
    let cli = |extra: &'static [&'static str]| {
        let (app, sku) = (&app, sku.clone());
        async move {
            let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
                .arg("report")
                .arg(&sku)
                .args(extra)
                .env("REDIS_URL", crate::helpers::REDIS_URL)
                .env("REDIS_KEY_PREFIX", &app.prefix)
                .env("DATABASE_URL", &app.settings.db.url)
                .env("RUST_LOG", "error")
                .output()
                .await
                .expect("flashsale report runs");
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            String::from_utf8(run.stdout).unwrap()
        }
    };
    let text = cli(&[]).await;
    for says in [
        "kept at retirement",
        "16 of 20 units sold",
        "30 joined",
        "20 buyers ordered, 16 paid",
        "15 paid, 1 paid late",
        "5 timed out",
        "admission_required 3",
        "books: balanced",
    ] {
        assert!(text.contains(says), "says {says:?}: {text}");
    }
    let csv = cli(&["--csv"]).await;
    assert_eq!(csv.lines().count(), kept_seconds.len() + 1, "{csv}");
    let json: Value = serde_json::from_str(&cli(&["--json"]).await).unwrap();
    assert_eq!(json["summary"]["accepted"], 20);
}

/// Admitted buyers who walk away: their admissions run out unused, and the
/// report counts each in the second it ran out (the second its place was
/// admitted, plus the window), from the room's places and the
/// books: exactly the clients who walked away, about when they were told.
#[tokio::test]
async fn admissions_that_run_out_unused_are_counted_in_the_second_they_ran_out() {
    let app = spawn_sale_service(Duration::from_secs(30)).await;
    let sku = unique("rexp-");
    let mut body = product_body(&sku, 20, 1);
    body["start_time"] = json!(now_ms() - 1_000);
    body["end_time"] = json!(now_ms() + 60_000);
    body["waiting_room"] = json!({"ceiling_per_sec": 100, "admission_secs": 2});
    app.sale_from(body).await;
    let base = app.url("");
    let mut seen = Seen::default();
    // Eight buyers join; once admitted the even ones order, the odd ones
    // walk away (their admission's expiry noted).
    let mut walked = Vec::new();
    for user in 1..=8u64 {
        let ticket = join(&app, &base, &sku, user).await;
        let admitted = eventually_some("admitted", Duration::from_secs(10), || async {
            let s = standing(&app, &base, &sku, &ticket).await;
            (s["status"] == "admitted").then_some(s)
        })
        .await;
        if user % 2 == 0 {
            let a = admitted["admission"].as_str().unwrap();
            seen.order(&app, &base, &sku, user, Some(a)).await;
        } else {
            walked.push(admitted["expires_at"].as_i64().unwrap().div_euclid(1000));
        }
    }
    assert_eq!(seen.answers["accepted"], 4, "{:?}", seen.answers);
    eventually(
        "the admissions run out",
        Duration::from_secs(20),
        || async { report(&app, &sku).await["summary"]["funnel"]["expired"] == 4 },
    )
    .await;
    let r = report(&app, &sku).await;
    let f = &r["summary"]["funnel"];
    assert_eq!(
        (&f["admitted_unused"], &f["ordered"]),
        (&json!(4), &json!(4)),
        "{f}"
    );
    // The places admitted, second by second, under their name and, for
    // the release before, under their first (deprecated) one; the last
    // reading is what the funnel says was admitted.
    let seconds = r["seconds"].as_array().unwrap();
    assert!(seconds.iter().all(|s| s["admitted"] == s["line"]), "{r}");
    let last = seconds.iter().rev().find_map(|s| s["admitted"].as_i64());
    assert_eq!(last.map(|a| json!(a)).as_ref(), Some(&f["admitted"]), "{f}");
    let ran_out: Vec<(i64, u64)> = r["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["expired"].as_u64().unwrap() > 0)
        .map(|s| (s["t"].as_i64().unwrap(), s["expired"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ran_out.iter().map(|(_, n)| n).sum::<u64>(),
        4,
        "{ran_out:?}"
    );
    // Each in a second the clients were told, give or take the second of
    // the reading of the places admitted.
    let (first, last) = (walked[0], walked[walked.len() - 1]);
    for (t, _) in &ran_out {
        assert!(
            (first - 1..=last + 1).contains(t),
            "{t} not in {first}..={last}: {ran_out:?}"
        );
    }
    // The CSV has them too.
    let csv = app
        .client
        .get(app.url(&format!("/api/admin/products/{sku}/report/csv")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let column = csv
        .lines()
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "expired")
        .unwrap();
    let from_csv: u64 = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(column).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(from_csv, 4);
}

/// Issue 68: with the room read only now and then (nobody polling most
/// seconds), the admissions made between two readings run out in
/// the seconds the buyers were told, not bunched in the second after the
/// next reading (a reading was counted in every second it stayed fresh, as
/// if nothing had been admitted until the next one).
#[tokio::test]
async fn admissions_between_sparse_readings_run_out_when_their_buyers_were_told() {
    let app = spawn_sale_service(Duration::from_secs(30)).await;
    let sku = unique("rsparse-");
    let mut body = product_body(&sku, 20, 1);
    body["start_time"] = json!(now_ms() - 1_000);
    body["end_time"] = json!(now_ms() + 60_000);
    body["waiting_room"] = json!({"ceiling_per_sec": 1, "floor_per_sec": 1, "admission_secs": 2});
    app.sale_from(body).await;
    let base = app.url("");
    // Ten buyers join at once: the room admits one place a second.
    let mut tickets = Vec::new();
    for user in 1..=10u64 {
        tickets.push(join(&app, &base, &sku, user).await);
        eprintln!(
            "JOIN {} {}",
            tickets.last().unwrap(),
            standing(&app, &base, &sku, tickets.last().unwrap()).await
        );
    }
    // One look at the room every 4 s (each look renews the reading, 4 s
    // apart: fresh for 5), until every place was reached; nobody orders.
    let last = tickets.last().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while standing(&app, &base, &sku, last).await["status"] == "waiting" {
        assert!(std::time::Instant::now() < deadline, "the line stalled");
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    // What each buyer was told: when their admission ran out.
    let mut told = Vec::new();
    for ticket in &tickets {
        let s = eventually_some("ran out", Duration::from_secs(10), || async {
            let s = standing(&app, &base, &sku, ticket).await;
            s["expired_at"].as_i64()
        })
        .await;
        told.push(s.div_euclid(1000));
    }
    eventually(
        "the admissions run out",
        Duration::from_secs(20),
        || async { report(&app, &sku).await["summary"]["funnel"]["expired"] == 10 },
    )
    .await;
    let r = report(&app, &sku).await;
    let mut counted = Vec::new();
    for s in r["seconds"].as_array().unwrap() {
        for _ in 0..s["expired"].as_u64().unwrap() {
            counted.push(s["t"].as_i64().unwrap());
        }
    }
    told.sort_unstable();
    // Each within a second of what its buyer was told (the report dates
    // the places admitted by its readings, at a second's grain).
    assert_eq!(counted.len(), told.len(), "{counted:?} vs told {told:?}");
    for (c, t) in counted.iter().zip(&told) {
        assert!((c - t).abs() <= 1, "counted {counted:?}, told {told:?}");
    }
}

/// Two instances, each with its workers: orders and joins through both,
/// the report counts each once.
#[tokio::test]
async fn two_instances_and_two_workers_count_into_one_timeline() {
    let app = spawn_sale_service(Duration::from_secs(600)).await;
    let other = app
        .serve_beside(|s| s.workers = Some(fast_workers(&unique("w2-"))))
        .await;
    let sku = unique("rep-");
    let mut body = product_body(&sku, 30, 1);
    body["start_time"] = json!(now_ms() - 1_000);
    body["waiting_room"] = json!({"ceiling_per_sec": 100, "admission_secs": 60});
    app.sale_from(body).await;
    let bases = [app.url(""), other.base.clone()];
    let mut tickets = Vec::new();
    for user in 1..=40u64 {
        let base = &bases[user as usize % 2];
        tickets.push((user, join(&app, base, &sku, user).await));
    }
    let mut seen = Seen::default();
    crowd(&app, &bases, &sku, &tickets, &mut seen).await;
    assert_eq!(seen.answers["accepted"], 30);
    // Ten of them order again through the other instance (the crowd sent
    // buyer n through `bases[(n - 1) % 2]`): more requests, no new buyers.
    for user in 1..=10u64 {
        seen.order(&app, &bases[user as usize % 2], &sku, user, None)
            .await;
    }
    app.drained(&sku, 30).await;
    let requests = seen.answers.values().sum::<u64>();
    eventually(
        "both timelines written",
        Duration::from_secs(10),
        || async {
            let r = report(&app, &sku).await;
            r["summary"]["accepted"] == 30
                && r["summary"]["persisted"] == 30
                && r["summary"]["funnel"]["requests"] == requests
        },
    )
    .await;
    let (sources,): (i64,) =
        sqlx::query_as("SELECT COUNT(DISTINCT source) FROM tb_sale_second WHERE product_id = ?")
            .bind(&sku)
            .fetch_one(&app.mysql)
            .await
            .unwrap();
    assert_eq!(sources, 2, "each process its own rows");
    let r = report(&app, &sku).await;
    let s = &r["summary"];
    assert_eq!(s["funnel"]["joined"], 40);
    assert_eq!(s["funnel"]["requests"], seen.answers.values().sum::<u64>());
    assert_tried(&s["funnel"], &seen);
    assert_eq!(
        s["refused"]["limit_exceeded"],
        seen.answers["limit_exceeded"]
    );

    // Three buyers cancel (one twice, through each instance): three.
    for (i, (user, order)) in seen.orders[..3].iter().enumerate() {
        for base in &bases[..1 + usize::from(i == 0)] {
            let resp = app
                .client
                .post(format!("{base}/api/orders/{order}/cancel"))
                .json(&json!({"user_id": user}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
    }
    eventually("the cancels counted", Duration::from_secs(10), || async {
        report(&app, &sku).await["summary"]["payments"]["cancelled_by_buyers"] == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let r = report(&app, &sku).await;
    assert_eq!(
        r["summary"]["payments"]["cancelled_by_buyers"], 3,
        "not twice"
    );
    assert_eq!(r["summary"]["cancelled"], 3);
}

/// The report page in a browser, reached from the dashboard's link: the
/// figures as the JSON report has them, the timeline's charts drawn (SVG,
/// under the pages' CSP), the funnel; the README's picture.
#[tokio::test]
async fn in_a_browser_the_report_draws_the_sale() {
    let Some(browser) = crate::browser::Browser::start().await else {
        return;
    };
    let app = spawn_sale_service(Duration::from_secs(600)).await;
    let sku = unique("rep-");
    let mut body = product_body(&sku, 40, 1);
    body["title"] = json!("Phone <b>X</b>");
    body["start_time"] = json!(now_ms() - 1_000);
    body["waiting_room"] = json!({"ceiling_per_sec": 15, "admission_secs": 60});
    app.sale_from(body).await;
    let base = app.url("");
    let mut tickets = Vec::new();
    for user in 1..=60u64 {
        tickets.push((user, join(&app, &base, &sku, user).await));
    }
    let mut seen = Seen::default();
    crowd(&app, std::slice::from_ref(&base), &sku, &tickets, &mut seen).await;
    app.drained(&sku, 40).await;
    for (_, order) in &seen.orders[..25] {
        app.notify_of("payment.succeeded", order, &unique("pay-"), &amount(1))
            .await;
    }
    eventually("the timeline written", Duration::from_secs(20), || async {
        report(&app, &sku).await["summary"]["persisted"] == 40
    })
    .await;
    let r = report(&app, &sku).await;

    browser.goto(&app.url("/admin/dashboard")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in").await;
    let link = format!("section[data-product=\"{sku}\"] [data-field=\"report\"]");
    eventually(
        "the sale's report link",
        Duration::from_secs(10),
        || async { browser.text(&link).await.is_some() },
    )
    .await;
    browser.set_window_size(760, 2600).await;
    browser.click(&link).await;
    eventually("the report page", Duration::from_secs(10), || async {
        browser.text("#figures").await.is_some()
    })
    .await;
    let figures = browser.text("#figures").await.unwrap();
    let sold = r["summary"]["units_sold"].as_i64().unwrap();
    assert!(figures.contains(&format!("{sold} of 40")), "{figures}");
    assert!(figures.contains("balanced"), "{figures}");
    // The money: 25 paid at 4999.00, in the payments' currency.
    assert!(
        figures.contains("revenue CNY 124975; received CNY 124975; refunds owed CNY 0"),
        "{figures}"
    );
    // The title is text, not markup.
    let header = browser.text("header").await.unwrap();
    assert!(header.contains("Phone <b>X</b>"), "{header}");
    // Every chart has its series, drawn from the timeline (a latency's
    // series breaks at a second without orders: its segments are one series).
    let drawn = browser
        .eval(
            "return ['orders','units','latency','room','pace','persisted','persist-wait','refusals','payments'] \
             .map(id => new Set([...document.querySelectorAll('#chart-' + id + ' [data-series]')] \
             .map(e => e.dataset.series)).size);",
        )
        .await;
    // A series per reason refused (five at most, and "other").
    let reasons = r["summary"]["refused"].as_object().unwrap().len();
    let refusals = reasons.min(5) + usize::from(reasons > 5);
    assert_eq!(drawn, json!([2, 3, 2, 3, 2, 1, 1, refusals, 5]), "{drawn}");
    // The start is marked, the clock under the seconds.
    let marked = browser
        .eval("return [...document.querySelectorAll('#chart-orders .mark')].map(m => m.dataset.mark);")
        .await;
    assert!(
        marked.as_array().unwrap().contains(&json!("start")),
        "{marked}"
    );
    let clock = browser.text("#chart-orders .clock").await.unwrap();
    assert!(clock.len() == 8 && clock.as_bytes()[2] == b':', "{clock}");
    let points = browser
        .eval(
            "return document.querySelector('#chart-orders polyline[data-series=\"accepted\"]') \
             .getAttribute('points').trim().split(' ').length;",
        )
        .await;
    // A point a second, and a 0 on each side of a run of seconds with
    // nothing counted (the page was made a moment after the report read
    // above: as many seconds, or a few more).
    let drawn_of = |report: &Value| -> usize {
        let t: Vec<i64> = report["seconds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["t"].as_i64().unwrap())
            .collect();
        let zeros: usize = t
            .windows(2)
            .map(|w| (w[1] - w[0] - 1).clamp(0, 2) as usize)
            .sum();
        t.len() + zeros
    };
    let later = report(&app, &sku).await;
    let points = points.as_u64().unwrap() as usize;
    assert!(
        (drawn_of(&r)..=drawn_of(&later)).contains(&points),
        "{points} points"
    );
    let steps = browser
        .eval("return [...document.querySelectorAll('#funnel rect')].map(r => r.dataset.step);")
        .await;
    assert_eq!(
        steps,
        json!(["joined the room", "admitted", "ordered", "paid"])
    );
    let shot = browser.screenshot().await;
    std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/target/tmp")).unwrap();
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/tmp/report.png"),
        shot,
    )
    .unwrap();
    browser.quit().await;
}

/// The points of a series on a report page (`x,y` in the SVG's
/// coordinates: a higher value is a smaller `y`).
fn drawn_series(page: &str, chart: &str, series: &str) -> Vec<(f64, f64)> {
    let chart = &page[page.find(&format!("id=\"chart-{chart}\"")).expect(chart)..];
    let drawn = &chart[chart
        .find(&format!("data-series=\"{series}\""))
        .expect(series)..];
    let drawn = &drawn[..drawn.find('>').expect("the element's end")];
    let attr = |name: &str| -> Option<&str> {
        let v = &drawn[drawn.find(&format!(" {name}=\""))? + name.len() + 3..];
        Some(&v[..v.find('"')?])
    };
    if let (Some(x), Some(y)) = (attr("cx"), attr("cy")) {
        return vec![(x.parse().expect("x"), y.parse().expect("y"))];
    }
    attr("points")
        .expect("points")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        })
        .collect()
}

/// Units given back by a buyer's cancel and sold again, and a restock:
/// the timeline has both from the books (`returned`, `restocked`, in the
/// JSON and the CSV), and the page's units chart draws the units orders
/// hold never above those on sale (accepted in all, 10 units for 8 on
/// sale, read as an oversell), with the restock and a pause marked.
#[tokio::test]
async fn units_given_back_and_restocked_are_drawn_so_that_none_reads_as_an_oversell() {
    let app = spawn_sale_service(Duration::from_secs(600)).await;
    let sku = app.new_sale(5, 1).await;
    let mut ids = Vec::new();
    for user in 1..=5u64 {
        let resp = app.place_order(user, &sku, 1).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let body: Value = resp.json().await.unwrap();
        ids.push(body["order_id"].as_str().unwrap().to_owned());
    }
    app.drained(&sku, 5).await;
    // A second apart, so each step is a second of its own.
    let next_second = || tokio::time::sleep(Duration::from_millis(1100));
    next_second().await;
    for (user, id) in [(1u64, &ids[0]), (2, &ids[1])] {
        assert_eq!(app.cancel(id, user).await.status(), StatusCode::OK);
    }
    next_second().await;
    // Paused a moment, then resumed: marked on the charts.
    for step in ["pause", "resume"] {
        let resp = app
            .client
            .post(app.url(&format!("/api/admin/products/{sku}/{step}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{step}");
    }
    app.accept_orders(&sku, 6..=7).await;
    next_second().await;
    let restocked = app
        .client
        .post(app.url(&format!("/api/admin/products/{sku}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"units": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(restocked.status(), StatusCode::OK);
    next_second().await;
    app.accept_orders(&sku, 8..=10).await;
    app.drained(&sku, 10).await;
    let sum = |r: &Value, field: &str| -> i64 {
        r["seconds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[field].as_i64().unwrap_or(0))
            .sum()
    };
    let r = eventually_some(
        "the accepted units counted",
        Duration::from_secs(20),
        || async {
            let r = report(&app, &sku).await;
            (sum(&r, "units") == 10).then_some(r)
        },
    )
    .await;
    assert_eq!(sum(&r, "returned"), 2, "{r}");
    assert_eq!(sum(&r, "restocked"), 3, "{r}");
    let csv = app
        .client
        .get(app.url(&format!("/api/admin/products/{sku}/report/csv")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|c| *c == name).expect(name);
    let (returned, restocks) = (column("returned"), column("restocked"));
    let total = |i: usize| -> i64 {
        csv.lines()
            .skip(1)
            .map(|l| l.split(',').nth(i).unwrap().parse::<i64>().unwrap())
            .sum()
    };
    assert_eq!((total(returned), total(restocks)), (2, 3), "{csv}");
    // As docs/report.md says: a second without any leaves them out of the
    // JSON (read as 0), and the CSV writes its 0.
    let seconds = r["seconds"].as_array().unwrap();
    let quiet = seconds
        .iter()
        .filter(|s| s.get("returned").is_none() && s.get("restocked").is_none())
        .count();
    assert!(quiet > 0 && quiet < seconds.len(), "{r}");
    assert!(
        seconds
            .iter()
            .all(|s| s.get("returned") != Some(&serde_json::json!(0))
                && s.get("restocked") != Some(&serde_json::json!(0))),
        "a 0 written in the JSON: {r}"
    );
    assert!(
        csv.lines()
            .skip(1)
            .all(|l| !l.split(',').nth(returned).unwrap().is_empty()),
        "the CSV writes every second's figure: {csv}"
    );

    let cookie = crate::dashboard::session_cookie(&app).await;
    let page = app
        .client
        .get(app.url(&format!("/admin/dashboard/report/{sku}")))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let on_sale = drawn_series(&page, "units", "on sale");
    let held = drawn_series(&page, "units", "held by orders");
    assert_eq!(on_sale.len(), held.len(), "a point a second each");
    for (h, s) in held.iter().zip(&on_sale) {
        assert_eq!(h.0, s.0, "the same seconds");
        assert!(h.1 >= s.1 - 0.05, "held above on sale at x {}: {page}", h.0);
    }
    // At the end: 8 held of 8 on sale (the same height), 2 given back.
    let (last_held, last_on_sale) = (held.last().unwrap().1, on_sale.last().unwrap().1);
    assert!((last_held - last_on_sale).abs() < 0.05, "{page}");
    for mark in ["restock +3", "paused", "resumed"] {
        assert!(
            page.contains(&format!("data-mark=\"{mark}\"")),
            "{mark}: {page}"
        );
    }
    let pauses = r["pauses"].as_array().map(Vec::len);
    assert_eq!(pauses, Some(2), "{r}");
}

/// Closes `sku` and retires it (its report kept), as the workers do.
async fn retire(app: &TestApp, sku: &str) {
    app.close_sale(sku).await;
    let retirer = app.retiring_workers(&unique("retirer-"), Duration::ZERO);
    let mut passes = Polling::at_most("retired", Duration::from_secs(30));
    while app.stock(sku).await.is_some() {
        passes.next().await;
        retirer.retirer().pass().await.expect("a pass");
    }
}

/// The past sales: two retired sales listed newest first, each linked to
/// its report; side by side; their summaries as CSV with the books'
/// units and money; none of it without a session.
#[tokio::test]
async fn retired_sales_are_listed_compared_and_summed_up_as_csv() {
    // Unpaid orders time out after 5 s: then the sales can retire.
    let app = spawn_sale_service(Duration::from_secs(5)).await;
    let (a, b) = (app.new_sale(5, 1).await, app.new_sale(8, 1).await);
    let mut paid = Vec::new();
    for user in 1..=5u64 {
        let resp = app.place_order(user, &a, 1).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let body: Value = resp.json().await.unwrap();
        paid.push(body["order_id"].as_str().unwrap().to_owned());
    }
    app.accept_orders(&b, 1..=3).await;
    app.drained(&a, 5).await;
    app.drained(&b, 3).await;
    for order in &paid[..2] {
        let (status, _) = app
            .notify_of("payment.succeeded", order, &unique("pay-"), &amount(1))
            .await;
        assert!(status.is_success(), "{status}");
    }
    // A second payment for a paid order: owed back, listed to act on.
    let twice = unique("pay-twice-");
    let (status, owed) = app
        .notify_of("payment.succeeded", &paid[0], &twice, &amount(1))
        .await;
    assert_eq!(owed["result"], "refund_due", "{status} {owed}");
    retire(&app, &a).await;
    retire(&app, &b).await;
    let kept = report(&app, &a).await;
    assert_eq!(kept["kept"], true);
    let listed = &kept["refunds_due"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(
        (
            &listed[0]["payment_id"],
            &listed[0]["order_id"],
            &listed[0]["user_id"]
        ),
        (&json!(twice), &json!(paid[0]), &json!(1)),
        "{listed}"
    );

    let get = |path: String, cookie: Option<String>| {
        let mut req = app.client.get(app.url(&path));
        if let Some(cookie) = cookie {
            req = req.header(reqwest::header::COOKIE, cookie);
        }
        async move { req.send().await.unwrap() }
    };
    for path in [
        "/admin/dashboard/reports".to_owned(),
        format!("/admin/dashboard/reports/compare?sale={a}&sale={b}"),
        "/admin/dashboard/reports.csv".to_owned(),
    ] {
        assert_eq!(get(path, None).await.status(), StatusCode::UNAUTHORIZED);
    }
    let cookie = crate::dashboard::session_cookie(&app).await;
    let index = get("/admin/dashboard/reports".into(), Some(cookie.clone()))
        .await
        .text()
        .await
        .unwrap();
    let row = |sku: &str| {
        index
            .find(&format!("<tr data-product=\"{sku}\""))
            .expect(sku)
    };
    assert!(row(&b) < row(&a), "newest first: {index}");
    assert!(
        index.contains(&format!("href=\"/admin/dashboard/report/{a}\"")),
        "{index}"
    );
    let compared = get(
        format!("/admin/dashboard/reports/compare?sale={a}&sale={b}"),
        Some(cookie.clone()),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(
        compared.contains("2 of 5") && compared.contains("0 of 8"),
        "{compared}"
    );
    let unknown = get(
        "/admin/dashboard/reports/compare?sale=no-such-sale".into(),
        Some(cookie.clone()),
    )
    .await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);

    let csv = get("/admin/dashboard/reports.csv".into(), Some(cookie))
        .await
        .text()
        .await
        .unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<BTreeMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let of = |sku: &str| rows.iter().find(|r| r["product_id"] == sku).expect(sku);
    let price: rust_decimal::Decimal = amount(1).parse().unwrap();
    for (sku, sold, on_sale, revenue) in [
        (&a, "2", "5", price * rust_decimal::Decimal::from(2)),
        (&b, "0", "8", rust_decimal::Decimal::ZERO),
    ] {
        let r = of(sku);
        assert_eq!((r["units_sold"], r["on_sale"]), (sold, on_sale), "{csv}");
        assert_eq!((r["kept"], r["books_ok"]), ("true", "true"), "{csv}");
        let said: rust_decimal::Decimal = r["revenue"].parse().unwrap();
        assert_eq!(said, revenue, "{csv}");
    }
    let owed: rust_decimal::Decimal = of(&a)["refunds_owed"].parse().unwrap();
    assert_eq!((of(&a)["refund_due"], owed), ("1", price), "{csv}");
    // The kept report's page lists the refund to make.
    let cookie = crate::dashboard::session_cookie(&app).await;
    let page = get(format!("/admin/dashboard/report/{a}"), Some(cookie))
        .await
        .text()
        .await
        .unwrap();
    let refunds = &page[page.find("id=\"refunds\"").expect("the refunds' table")..];
    assert!(refunds.contains(&twice), "{page}");
}

/// In Chromium: from the dashboard to the past sales, two ticked and
/// compared side by side, one's report opened from the list.
#[tokio::test]
async fn in_a_browser_the_operator_finds_past_sales_and_compares_two() {
    let Some(browser) = crate::browser::Browser::start().await else {
        return;
    };
    let app = spawn_sale_service(Duration::from_secs(600)).await;
    let (a, b) = (app.new_sale(5, 1).await, app.new_sale(8, 1).await);
    retire(&app, &a).await;
    retire(&app, &b).await;
    browser.goto(&app.url("/admin/dashboard")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in").await;
    eventually("signed in", Duration::from_secs(10), || async {
        browser.text("#past-sales").await.is_some()
    })
    .await;
    browser.click("#past-sales").await;
    eventually("the past sales", Duration::from_secs(10), || async {
        browser.text("#reports").await.is_some()
    })
    .await;
    let listed = browser
        .eval("return [...document.querySelectorAll('#reports tr[data-product]')].map(r => r.dataset.product);")
        .await;
    assert_eq!(listed, json!([b.clone(), a.clone()]), "newest first");
    browser
        .click(&format!(
            "#reports tr[data-product=\"{a}\"] input[name=sale]"
        ))
        .await;
    browser
        .click(&format!(
            "#reports tr[data-product=\"{b}\"] input[name=sale]"
        ))
        .await;
    browser.click("#compare").await;
    eventually("side by side", Duration::from_secs(10), || async {
        browser.text("#side-by-side").await.is_some()
    })
    .await;
    let compared = browser
        .eval("return [...document.querySelectorAll('#side-by-side th[data-product]')].map(t => t.dataset.product);")
        .await;
    assert_eq!(
        compared,
        json!([b.clone(), a.clone()]),
        "in the list's order"
    );
    browser
        .click(&format!("#side-by-side th[data-product=\"{a}\"] a"))
        .await;
    eventually("its report", Duration::from_secs(10), || async {
        browser.text("#figures").await.is_some()
    })
    .await;
    let header = browser.text("header").await.unwrap();
    assert!(header.contains("kept at its retirement"), "{header}");
    browser.quit().await;
}
