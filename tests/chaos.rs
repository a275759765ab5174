//! Chaos test of the whole system: real processes, real faults, exact books.
//!
//! It starts a private Redis (append-only file, fsync on every write) and a
//! private MariaDB on free loopback ports, two API-only `flashsale serve`s and
//! two `flashsale worker`s against them, opens three sales with less stock
//! than demand and a per-user limit, and sends orders from concurrent buyers
//! (each attempt with its own `Idempotency-Key`, retried under the same key
//! after any ambiguous answer) while a seeded schedule of faults runs:
//! kill -9 of APIs, workers (same or new consumer name), MariaDB and Redis,
//! SIGSTOP of MariaDB and of a worker (past `CLAIM_IDLE_MS`), and restarts of
//! APIs and workers while MariaDB is down or frozen.
//!
//! Then, with everything back up and every ambiguous attempt settled, it
//! proves that nothing a client was told was lost or doubled:
//! 1. every order answered 202 is in `tb_order` exactly once, and each key
//!    was given one order id however often it was replayed;
//! 2. `tb_order` holds no order that no client was told about;
//! 3. each sale sold exactly its stock: no oversell, no undersell (Redis
//!    stock 0, units in MySQL == stock);
//! 4. no user is over the per-user limit;
//! 5. `flashsale audit` finds the books balanced for every sale;
//! 6. no process panicked and no client saw a 5xx other than 503.
//!
//! `CHAOS_SEED` (printed at the start) replays a run's fault schedule and
//! order plan. A failing run keeps its directory (process logs, data) and
//! prints its path. This is its own test binary so it never overlaps the
//! main suite (cargo runs test binaries one after another).

#[path = "chaos/checks.rs"]
mod checks;
#[path = "chaos/faults.rs"]
mod faults;
#[path = "chaos/load.rs"]
mod load;
#[path = "chaos/procs.rs"]
mod procs;
#[path = "chaos/rng.rs"]
mod rng;
#[path = "chaos/world.rs"]
mod world;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use load::{Sale, Shop};
use rng::Rng;
use world::World;

const APIS: usize = 2;
const WORKERS: usize = 2;
/// Stock per sale: below the plan's demand (checked), so "sold exactly the
/// stock" is what must happen; and sized to sell out late in the window,
/// so orders are being accepted through most of the faults.
const SALES: [(&str, u64); 3] = [("chaos-a", 700), ("chaos-b", 650), ("chaos-c", 600)];
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_no_order_and_sells_exactly_the_stock() {
    let seed = rng::seed_from_env();
    println!("chaos seed {seed} (CHAOS_SEED={seed} replays this run's schedule)");
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let mut world = World::start(APIS, WORKERS).await;
    println!(
        "chaos: started in {:.1?}, dir {}",
        t0.elapsed(),
        world.dir.path.display()
    );

    let sales: Vec<Sale> = SALES
        .iter()
        .map(|&(id, stock)| Sale {
            id: id.into(),
            stock,
        })
        .collect();
    for s in &sales {
        world.open_sale(&s.id, s.stock, LIMIT_PER_USER).await;
    }
    let shop = Shop::new(world.api_urls.clone(), sales.clone());
    let plan = load::plan(&mut rng.fork(), sales.len(), ATTEMPTS, USERS);
    let demand = load::demand(&plan, sales.len(), LIMIT_PER_USER);
    for (sale, units) in sales.iter().zip(&demand) {
        assert!(units > &sale.stock, "{}: demand {units} ≤ stock", sale.id);
    }

    // The load and the faults, side by side, until the window closes.
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
    let chaos = faults::run(
        &mut world,
        &shop,
        rng.fork(),
        chaos_t0 + CHAOS_WINDOW,
        MAX_FAULTS,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let sent = load.await.expect("the load ran");
    let chaos_took = chaos_t0.elapsed();

    // Calm: everything up, every ambiguous attempt settled, the last units sold.
    let mut problems = chaos.failures.clone();
    problems.extend(world.ensure_up().await);
    problems.extend(world.await_ready(READY_LIMIT).await);
    let unsettled = shop.ledger.unsettled().len();
    let mut settle_rng = rng.fork();
    shop.settle(&mut settle_rng).await;
    let mut mopped = Vec::new();
    for i in 0..sales.len() {
        mopped.push(shop.sell_out(i, &mut settle_rng).await);
    }
    shop.settle(&mut settle_rng).await;
    let book = shop.ledger.book().clone();

    let told = checks::told_per_sale(&book, &sales);
    let drained = checks::wait_drained(&world, &sales, &told, DRAIN_LIMIT).await;
    if let Err(e) = &drained {
        problems.push(e.clone());
    }
    problems.extend(checks::verify(&world, &sales, &book, LIMIT_PER_USER).await);
    let (audit, audit_problems) = checks::audit(&world, &sales).await;
    problems.extend(audit_problems);
    problems.extend(checks::panics_in_logs(&world));

    report(&Report {
        seed,
        took: t0.elapsed(),
        chaos_took,
        chaos: &chaos,
        book: &book,
        sent,
        unsettled,
        demand: &demand,
        sales: &sales,
        mopped: &mopped,
        drained: &drained,
        audit: &audit,
        errors: checks::error_lines(&world),
    });
    if !problems.is_empty() {
        let logs: Vec<String> = world
            .all_logs()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        panic!(
            "chaos seed {seed} (CHAOS_SEED={seed} to replay): {} problem(s):\n{}\n\nlogs:\n{}",
            problems.len(),
            problems.join("\n"),
            logs.join("\n")
        );
    }
}

struct Report<'a> {
    seed: u64,
    took: Duration,
    chaos_took: Duration,
    chaos: &'a faults::ChaosReport,
    book: &'a load::Book,
    sent: usize,
    unsettled: usize,
    demand: &'a [u64],
    sales: &'a [Sale],
    mopped: &'a [u64],
    drained: &'a Result<Duration, String>,
    audit: &'a str,
    errors: Vec<(String, usize)>,
}

/// What happened, for the person reading the test output.
fn report(r: &Report) {
    println!("\n=== chaos report (seed {}) ===", r.seed);
    println!(
        "wall time {:.1?}; chaos window {:.1?}, {} faults",
        r.took,
        r.chaos_took,
        r.chaos.injected.len()
    );
    let mut kinds = std::collections::BTreeMap::new();
    for f in &r.chaos.injected {
        *kinds.entry(format!("{:?}", f.fault)).or_insert(0) += 1;
    }
    println!("faults by kind: {kinds:?}");
    for f in &r.chaos.injected {
        println!("  +{:>5.1}s {:?}: {}", f.at.as_secs_f64(), f.fault, f.what);
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
    match r.drained {
        Ok(d) => println!("drained {d:.1?} after the settle"),
        Err(e) => println!("NOT drained: {e}"),
    }
    println!("ERROR log lines per process: {:?}", r.errors);
    print!("{}", r.audit);
}
