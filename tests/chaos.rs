//! Chaos test of the whole system: real processes, real faults, exact books.
//!
//! It starts a private Redis (append-only file, fsync on every write) and a
//! private MariaDB on free loopback ports, two API-only `flashsale serve`s and
//! two `flashsale worker`s against them, opens three sales with less stock
//! than demand and a per-user limit (one behind a waiting room: its buyers
//! join, poll and order with their admission), and sends orders from concurrent buyers
//! (each attempt with its own `Idempotency-Key`, retried under the same key
//! after any ambiguous answer) while a seeded schedule of faults runs:
//! kill -9 of APIs, workers (same or new consumer name), MariaDB and Redis,
//! SIGSTOP of MariaDB and of a worker (past `CLAIM_IDLE_MS`), and restarts of
//! APIs and workers while MariaDB is down or frozen. One sale has three
//! stock shards, and an API is killed as it takes units from one of them
//! (seen in Redis's MONITOR feed), between the move's take and its apply.
//!
//! Beside the buyers, the payment side pays every order it was told about
//! (a signed `payment.succeeded` to a random API, resent under the same
//! payment id until a 200) after a random delay of up to twice the payment
//! timeout, so a third or more of them come after the workers cancelled
//! their order (late payments: paid again, or owed back). And the workers
//! push every event of the outbox to a receiver in the test process, which
//! checks each signature with its own HMAC code and fails a seeded share of
//! the deliveries (so they are retried across the faults).
//!
//! Then, with everything back up and every ambiguous attempt settled, every
//! order not paid yet is paid at once (no more timeouts), and the units the
//! timeouts gave back are sold to new buyers and paid, until nothing is left
//! to sell or to pay. It proves that nothing a client or the payment side
//! was told was lost or doubled:
//! 1. every order answered 202 is in `tb_order` exactly once, and each key
//!    was given one order id however often it was replayed; each is paid or
//!    cancelled;
//! 2. `tb_order` holds no order that no client was told about;
//! 3. each sale sold exactly its stock: no oversell, no undersell (Redis
//!    stock 0, units of the orders not cancelled == stock); no move between
//!    the sharded sale's shards is left in flight, each was given once and
//!    applied once where it went; and at least one kill -9 of an API left
//!    a move of its own in flight (the moves in flight are read right after
//!    every API kill, before its restart: each fault's line gives them);
//! 4. no user is over the per-user limit (orders not cancelled);
//! 5. `flashsale audit` finds the books balanced for every sale;
//! 6. no process panicked, and no client nor the payment side saw a 5xx
//!    other than 503, nor a 503 without `Retry-After` (nor any other
//!    answer a payment cannot have);
//! 7. every order told 202 has exactly one payment in `tb_payment`, its own,
//!    recorded with the result the payment side was answered: `paid` or
//!    `paid_again` and the order `paid`, or `refund_due` and the order
//!    `cancelled`; and some payments were late (paid again or owed back);
//! 8. every event the books list (`GET /api/admin/events`) reached the
//!    receiver as `evt_<id>`, signed, with the feed's body (a duplicate only
//!    with the same id and body), first received in id order, none
//!    dead-lettered; and each order's events tell its story:
//!    `order.confirmed`, then `order.paid`, or `order.cancelled` and then
//!    `order.paid` (paid again) or `order.refund_due`; each sale has its
//!    `sale.sold_out`.
//!
//! `CHAOS_SEED` (printed at the start) replays a run's fault schedule, order
//! plan, payment delays and receiver failures. A failing run keeps its
//! directory (process logs, data, `problems.txt`) and prints its path. This
//! is its own test binary so it never overlaps the main suite (cargo runs
//! test binaries one after another).

