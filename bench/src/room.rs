//! `flashsale-bench room`: a sale rehearsed with its waiting room on, over
//! HTTP against an in-process `serve` (with its workers):
//!
//! - buyers join during the seconds before the start (some join again and
//!   again), a few more after it; each polls where it stands (most every
//!   second, some every 50 ms) until admitted, then orders with its
//!   admission; bots order without one, or with a forged or another
//!   buyer's;
//! - the checks: early joiners' places are uncorrelated with when they
//!   joined (Spearman's rank correlation), late joiners follow in arrival
//!   order, joining again always gave the same ticket, nobody ordered
//!   without a valid admission (every bot refused; every order in MySQL is
//!   an admitted buyer's), the line kept its pace (within ±10%), and the
//!   sale's books balance;
//! - side by side, what a poll costs against the sold-out path (answered
//!   from memory): requests per second, the service's CPU per request and
//!   Redis commands per request, alternating the two.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::cpu::ThreadGroup;
use super::load::Conn;
use flashsale::config::{
    AuthSettings, DbArgs, HttpSettings, Limits, MemorySettings, RedisArgs, RedisSettings, Settings,
};
use flashsale::sale::{Redis, Sales};
use flashsale::store::Db;

#[derive(Debug, Clone, Args)]
pub struct BenchRoomArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Buyers who join before the start.
    #[arg(long, default_value_t = 2000)]
    pub early: u64,
    /// Buyers who join after the start.
    #[arg(long, default_value_t = 200)]
    pub late: u64,
    /// The room's ceiling: places admitted per second (`--rate`, its
    /// earlier name, is still taken).
    #[arg(long, alias = "rate", default_value_t = 200)]
    pub ceiling: u32,
    /// Seconds during which the early buyers join, before the start.
    #[arg(long, default_value_t = 3)]
    pub join_secs: u64,
    /// Share of buyers who join five times.
    #[arg(long, default_value_t = 0.2)]
    pub rejoin_share: f64,
    /// Share of buyers who poll every 50 ms (the others: every second).
    #[arg(long, default_value_t = 0.1)]
    pub eager_share: f64,
    /// Bots, each sending 10 orders without a valid admission.
    #[arg(long, default_value_t = 20)]
    pub bots: u64,
    /// Seconds of each of the four runs of the poll-vs-sold-out comparison
    /// (0: skip it).
    #[arg(long, default_value_t = 4)]
    pub cost_secs: u64,
    /// Connections of the comparison.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Tickets of the paced crowd (0: skip it): they join a room whose line
    /// barely moves and poll when each answer's `poll_after_ms` says.
    #[arg(long, default_value_t = 0)]
    pub crowd: u64,
    /// Seconds the paced crowd polls.
    #[arg(long, default_value_t = 30)]
    pub crowd_secs: u64,
    /// The paced crowd's pace: places admitted per second
    /// (`--crowd-rate`, its earlier name, is still taken).
    #[arg(long, alias = "crowd-rate", default_value_t = 200)]
    pub crowd_pace: u32,
    /// Share of the crowd that ignores `poll_after_ms` and polls every
    /// 200 ms (answered the same, from memory).
    #[arg(long, default_value_t = 0.02)]
    pub eager_crowd_share: f64,
    /// Measure the join's proof of work: its check per join, and solving
    /// it natively at 12, 16 and 20 bits.
    #[arg(long)]
    pub pow: bool,
}

/// One keep-alive connection per request in flight, reused.
struct Pool {
    authority: String,
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let conn = self.idle.lock().map_err(|_| anyhow::anyhow!("pool"))?.pop();
        let mut conn = match conn {
            Some(c) => c,
            None => Conn::open(&self.authority).await?,
        };
        let (status, bytes) = conn.send(method, path, headers, body).await?;
        self.idle
            .lock()
            .map_err(|_| anyhow::anyhow!("pool"))?
            .push(conn);
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Creates the product `body` through the admin API and opens its sale.
    async fn open_sale(&self, admin: &[(&str, &str)], body: &Value) -> anyhow::Result<()> {
        let create = Some(body.to_string());
        let (status, answer) = self
            .send(Method::POST, "/api/admin/products", admin, create)
            .await?;
        anyhow::ensure!(status == StatusCode::CREATED, "creating: {status} {answer}");
        let product = body["product_id"].as_str().unwrap_or_default();
        let path = format!("/api/admin/products/{product}/open");
        let (status, answer) = self.send(Method::POST, &path, admin, None).await?;
        anyhow::ensure!(status == StatusCode::OK, "opening: {status} {answer}");
        Ok(())
    }
}