#[path = "chaos/checks.rs"]
mod checks;
#[path = "chaos/events.rs"]
mod events;
#[path = "chaos/faults.rs"]
mod faults;
#[path = "chaos/load.rs"]
mod load;
#[path = "chaos/moves.rs"]
mod moves;
#[path = "chaos/payments.rs"]
mod payments;
#[path = "chaos/procs.rs"]
mod procs;
#[path = "chaos/receiver.rs"]
mod receiver;
#[path = "chaos/rng.rs"]
mod rng;
#[path = "chaos/upgrade.rs"]
mod upgrade;
#[path = "chaos/world.rs"]
mod world;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use load::{Apis, Sale, Shop};
use payments::Payer;
use receiver::Receiver;
use rng::Rng;
use world::World;

const APIS: usize = 2;
const WORKERS: usize = 2;
/// Stock per sale: below the plan's demand (checked), so "sold exactly the
/// stock" is what must happen; and sized to sell out late in the window,
/// so orders are being accepted through most of the faults.
/// The last is opened with three stock shards and half the stock: units
/// move between shards only once one runs short, so it sells out a third
/// of the way in, and from then on the units its payment timeouts give
/// back move between its shards (a move every second or two) through the
/// rest of the faults, API instances killed mid-move among them (see
/// `faults`: the mid-move kill waits for a take; a kill at a random moment
/// all but never lands in a move, which lasts about a millisecond).
/// The second has a waiting room (a pace well above the crowd's: its
/// buyers join, poll and order with their admission, across the faults or
/// the swaps).
const SALES: [(&str, u64, u16, bool); 3] = [
    ("chaos-a", 700, 1, false),
    ("chaos-b", 650, 1, true),
    ("chaos-c", 300, 3, false),
];
const LIMIT_PER_USER: u64 = 2;
const USERS: u64 = 800;
const ATTEMPTS: usize = 2400;
const BUYERS: usize = 24;
/// Faults (and the load) run this long, plus the last fault's own length.
const CHAOS_WINDOW: Duration = Duration::from_secs(90);
const MAX_FAULTS: usize = 30;
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// A process retries its database setup with back-off up to 10 s.
const READY_LIMIT: Duration = Duration::from_secs(45);
/// The workers cancel an order unpaid this long after it was accepted
/// (`PAYMENT_TIMEOUT_SECS`; the sweeper passes every 5 s).
const PAYMENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Each order is paid after a random delay up to this (uniform): a third
/// or more of them after their payment timeout (late payments; the rest of
/// the orders told late in the window are paid at the end, at once).
const PAY_DELAY_MAX: Duration = Duration::from_secs(2 * PAYMENT_TIMEOUT.as_secs());
/// The share of the event deliveries the receiver fails (500), so that
/// deliveries are retried across the faults. Delivery is in order, and each
/// failure holds it back for its back-off (0.5-1 s, then doubling): at
/// 10% the workers would deliver ~10 events a second, a quarter of what
/// the run records, and the backlog would outlast the run by minutes.
const RECEIVER_FAILS_PERCENT: u64 = 3;
/// Rounds of "pay every order, sell the units the timeouts gave back".
const END_ROUNDS: u64 = 6;
/// The wait for the receiver to have every event: while delivery moves on
/// (an event acknowledged within DELIVERY_STALL: more than a lease, 10 s,
/// and a few back-offs), at most DELIVERY_LIMIT.
const DELIVERY_STALL: Duration = Duration::from_secs(30);
const DELIVERY_LIMIT: Duration = Duration::from_secs(240);
/// The workers' `BATCH_SIZE` (world.rs).
const WORKER_BATCH: u64 = 20;
/// Problems shown in the failure message (all of them go to a file).
const SHOWN_PROBLEMS: usize = 60;

/// The two runs of this binary, one at a time (cargo runs a binary's tests
/// side by side; each is the whole machine's load).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_no_order_and_sells_exactly_the_stock() {
    let _one = ONE_AT_A_TIME.lock().await;
    scenario(Disruption::Faults).await;
}