/// What one buyer saw.
#[derive(Debug, Default, Clone)]
struct Buyer {
    user_id: u64,
    early: bool,
    /// When its (first) join was answered, since the run began.
    joined_ms: f64,
    ticket: String,
    /// Joins that answered another ticket than the first.
    other_tickets: u64,
    place: Option<u64>,
    /// When it first saw itself admitted, since the start of the sale.
    admitted_ms: Option<f64>,
    order: Option<StatusCode>,
    last_status: String,
    polls: u64,
}

/// A small deterministic generator (SplitMix64), so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Spearman's rank correlation of `(x, y)` pairs (no ties expected).
pub fn rank_correlation(pairs: &[(f64, f64)]) -> f64 {
    let ranks = |values: Vec<f64>| {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|a, b| values[*a].total_cmp(&values[*b]));
        let mut r = vec![0.0; values.len()];
        for (rank, i) in order.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let n = pairs.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let rx = ranks(pairs.iter().map(|p| p.0).collect());
    let ry = ranks(pairs.iter().map(|p| p.1).collect());
    let d2: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - b).powi(2)).sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

/// The least-squares slope of `y` over `x`.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let cov: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    cov / var
}

pub async fn run_room_bench(args: BenchRoomArgs) -> anyhow::Result<()> {
    let prefix = super::bench_prefix(&args.redis.key_prefix);
    let redis_settings = RedisSettings {
        key_prefix: prefix.clone(),
        ..(&args.redis).into()
    };
    let token = uuid::Uuid::now_v7().simple().to_string();
    let api = ThreadGroup::default();
    let (authority, _stop) = serve(&args, &redis_settings, &token, api.clone()).await?;
    let redis = Redis::from_settings(&redis_settings)?;
    let pool = Arc::new(Pool {
        authority,
        idle: Mutex::new(Vec::new()),
    });
    let admin = format!("Bearer {token}");

    // The sale: stock for every buyer, so the line never stops for a sell-out.
    let product = super::bench_product("room");
    let buyers = args.early + args.late;
    let lead_ms = (args.join_secs * 1000 + 500) as i64;
    let start_ms = flashsale::domain::now_ms() + lead_ms;
    let body = json!({
        "product_id": product.as_str(), "title": "flashsale-bench room", "price": "1.00",
        "available_qty": buyers, "start_time": start_ms, "end_time": start_ms + 3_600_000,
        "limit_per_user": 1,
        "waiting_room": {"ceiling_per_sec": args.ceiling, "admission_secs": 120, "join_early_secs": 3600},
    });
    let headers = [("authorization", admin.as_str())];
    pool.open_sale(&headers, &body).await?;
    let began = Instant::now();
    let start_at = began + Duration::from_millis(lead_ms as u64);
    println!(
        "room rehearsal: {} early + {} late buyers, {} admitted/s, stock {buyers}, start in {:.1} s",
        args.early,
        args.late,
        args.ceiling,
        lead_ms as f64 / 1000.0
    );

    // Every buyer's plan, drawn up front from the seed.
    let mut rng = Rng(args.seed);
    let mut tasks = Vec::new();
    let shared_admission: Arc<Mutex<Option<String>>> = Arc::default();
    for i in 0..buyers {
        let early = i < args.early;
        let join_at = if early {
            Duration::from_secs_f64(rng.unit() * args.join_secs as f64)
        } else {
            Duration::from_millis(lead_ms as u64 + 200) + Duration::from_secs_f64(rng.unit() * 2.0)
        };
        let rejoins = if rng.unit() < args.rejoin_share { 4 } else { 0 };
        let every = if rng.unit() < args.eager_share {
            Duration::from_millis(50)
        } else {
            Duration::from_secs(1)
        };
        let (pool, product, shared) = (pool.clone(), product.to_string(), shared_admission.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((began + join_at).into()).await;
            buyer(
                &pool,
                &product,
                1 + i,
                early,
                rejoins,
                every,
                began,
                start_at,
                shared,
            )
            .await
        }));
    }
    let mut bots = Vec::new();
    for b in 0..args.bots {
        let (pool, product, shared) = (pool.clone(), product.to_string(), shared_admission.clone());
        let user = 1_000_000 + b;
        bots.push(tokio::spawn(async move {
            bot(&pool, &product, user, start_at, shared).await
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await??);
    }
    let mut bot_answers: HashMap<StatusCode, u64> = HashMap::new();
    for b in bots {
        for status in b.await?? {
            *bot_answers.entry(status).or_default() += 1;
        }
    }

    // The checks.
    let early: Vec<&Buyer> = seen.iter().filter(|b| b.early).collect();
    let late: Vec<&Buyer> = seen.iter().filter(|b| !b.early).collect();
    let early_pairs: Vec<(f64, f64)> = early
        .iter()
        .filter_map(|b| Some((b.joined_ms, b.place? as f64)))
        .collect();
    let late_pairs: Vec<(f64, f64)> = late
        .iter()
        .filter_map(|b| Some((b.joined_ms, b.place? as f64)))
        .collect();
    let rho_early = rank_correlation(&early_pairs);
    let rho_late = rank_correlation(&late_pairs);
    let other_tickets: u64 = seen.iter().map(|b| b.other_tickets).sum();
    let admitted: HashSet<u64> = seen
        .iter()
        .filter(|b| b.admitted_ms.is_some())
        .map(|b| b.user_id)
        .collect();
    let accepted = seen
        .iter()
        .filter(|b| b.order == Some(StatusCode::ACCEPTED))
        .count();
    // The pace: places over the time they were first seen admitted, over
    // the middle 80% of the line (the ends are ramps: the first reading
    // after the start, the last buyers arriving).
    let mut points: Vec<(f64, f64)> = seen
        .iter()
        .filter_map(|b| Some((b.admitted_ms?, b.place? as f64)))
        .collect();
    points.sort_by(|a, b| a.1.total_cmp(&b.1));
    let cut = points.len() / 10;
    let middle = &points[cut..points.len() - cut];
    let pace = slope(middle) * 1000.0;
    let pace_off = (pace / f64::from(args.ceiling) - 1.0) * 100.0;

    // Every order in the books is an admitted buyer's.
    let db = Db::from_settings(&(&args.db).into())?;
    db.create_and_migrate().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let rows = loop {
        let rows = db.orders().orders_of_product(&product).await?;
        if rows.len() >= accepted || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let strangers = rows
        .iter()
        .filter(|r| !admitted.contains(&(r.user_id as u64)))
        .count();
    let bot_accepted = bot_answers
        .iter()
        .filter(|(s, _)| !s.is_client_error())
        .map(|(_, n)| n)
        .sum::<u64>();
    let path = format!("/api/admin/products/{product}/audit");
    let (_, audit) = pool.send(Method::GET, &path, &headers, None).await?;

    let polls: u64 = seen.iter().map(|b| b.polls).sum();
    println!(
        "{} buyers joined and polled {polls} times ({:.1} per buyer); {} admitted",
        seen.len(),
        polls as f64 / seen.len().max(1) as f64,
        admitted.len()
    );
    let check = |ok: bool| if ok { "ok" } else { "FAILED" };
    println!(
        "  early joiners: join time vs place, rank correlation {rho_early:+.3} (|rho| < 0.1: {})",
        check(rho_early.abs() < 0.1)
    );
    println!(
        "  late joiners: join time vs place, rank correlation {rho_late:+.3} (arrival order, > 0.9: {})",
        check(rho_late > 0.9)
    );
    println!("  same ticket on every join: {}", check(other_tickets == 0));
    println!(
        "  bots: {} orders without a valid admission, answers {:?}; accepted {} ({})",
        bot_answers.values().sum::<u64>(),
        bot_answers,
        bot_accepted,
        check(bot_accepted == 0)
    );
    println!(
        "  orders: {accepted} accepted, {} in MySQL, {strangers} by buyers never admitted ({})",
        rows.len(),
        check(strangers == 0 && rows.len() == accepted)
    );
    println!(
        "  pace: {pace:.1} admitted/s over the middle of the line, {pace_off:+.1}% of {} ({})",
        args.ceiling,
        check(pace_off.abs() <= 10.0)
    );
    println!(
        "  books: ok = {} ({})",
        audit["ok"],
        check(audit["ok"] == true)
    );

    let mut products = vec![product.clone()];
    if args.cost_secs > 0 {
        products.extend(compare_costs(&args, &pool, &headers, &api, &redis).await?);
    }
    if args.crowd > 0 {
        products.push(paced_crowd(&args, &pool, &headers, &api, &redis).await?);
    }
    if args.pow {
        join_cost();
    }
    let sales = Sales::from_settings(&redis_settings, MemorySettings::default())?;
    for product in &products {
        for sql in [
            "DELETE FROM tb_order WHERE product_id = ?",
            "DELETE FROM tb_product WHERE product_id = ?",
        ] {
            sqlx::query(sql)
                .bind(product.as_str())
                .execute(flashsale::bench_support::pool(&db))
                .await?;
        }
        super::remove_sale_keys(&sales, product).await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn buyer(
    pool: &Pool,
    product: &str,
    user_id: u64,
    early: bool,
    rejoins: u32,
    every: Duration,
    began: Instant,
    start_at: Instant,
    shared: Arc<Mutex<Option<String>>>,
) -> anyhow::Result<Buyer> {
    let join = format!("/api/sales/{product}/queue");
    let body = json!({"user_id": user_id}).to_string();
    let (status, answer) = pool
        .send(Method::POST, &join, &[], Some(body.clone()))
        .await?;
    anyhow::ensure!(status == StatusCode::OK, "join: {status} {answer}");
    let mut b = Buyer {
        user_id,
        early,
        joined_ms: began.elapsed().as_secs_f64() * 1000.0,
        ticket: answer["ticket"].as_str().unwrap_or_default().to_owned(),
        ..Buyer::default()
    };
    for _ in 0..rejoins {
        let (_, again) = pool
            .send(Method::POST, &join, &[], Some(body.clone()))
            .await?;
        if again["ticket"].as_str() != Some(b.ticket.as_str()) {
            b.other_tickets += 1;
        }
    }
    let standing = format!("/api/sales/{product}/queue/{}", b.ticket);
    let give_up = start_at + Duration::from_secs(120);
    loop {
        let (_, s) = pool.send(Method::GET, &standing, &[], None).await?;
        b.polls += 1;
        b.last_status = s["status"].as_str().unwrap_or_default().to_owned();
        if let Some(place) = s["place"].as_u64() {
            b.place = Some(place);
        }
        match b.last_status.as_str() {
            "admitted" => {
                b.admitted_ms = Some(start_at.elapsed().as_secs_f64() * 1000.0);
                let admission = s["admission"].as_str().unwrap_or_default().to_owned();
                if let Ok(mut kept) = shared.lock() {
                    kept.get_or_insert_with(|| admission.clone());
                }
                let order = json!({"user_id": user_id, "product_id": product, "quantity": 1});
                let (status, _) = pool
                    .send(
                        Method::POST,
                        "/api/orders",
                        &[("admission-token", admission.as_str())],
                        Some(order.to_string()),
                    )
                    .await?;
                b.order = Some(status);
                return Ok(b);
            }
            "waiting" => {}
            _ => return Ok(b),
        }
        if Instant::now() > give_up {
            return Ok(b);
        }
        tokio::time::sleep(every).await;
    }
}

/// Ten orders spread over the sale's first seconds: without an admission,
/// with a forged one, with another buyer's.
async fn bot(
    pool: &Pool,
    product: &str,
    user_id: u64,
    start_at: Instant,
    shared: Arc<Mutex<Option<String>>>,
) -> anyhow::Result<Vec<StatusCode>> {
    tokio::time::sleep_until(start_at.into()).await;
    let order = json!({"user_id": user_id, "product_id": product, "quantity": 1}).to_string();
    let forged = format!("{user_id}.{}.{}", i64::MAX, "0".repeat(32));
    let mut answers = Vec::new();
    for i in 0..10 {
        let stolen = shared.lock().ok().and_then(|s| s.clone());
        let token = match i % 3 {
            0 => None,
            1 => Some(forged.clone()),
            _ => stolen,
        };
        let headers: Vec<(&str, &str)> = token
            .as_deref()
            .map(|t| vec![("admission-token", t)])
            .unwrap_or_default();
        let (status, _) = pool
            .send(Method::POST, "/api/orders", &headers, Some(order.clone()))
            .await?;
        answers.push(status);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(answers)
}

/// Polls against the sold-out path, side by side: A B A B, each
/// `cost_secs` with `concurrency` connections. The sales it made.
async fn compare_costs(
    args: &BenchRoomArgs,
    pool: &Pool,
    admin: &[(&str, &str)],
    api: &ThreadGroup,
    redis: &Redis,
) -> anyhow::Result<Vec<flashsale::domain::ProductId>> {
    // A sold-out sale: one unit, bought.
    let sold = super::bench_product("soldout");
    let now = flashsale::domain::now_ms();
    let body = json!({
        "product_id": sold.as_str(), "title": "sold out", "price": "1.00", "available_qty": 1,
        "start_time": now - 1000, "end_time": now + 3_600_000, "limit_per_user": 1,
    });
    pool.open_sale(admin, &body).await?;
    let order = |user: u64| json!({"user_id": user, "product_id": sold.as_str(), "quantity": 1});
    pool.send(Method::POST, "/api/orders", &[], Some(order(1).to_string()))
        .await?;
    // The polls: of 2,000 buyers who joined a room before its start and
    // wait in its line (1 admitted a second): each poll checks a ticket,
    // draws its place, answers `waiting`.
    let line = super::bench_product("line");
    let start_ms = flashsale::domain::now_ms() + 2_000;
    let body = json!({
        "product_id": line.as_str(), "title": "the line", "price": "1.00",
        "available_qty": 1_000_000, "start_time": start_ms, "end_time": start_ms + 3_600_000,
        "limit_per_user": 1,
        "waiting_room": {"ceiling_per_sec": 1, "admission_secs": 120, "join_early_secs": 3600},
    });
    pool.open_sale(admin, &body).await?;
    let tickets = join_line(&pool.authority, &line, 2000, args.concurrency).await?;
    let tickets = Arc::new(tickets);
    let drawn =
        Duration::from_millis((start_ms - flashsale::domain::now_ms()).max(0) as u64 + 1_500);
    tokio::time::sleep(drawn).await;
    // The first poll after the start has the instance read the room again.
    let mut sample = Value::Null;
    for _ in 0..40 {
        sample = pool.send(Method::GET, &tickets[0], &[], None).await?.1;
        if sample["place"].is_u64() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(
        sample["status"] == "waiting" && sample["place"].is_u64(),
        "not in the line: {sample}"
    );
    println!(
        "poll vs sold-out order, {} connections, {} s each, alternating:",
        args.concurrency, args.cost_secs
    );
    println!(
        "  {:<10} {:>10} {:>14} {:>16}",
        "path", "req/s", "CPU us/req", "Redis cmds/req"
    );
    let mut totals: HashMap<&str, (f64, f64)> = HashMap::new();
    for round in 0..2 {
        for kind in ["sold_out", "poll"] {
            let (cmds0, cpu0) = (redis_commands(redis).await?, api.cpu());
            let started = Instant::now();
            let until = started + Duration::from_secs(args.cost_secs);
            let mut callers = Vec::new();
            for c in 0..args.concurrency {
                let (authority, tickets) = (pool.authority.clone(), tickets.clone());
                let body = order(10 + c as u64).to_string();
                callers.push(tokio::spawn(async move {
                    let mut conn = Conn::open(&authority).await?;
                    let mut n = 0u64;
                    let mut i = c;
                    while Instant::now() < until {
                        let (status, _) = if kind == "poll" {
                            i = (i + 7919) % tickets.len();
                            conn.send(Method::GET, &tickets[i], &[], None).await?
                        } else {
                            conn.send(Method::POST, "/api/orders", &[], Some(body.clone()))
                                .await?
                        };
                        anyhow::ensure!(
                            status == StatusCode::OK || status == StatusCode::CONFLICT,
                            "{kind}: {status}"
                        );
                        n += 1;
                    }
                    anyhow::Ok(n)
                }));
            }
            let mut n = 0;
            for c in callers {
                n += c.await??;
            }
            let secs = started.elapsed().as_secs_f64();
            let cpu = match (cpu0, api.cpu()) {
                (Some(a), Some(b)) => (b - a).as_secs_f64() * 1e6 / n as f64,
                _ => f64::NAN,
            };
            let cmds = (redis_commands(redis).await? - cmds0) as f64 / n as f64;
            println!(
                "  {:<10} {:>10.0} {:>14.1} {:>16.4}   (round {})",
                kind,
                n as f64 / secs,
                cpu,
                cmds,
                round + 1
            );
            let t = totals.entry(kind).or_default();
            t.0 += n as f64 / secs;
            t.1 += cpu;
        }
    }
    let (polls, sold_out) = (totals["poll"], totals["sold_out"]);
    println!(
        "  poll / sold-out: rate {:.2}x, CPU per request {:.2}x (target: rate >= 0.9x)",
        polls.0 / sold_out.0,
        polls.1 / sold_out.1
    );
    Ok(vec![sold, line])
}

/// The paced crowd: `args.crowd` tickets in the line of a room that admits
/// `args.crowd_pace` buyers a second (nobody orders), polling for `args.crowd_secs` as the server paces
/// them (each answer's `poll_after_ms`), a share of them every 200 ms
/// whatever it says. Prints the polls per second against one poll a
/// second per ticket, the service's CPU and Redis commands per poll.
async fn paced_crowd(
    args: &BenchRoomArgs,
    pool: &Pool,
    admin: &[(&str, &str)],
    api: &ThreadGroup,
    redis: &Redis,
) -> anyhow::Result<flashsale::domain::ProductId> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let line = super::bench_product("crowd");
    let now = flashsale::domain::now_ms();
    let body = json!({
        "product_id": line.as_str(), "title": "the crowd", "price": "1.00",
        "available_qty": 10_000_000, "start_time": now - 1_000, "end_time": now + 3_600_000,
        "limit_per_user": 1,
        "waiting_room": {"ceiling_per_sec": args.crowd_pace, "floor_per_sec": args.crowd_pace,
                         "admission_secs": 120},
    });
    pool.open_sale(admin, &body).await?;
    let joined_at = Instant::now();
    let tickets = join_line(&pool.authority, &line, args.crowd, args.concurrency).await?;
    println!(
        "paced crowd: {} tickets joined in {:.1} s ({} connections), the room admits {}/s",
        tickets.len(),
        joined_at.elapsed().as_secs_f64(),
        args.concurrency,
        args.crowd_pace
    );
    // Every ticket's first poll spread over the first 5 s; then each when
    // its answer says (the eager ones: every 200 ms).
    let mut rng = Rng(args.seed ^ 0xc0ffee);
    let start = Instant::now();
    let mut due = BinaryHeap::new();
    for i in 0..tickets.len() {
        let eager = rng.unit() < args.eager_crowd_share;
        let at = start + Duration::from_secs_f64(rng.unit() * 5.0);
        due.push(Reverse((at, i, eager)));
    }
    let due = Arc::new(Mutex::new(due));
    let tickets = Arc::new(tickets);
    let until = start + Duration::from_secs(args.crowd_secs);
    let (cmds0, cpu0) = (redis_commands(redis).await?, api.cpu());
    let mut callers = Vec::new();
    for _ in 0..args.concurrency {
        let (authority, due, tickets) = (pool.authority.clone(), due.clone(), tickets.clone());
        callers.push(tokio::spawn(async move {
            let mut conn = Conn::open(&authority).await?;
            // (paced polls, eager polls, sum of poll_after_ms told)
            let (mut paced, mut eager_polls, mut told_ms) = (0u64, 0u64, 0u64);
            loop {
                let next = due.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop();
                let Some(Reverse((at, i, eager))) = next else {
                    break;
                };
                if at >= until {
                    break;
                }
                tokio::time::sleep_until(at.into()).await;
                let (status, answer) = conn.send(Method::GET, &tickets[i], &[], None).await?;
                anyhow::ensure!(status == StatusCode::OK, "poll: {status}");
                let answer: Value = serde_json::from_slice(&answer)?;
                let after = answer["poll_after_ms"].as_u64().unwrap_or(1_000);
                let next = if eager {
                    eager_polls += 1;
                    Duration::from_millis(200)
                } else {
                    paced += 1;
                    told_ms += after;
                    Duration::from_millis(after)
                };
                if answer["status"] == "waiting" {
                    due.lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(Reverse((Instant::now() + next, i, eager)));
                }
            }
            anyhow::Ok((paced, eager_polls, told_ms))
        }));
    }
    let (mut paced, mut eager, mut told_ms) = (0, 0, 0);
    for c in callers {
        let (p, e, t) = c.await??;
        (paced, eager, told_ms) = (paced + p, eager + e, told_ms + t);
    }
    let secs = start.elapsed().as_secs_f64();
    let polls = paced + eager;
    let cpu = match (cpu0, api.cpu()) {
        (Some(a), Some(b)) => (b - a).as_secs_f64() * 1e6 / polls.max(1) as f64,
        _ => f64::NAN,
    };
    let cmds = (redis_commands(redis).await? - cmds0) as f64 / polls.max(1) as f64;
    let every_second = tickets.len() as f64;
    println!(
        "  {polls} polls in {secs:.1} s: {:.0}/s ({paced} paced, {eager} eager every 200 ms); one a second per ticket would be {every_second:.0}/s: {:.1}x fewer",
        polls as f64 / secs,
        every_second / (polls as f64 / secs)
    );
    println!(
        "  mean poll_after_ms told {:.0}; service CPU {cpu:.1} us/poll; Redis {cmds:.5} commands/poll",
        told_ms as f64 / paced.max(1) as f64
    );
    Ok(line)
}

/// Buyers 1 to `buyers` join the room of `line` over `conns` connections;
/// their tickets' poll paths.
async fn join_line(
    authority: &str,
    line: &flashsale::domain::ProductId,
    buyers: u64,
    conns: usize,
) -> anyhow::Result<Vec<String>> {
    let conns = conns.max(1) as u64;
    let mut joins = Vec::new();
    for c in 0..conns {
        let (authority, line) = (authority.to_owned(), line.to_string());
        joins.push(tokio::spawn(async move {
            let mut conn = Conn::open(&authority).await?;
            let mut tickets = Vec::new();
            for user in (1..=buyers).filter(|u| u % conns == c) {
                let body = json!({"user_id": user}).to_string();
                let path = format!("/api/sales/{line}/queue");
                let (status, answer) = conn.send(Method::POST, &path, &[], Some(body)).await?;
                anyhow::ensure!(status == StatusCode::OK, "join: {status}");
                let answer: Value = serde_json::from_slice(&answer)?;
                let ticket = answer["ticket"].as_str().unwrap_or_default();
                tickets.push(format!("/api/sales/{line}/queue/{ticket}"));
            }
            anyhow::Ok(tickets)
        }));
    }
    let mut tickets = Vec::new();
    for j in joins {
        tickets.extend(j.await??);
    }
    Ok(tickets)
}

/// What the join's proof of work costs: its check per join (one HMAC, one
/// SHA-256), and solving it natively on this machine.
fn join_cost() {
    use flashsale::sale::room::{RoomKey, pow};
    let key = RoomKey::from_hex(&RoomKey::generate()).unwrap_or_else(|| unreachable!());
    let Ok(product) = flashsale::domain::ProductId::parse("pow-bench") else {
        return;
    };
    let now = flashsale::domain::now_ms();
    let (challenge, _) = pow::challenge(&key, &product, now);
    let nonce = pow::solve(&challenge, 7, 16);
    let proof = format!("{challenge}.{nonce}");
    let n = 200_000u32;
    let t = Instant::now();
    let mut ok = 0;
    for _ in 0..n {
        ok += u32::from(pow::check(&key, &product, 7, 16, Some(&proof), now).is_ok());
    }
    let per_check = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    println!("join's proof of work:");
    println!("  check per join (valid proof, 16 bits): {per_check:.0} ns ({ok} of {n} held)");
    for bits in [12u8, 16, 20] {
        let runs = 8u64;
        let t = Instant::now();
        for user in 0..runs {
            let _ = pow::solve(&challenge, 100 + user, bits);
        }
        println!(
            "  solving natively, {bits} bits: {:.1} ms on average over {runs} buyers",
            t.elapsed().as_secs_f64() * 1000.0 / runs as f64
        );
    }
}

/// `total_commands_processed` of `INFO stats`.
async fn redis_commands(redis: &Redis) -> anyhow::Result<u64> {
    let mut conn = redis.shared().await?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no total_commands_processed in INFO stats"))
}

/// One `serve` with its workers, on a runtime of its own whose threads are
/// `api` (so its CPU is measured apart from the buyers'); its address.
async fn serve(
    args: &BenchRoomArgs,
    redis: &RedisSettings,
    token: &str,
    api: ThreadGroup,
) -> anyhow::Result<(String, oneshot::Sender<()>)> {
    let settings = Settings {
        redis: redis.clone(),
        db: (&args.db).into(),
        http: HttpSettings {
            listen_addr: "127.0.0.1:0".parse()?,
            admin_token: Some(token.into()),
            admin_routes: true,
            dashboard_session: Duration::from_secs(900),
            connections: flashsale::config::ConnectionArgs::settings(),
            auth: AuthSettings::off(),
            limits: Limits::unlimited(),
            memory: MemorySettings::default(),
            payments: None,
        },
        workers: Some(flashsale::config::WorkerConfig::default()),
    };
    super::rehearsal::serve_on_own_runtime(settings, api).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        room: BenchRoomArgs,
    }

    #[test]
    fn the_ceiling_and_the_crowds_pace_keep_their_earlier_flags() {
        use clap::Parser;
        let now = Cli::parse_from(["room", "--ceiling=40", "--crowd-pace=30"]).room;
        assert_eq!((now.ceiling, now.crowd_pace), (40, 30));
        let before = Cli::parse_from(["room", "--rate=41", "--crowd-rate=31"]).room;
        assert_eq!((before.ceiling, before.crowd_pace), (41, 31));
    }

    #[test]
    fn rank_correlation_is_1_for_the_same_order_and_near_0_for_a_shuffle() {
        let same: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, i as f64 * 2.0)).collect();
        assert!((rank_correlation(&same) - 1.0).abs() < 1e-9);
        let reversed: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, -(i as f64))).collect();
        assert!((rank_correlation(&reversed) + 1.0).abs() < 1e-9);
        let mut rng = Rng(1);
        let shuffled: Vec<(f64, f64)> = (0..2000).map(|i| (i as f64, rng.unit())).collect();
        assert!(rank_correlation(&shuffled).abs() < 0.1);
    }

    #[test]
    fn the_slope_of_a_line_is_its_rate() {
        let line: Vec<(f64, f64)> = (0..50)
            .map(|i| (i as f64 * 10.0, 3.0 + i as f64 * 2.0))
            .collect();
        assert!((slope(&line) - 0.2).abs() < 1e-9);
    }
}