/// A rolling upgrade from the previous release during the live sale, a
/// rollback and forward again: the fleet runs two releases side by side
/// throughout, and nothing a client, the payment side or the shop was told
/// is lost or doubled (docs/operations.md "Upgrading").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_and_a_rollback_during_a_live_sale_lose_nothing() {
    let previous = previous_release();
    let _one = ONE_AT_A_TIME.lock().await;
    scenario(Disruption::Upgrade { previous }).await;
}

/// The previous release's binary (scripts/previous-release.sh: built once
/// per commit, cached), or `FLASHSALE_PREVIOUS_BIN`.
fn previous_release() -> std::ffi::OsString {
    if let Some(bin) = std::env::var_os("FLASHSALE_PREVIOUS_BIN") {
        return bin;
    }
    let out = std::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/previous-release.sh"
    ))
    .stderr(std::process::Stdio::inherit())
    .output()
    .expect("scripts/previous-release.sh runs");
    assert!(out.status.success(), "scripts/previous-release.sh failed");
    let path = String::from_utf8(out.stdout).expect("a path");
    path.trim().into()
}

/// What the run does to the fleet while the load runs.
enum Disruption {
    /// The seeded faults (`faults`).
    Faults,
    /// The fleet starts on `previous` and is upgraded to this tree's binary
    /// (`upgrade`).
    Upgrade { previous: std::ffi::OsString },
}

async fn scenario(disruption: Disruption) {
    let seed = rng::seed_from_env();
    println!("chaos seed {seed} (CHAOS_SEED={seed} replays this run's schedule)");
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let receiver = Receiver::start(rng.fork(), RECEIVER_FAILS_PERCENT).await;
    let first = match &disruption {
        Disruption::Faults => std::ffi::OsStr::new(world::FLASHSALE),
        Disruption::Upgrade { previous } => previous.as_os_str(),
    };
    let mut world = World::start(first, APIS, WORKERS, PAYMENT_TIMEOUT, &receiver.url).await;
    println!(
        "chaos: started in {:.1?}, dir {}",
        t0.elapsed(),
        world.dir.path.display()
    );

    let sales: Vec<Sale> = SALES
        .iter()
        .map(|&(id, stock, shards, room)| Sale {
            id: id.into(),
            stock,
            shards,
            room,
        })
        .collect();
    for s in &sales {
        world
            .open_sale(&s.id, s.stock, LIMIT_PER_USER, (s.shards, s.room))
            .await;
    }
    let shop = Shop::new(Apis::new(world.api_urls.clone()), sales.clone());
    let plan = load::plan(&mut rng.fork(), sales.len(), ATTEMPTS, USERS);
    let demand = load::demand(&plan, sales.len(), LIMIT_PER_USER);
    for (sale, units) in sales.iter().zip(&demand) {
        assert!(units > &sale.stock, "{}: demand {units} ≤ stock", sale.id);
    }

    // The load, its payments and the faults, side by side, until the
    // window closes.
    let payer = Payer::new(shop.apis.clone(), world::PRICE, PAY_DELAY_MAX);
    let paying = Arc::new(AtomicBool::new(false));
    let follow = tokio::spawn(payer.clone().follow(
        shop.ledger.clone(),
        rng.fork(),
        paying.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(load::run(
        shop.clone(),
        plan,
        BUYERS,
        CHAOS_WINDOW,
        stop.clone(),
        rng.fork(),
    ));
    let chaos_t0 = Instant::now();
    let sharded = sales.iter().find(|s| s.shards > 1).expect("a sharded sale");
    let (chaos, swaps) = match &disruption {
        Disruption::Faults => {
            let chaos = faults::run(
                &mut world,
                &shop,
                sharded.clone(),
                rng.fork(),
                chaos_t0 + CHAOS_WINDOW,
                MAX_FAULTS,
            )
            .await;
            (Some(chaos), None)
        }
        Disruption::Upgrade { previous } => {
            let this = std::ffi::OsStr::new(world::FLASHSALE);
            let swaps = upgrade::run(
                &mut world,
                &shop.apis,
                (previous.as_os_str(), this),
                chaos_t0 + CHAOS_WINDOW,
            )
            .await;
            (None, Some(swaps))
        }
    };
    stop.store(true, Ordering::Relaxed);
    let sent = load.await.expect("the load ran");
    let chaos_took = chaos_t0.elapsed();

    // Calm: everything up, every ambiguous attempt settled.
    let dead = checks::dead_letters(&world, &sales).await;
    assert!(
        dead.is_empty(),
        "entries dead-lettered in the window: {dead:?}; logs: {:?}",
        world.all_logs()
    );
    let mut problems = Vec::new();
    if let Some(chaos) = &chaos {
        problems.extend(chaos.failures.iter().cloned());
        // An API killed mid-move, for real: the move it had just taken was
        // still in flight once it was dead (check 3b then proves that
        // another finished it, units in place).
        if !chaos.api_kills.iter().any(faults::ApiKill::left_its_move) {
            problems.push(format!(
                "none of the {} kill(s) -9 of an API left a move of its own in flight: the \
                 kill between a move's take and its apply was not tested",
                chaos.api_kills.len()
            ));
        }
    }
    if let Some(swaps) = &swaps {
        problems.extend(swaps.failures.iter().cloned());
    }
    problems.extend(world.ensure_up().await);
    problems.extend(world.await_ready(READY_LIMIT).await);
    let unsettled = shop.ledger.unsettled().len();
    let mut settle_rng = rng.fork();
    shop.settle(&mut settle_rng).await;
    // Then every order paid at once (no more timeouts), the units the
    // timeouts gave back sold and paid, until none is left to sell or pay.
    paying.store(true, Ordering::Relaxed);
    follow.await.expect("the payer followed the orders");
    let mut mopped = vec![0; sales.len()];
    let mut rounds = 0;
    loop {
        let unanswered = payer.pay_now(&shop.ledger, &mut settle_rng).await;
        let left = checks::stock_left(&world, &sales).await;
        let open = checks::unsettled_rows(&world).await;
        rounds += 1;
        if unanswered.is_empty() && open == 0 && left.iter().all(|l| *l == Some(0)) {
            break;
        }
        if rounds == END_ROUNDS {
            problems.push(format!(
                "after {rounds} rounds of paying and selling out: {} order(s) never answered \
                 (first {:?}), {open} order(s) neither paid nor cancelled and released, redis \
                 stock {left:?}",
                unanswered.len(),
                unanswered.first()
            ));
            break;
        }
        for (i, l) in left.iter().enumerate() {
            if *l != Some(0) {
                mopped[i] += shop.sell_out(i, rounds - 1, &mut settle_rng).await;
            }
        }
        shop.settle(&mut settle_rng).await;
    }
    let book = shop.ledger.book().clone();
    let moves_given = {
        let mut r = checks::redis(&world).await;
        moves::given(&mut r, sharded).await.ok()
    };

    let told = checks::told_per_sale(&book, &sales);
    let drained = checks::wait_drained(&world, &sales, &told, DRAIN_LIMIT).await;
    if let Err(e) = &drained {
        problems.push(e.clone());
    }
    problems.extend(checks::verify(&world, &sales, &book, LIMIT_PER_USER).await);
    let (audit, audit_problems) = checks::audit(&world, &sales).await;
    problems.extend(audit_problems);
    let pay_book = std::mem::take(&mut *payer.book());
    problems.extend(pay_book.failures.iter().cloned());
    if let Some(swaps) = &swaps {
        // Two releases side by side, and neither finds anything wrong with
        // what the other wrote: an entry one cannot read is retried, and
        // may well end up in the books through the other (reclaimed, or its
        // dead letters taken home), but the reader says so at each delivery.
        for (log, n) in checks::error_lines(&world) {
            if n > 0 {
                problems.push(format!("{n} ERROR line(s) in {log} across the swaps"));
            }
        }
        // The report, counted by both releases' processes, equals the books.
        let short = swaps.previous_worker_stops * WORKER_BATCH;
        problems.extend(checks::report_equals_books(&world, &sales, &told, short).await);
        for (log, n) in checks::unreadable_entries(&world) {
            if n > 0 {
                problems.push(format!("{log}: {n} stream entries it could not read"));
            }
        }
        // A swap resets no request and leaves none hanging: every request
        // of a client or the payment side was answered (an API out of the
        // rotation gets none; what it had, it answers before it exits).
        for (status, n) in book.statuses.iter().chain(&pay_book.statuses) {
            if status.starts_with("transport") {
                problems.push(format!(
                    "{n} request(s) unanswered across the swaps: {status}"
                ));
            }
        }
    }
    let (paid, pay_problems) = checks::payments(&world, &book, &pay_book.answers).await;
    problems.extend(pay_problems);
    if paid.late() == 0 {
        problems.push(
            "no payment came after its order's payment timeout: the late payments were not tested"
                .into(),
        );
    }
    let delivered_in =
        events::wait_delivered(&world, &receiver, DELIVERY_STALL, DELIVERY_LIMIT).await;
    if let Err(e) = &delivered_in {
        problems.push(e.clone());
    }
    let (delivered, event_problems) = events::check(&world, &receiver, &sales).await;
    problems.extend(event_problems);
    problems.extend(checks::panics_in_logs(&world));

    report(&Report {
        seed,
        took: t0.elapsed(),
        chaos_took,
        chaos: chaos.as_ref(),
        swaps: swaps.as_ref(),
        moves_given,
        book: &book,
        sent,
        unsettled,
        demand: &demand,
        sales: &sales,
        mopped: &mopped,
        rounds,
        drained: &drained,
        audit: &audit,
        pay_statuses: &pay_book.statuses,
        paid: &paid,
        delivered: &delivered,
        delivered_in: &delivered_in,
        errors: checks::error_lines(&world),
    });
    if !problems.is_empty() {
        let logs: Vec<String> = world
            .all_logs()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        // All of them in the kept directory; the first ones here.
        let all = world.dir.path.join("problems.txt");
        let _ = std::fs::write(&all, problems.join("\n"));
        let more = match problems.len().saturating_sub(SHOWN_PROBLEMS) {
            0 => String::new(),
            n => format!("\n... and {n} more: {}", all.display()),
        };
        panic!(
            "chaos seed {seed} (CHAOS_SEED={seed} to replay): {} problem(s):\n{}{more}\n\nlogs:\n{}",
            problems.len(),
            problems[..problems.len().min(SHOWN_PROBLEMS)].join("\n"),
            logs.join("\n")
        );
    }
}

struct Report<'a> {
    seed: u64,
    took: Duration,
    chaos_took: Duration,
    chaos: Option<&'a faults::ChaosReport>,
    swaps: Option<&'a upgrade::UpgradeReport>,
    moves_given: Option<usize>,
    book: &'a load::Book,
    sent: usize,
    unsettled: usize,
    demand: &'a [u64],
    sales: &'a [Sale],
    mopped: &'a [u64],
    rounds: u64,
    drained: &'a Result<Duration, String>,
    audit: &'a str,
    pay_statuses: &'a std::collections::BTreeMap<String, u64>,
    paid: &'a checks::Payments,
    delivered: &'a events::Delivered,
    delivered_in: &'a Result<Duration, String>,
    errors: Vec<(String, usize)>,
}

/// What happened, for the person reading the test output.
fn report(r: &Report) {
    println!("\n=== chaos report (seed {}) ===", r.seed);
    if let Some(swaps) = r.swaps {
        println!(
            "wall time {:.1?}; window {:.1?}, {} swaps ({} failed)",
            r.took,
            r.chaos_took,
            swaps.steps.len() + swaps.failures.len(),
            swaps.failures.len()
        );
        for (at, step) in &swaps.steps {
            println!("  +{:>5.1}s {step}", at.as_secs_f64());
        }
    }
    if let Some(chaos) = r.chaos {
        report_faults(r, chaos);
    }
    println!("answers seen by clients:");
    for (status, n) in &r.book.statuses {
        println!("  {status:<28} {n}");
    }
    let accepted = r.book.keys.values().filter(|k| !k.order_ids.is_empty());
    println!(
        "keys: {} of the plan's {ATTEMPTS} sent in the window, {} in all (with probes and \
         last units), {} accepted; {} unsettled when the chaos ended (settled by replays after)",
        r.sent,
        r.book.keys.len(),
        accepted.count(),
        r.unsettled
    );
    for ((sale, mopped), demand) in r.sales.iter().zip(r.mopped).zip(r.demand) {
        println!(
            "sale {}: stock {}, plan's demand {demand}, {mopped} last units sold after the chaos",
            sale.id, sale.stock
        );
    }
    println!(
        "{} round(s) of paying every order and selling what the timeouts gave back",
        r.rounds
    );
    match r.drained {
        Ok(d) => println!("drained {d:.1?} after the settle"),
        Err(e) => println!("NOT drained: {e}"),
    }
    println!("answers seen by the payment side:");
    for (status, n) in r.pay_statuses {
        println!("  {status:<28} {n}");
    }
    let result = |k: &str| r.paid.results.get(k).copied().unwrap_or(0);
    println!(
        "payments: {} paid, {} paid_again, {} refund_due ({} late, after their order's \
         timeout of {PAYMENT_TIMEOUT:?}); {} answered from a replay; at most {} sends for one",
        result("paid"),
        result("paid_again"),
        result("refund_due"),
        r.paid.late(),
        r.paid.replayed,
        r.paid.most_tries
    );
    let d = r.delivered;
    println!(
        "events: {} listed by the books {:?}; {} delivered ({} acknowledgements, {} \
         duplicates); {} receiver failures injected",
        d.events(),
        d.by_type,
        d.distinct,
        d.acked,
        d.duplicates(),
        d.failed
    );
    match r.delivered_in {
        Ok(t) => println!("every event acknowledged {t:.1?} after the books were checked"),
        Err(e) => println!("NOT every event delivered: {e}"),
    }
    println!("ERROR log lines per process: {:?}", r.errors);
    print!("{}", r.audit);
}

fn report_faults(r: &Report, chaos: &faults::ChaosReport) {
    println!(
        "wall time {:.1?}; chaos window {:.1?}, {} faults",
        r.took,
        r.chaos_took,
        chaos.injected.len()
    );
    let mut kinds = std::collections::BTreeMap::new();
    for f in &chaos.injected {
        *kinds.entry(format!("{:?}", f.fault)).or_insert(0) += 1;
    }
    println!("faults by kind: {kinds:?}");
    for f in &chaos.injected {
        println!("  +{:>5.1}s {:?}: {}", f.at.as_secs_f64(), f.fault, f.what);
    }
    let kills = &chaos.api_kills;
    let aimed = kills.iter().filter(|k| k.aimed_at.is_some()).count();
    let caught = kills.iter().filter(|k| !k.in_flight.is_empty()).count();
    let own: Vec<_> = kills.iter().filter_map(|k| k.own_move()).collect();
    println!(
        "API kills: {} ({aimed} at a take of the sharded sale), {caught} with moves in flight; \
         {} left their own move in flight ({} not applied, {} applied and not dropped); \
         the sharded sale made {} moves in all",
        kills.len(),
        own.len(),
        own.iter().filter(|m| !m.applied).count(),
        own.iter().filter(|m| m.applied).count(),
        r.moves_given.map_or("?".into(), |n| n.to_string())
    );
}
