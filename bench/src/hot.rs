//! `flashsale-bench hot-sale`: what a hot sale costs each Redis master,
//! with its stock in one shard or split over several, side by
//! side in one run (BENCHMARKS.md, "What does a hot sale cost?").
//!
//! For each shard count: a sale of `--orders` units is opened (under the
//! benchmark prefix: no worker drains it) and sold out through the real
//! order path (`OrderPath::place`: memory, shared calls, the shards' moves),
//! one unit to each of as many buyers, `--concurrency` at a time. Every
//! master's `used_cpu_sys + used_cpu_user` is read before and after: its
//! Redis CPU per accepted order of the sale, the moves the sale made, and
//! the share of the orders each master decided. Then moves alone are
//! timed: one unit at a time between two shards of a sale of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;

use flashsale::config::{MemorySettings, RedisArgs, RedisTarget};
use flashsale::domain::{ProductId, Quantity, UserId};
use flashsale::sale::{Decision, NewOrder, Redis, Route, Sales, Vouched};

#[derive(Debug, Clone, Args)]
pub struct BenchHotArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Stock shards of the sales compared, in this order.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub shards: Vec<u16>,
    /// Units of each sale, each sold to a buyer of its own.
    #[arg(long, default_value_t = 30_000)]
    pub orders: u64,
    /// Orders in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u64,
    /// Moves timed, one unit each.
    #[arg(long, default_value_t = 500)]
    pub moves: u64,
    /// Share of a core kept busy, for the projected ceilings.
    #[arg(long, default_value_t = 0.7)]
    pub busy: f64,
    /// `--concurrency` per shard rather than per sale: each shard's calls
    /// carry as many orders as the one-shard sale's (a hot sale's crowd
    /// fills every shard's calls; a small load generator does not).
    #[arg(long)]
    pub per_shard: bool,
    /// Straight to the order script instead of the order path: every call
    /// carries 64 orders (the most a shared call takes), `--concurrency`
    /// calls in flight per shard, each buyer sent to their home shard.
    /// What a shard's own work costs when its calls are full, whatever the
    /// load generator can fill.
    #[arg(long)]
    pub full_calls: bool,
    /// The masters run under valgrind's callgrind
    /// (`scripts/hot-sale-instructions.sh` starts such a cluster): each
    /// master's instructions are read (`callgrind_control -e`) instead of
    /// its CPU clock, a count the machine's other load does not change.
    #[arg(long)]
    pub callgrind: bool,
}

/// Orders per call in `--full-calls` (the shared call's most).
const FULL_CALL: u64 = 64;

/// Every master's address, `host:port`.
async fn masters(target: &RedisTarget) -> anyhow::Result<Vec<String>> {
    let nodes = match target {
        RedisTarget::Single(url) => return Ok(vec![url.clone()]),
        RedisTarget::Cluster(nodes) => nodes,
    };
    let first = nodes
        .first()
        .ok_or_else(|| anyhow::anyhow!("no cluster node"))?;
    let mut conn = redis::Client::open(first.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await?;
    let mut masters: Vec<String> = text
        .lines()
        .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
        .filter_map(|l| {
            let addr = l.split(' ').nth(1)?.split('@').next()?;
            Some(format!("redis://{addr}"))
        })
        .collect();
    masters.sort();
    Ok(masters)
}

/// What each master has spent so far: its Redis CPU in µs
/// (`used_cpu_sys + used_cpu_user`), or with `--callgrind` its instructions.
async fn spent(masters: &[String], callgrind: bool) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(masters.len());
    for url in masters {
        let mut conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let section = if callgrind { "server" } else { "cpu" };
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await?;
        let field = |name: &str| -> Option<f64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        };
        out.push(match callgrind {
            false => {
                (field("used_cpu_sys").unwrap_or(0.0) + field("used_cpu_user").unwrap_or(0.0)) * 1e6
            }
            true => {
                let pid = field("process_id")
                    .ok_or_else(|| anyhow::anyhow!("{url}: no process_id in INFO server"))?;
                instructions(pid as u32).await?
            }
        });
    }
    Ok(out)
}

/// The instructions a process under callgrind has run, all its threads.
async fn instructions(pid: u32) -> anyhow::Result<f64> {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("callgrind_control")
            .arg("-e")
            .arg(pid.to_string())
            .output()
    })
    .await??;
    let text = String::from_utf8_lossy(&out.stdout);
    let threads: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("Th")?;
            rest.split_whitespace()
                .nth(1)?
                .replace(',', "")
                .parse()
                .ok()
        })
        .collect();
    anyhow::ensure!(
        !threads.is_empty(),
        "pid {pid} is not under callgrind (callgrind_control -e said: {text})"
    );
    Ok(threads.iter().sum())
}

/// One sale's run.
struct Run {
    shards: u16,
    accepted: u64,
    elapsed: Duration,
    /// What each master spent over the run: Redis CPU in µs, or
    /// instructions (`--callgrind`).
    spent_by_master: Vec<f64>,
    moves: i64,
    /// Orders per `place_order.lua` call (shared calls).
    per_call: f64,
}

pub async fn run_hot_bench(args: BenchHotArgs) -> anyhow::Result<()> {
    let target = args.redis.target();
    let redis = Redis::new(
        &target,
        Duration::from_millis(args.redis.redis_timeout_ms.max(5_000)),
        16,
    )?;
    let sales = Sales::new(
        redis.clone(),
        super::bench_prefix(&args.redis.key_prefix),
        MemorySettings::default(),
        None,
    );
    let masters = masters(&target).await?;
    println!(
        "a hot sale of {} units sold out through the order path, {} in flight{}, on {} master(s):",
        args.orders,
        args.concurrency,
        match (args.full_calls, args.per_shard) {
            (true, _) => " calls of 64 orders per shard, straight to the script",
            (false, true) => " per shard",
            (false, false) => "",
        },
        masters.len()
    );
    let (what, unit) = match args.callgrind {
        true => ("Redis instructions", ""),
        false => ("Redis CPU", " µs"),
    };
    let mut runs = Vec::new();
    for &shards in &args.shards {
        let run = sell_out((&sales, &redis), &masters, shards, &args).await?;
        let total: f64 = run.spent_by_master.iter().sum();
        let per_master: Vec<String> = run
            .spent_by_master
            .iter()
            .map(|x| format!("{:.2}", x / run.accepted.max(1) as f64))
            .collect();
        println!(
            "  {} shard(s): {} accepted in {:.2} s, {:.1} orders a call, {} moves; {what} per accepted order by master [{}]{unit}, {:.2}{unit} in all; busiest master {:.0}% of it",
            run.shards,
            run.accepted,
            run.elapsed.as_secs_f64(),
            run.per_call,
            run.moves,
            per_master.join(", "),
            total / run.accepted.max(1) as f64,
            100.0 * run.spent_by_master.iter().cloned().fold(0.0, f64::max) / total.max(1e-9),
        );
        runs.push(run);
    }
    if let Some(one) = runs.iter().find(|r| r.shards == 1) {
        let base = one.spent_by_master.iter().sum::<f64>() / one.accepted.max(1) as f64;
        for r in runs.iter().filter(|r| r.shards > 1) {
            let total = r.spent_by_master.iter().sum::<f64>() / r.accepted.max(1) as f64;
            let busiest =
                r.spent_by_master.iter().cloned().fold(0.0, f64::max) / r.accepted.max(1) as f64;
            println!(
                "  {} shards against 1: {:+.1}% {what} in all (the moves and the shards' own calls), busiest master {:.2}{unit} = {:.2} of the one-shard figure (1/{} = {:.2})",
                r.shards,
                100.0 * (total / base - 1.0),
                busiest,
                busiest / base,
                r.shards,
                1.0 / f64::from(r.shards)
            );
        }
        // The ceilings need time; instructions are not.
        let ceilings: &[u16] = if args.callgrind { &[] } else { &[8, 16] };
        for &n in ceilings {
            // Each shard a core of its own, its orders' CPU divided by n
            // (the moves scale with the shards too: their share measured
            // above is kept).
            let worst = runs
                .iter()
                .filter(|r| r.shards > 1)
                .map(|r| r.spent_by_master.iter().sum::<f64>() / r.accepted.max(1) as f64 / base)
                .fold(1.0, f64::max);
            println!(
                "  projected ceiling of one sale with {n} shards on {n} masters: {:.0} accepted orders/s at {:.0}% busy (one shard: {:.0})",
                f64::from(n) * args.busy * 1e6 / (base * worst),
                args.busy * 100.0,
                args.busy * 1e6 / base,
            );
        }
    }
    time_moves(&sales, args.moves).await?;
    Ok(())
}

async fn sell_out(
    (sales, redis): (&Sales, &Redis),
    masters: &[String],
    shards: u16,
    args: &BenchHotArgs,
) -> anyhow::Result<Run> {
    let product = super::bench_product("hot");
    let mut spec = super::bench_spec(args.orders);
    spec.shards = shards;
    sales.lifecycle().open(&product, &spec).await?;
    let before = spent(masters, args.callgrind).await?;
    let counts = sales.counts();
    let calls = counts.get(flashsale::sale::Counter::OrderCalls);
    let sent = counts.get(flashsale::sale::Counter::OrdersSent);
    let next = Arc::new(AtomicU64::new(1));
    let accepted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    if args.full_calls {
        full_calls((sales, redis), &product, &spec, &accepted, args).await?;
    }
    let in_flight = match (args.full_calls, args.per_shard) {
        (true, _) => 0,
        (false, true) => args.concurrency * u64::from(shards),
        (false, false) => args.concurrency,
    };
    for _ in 0..in_flight {
        let (sales, product, next, accepted) = (
            sales.clone(),
            product.clone(),
            next.clone(),
            accepted.clone(),
        );
        let orders = args.orders;
        tasks.spawn(async move {
            loop {
                let user = next.fetch_add(1, Ordering::Relaxed);
                if user > orders {
                    return Ok::<_, anyhow::Error>(());
                }
                let decision = sales
                    .orders()
                    .place(NewOrder {
                        product: &product,
                        user_id: UserId::new(user)?,
                        quantity: Quantity::new(1)?,
                        idempotency_key: None,
                        vouched: Vouched::No,
                    })
                    .await;
                if let Ok(Decision::Placed(_)) = decision {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let elapsed = started.elapsed();
    let after = spent(masters, args.callgrind).await?;
    let per_call = match args.full_calls {
        true => FULL_CALL as f64,
        false => {
            (counts.get(flashsale::sale::Counter::OrdersSent) - sent) as f64
                / (counts.get(flashsale::sale::Counter::OrderCalls) - calls).max(1) as f64
        }
    };
    let looks = sales.shards().look(&product).await?;
    let moves = looks.iter().map(|l| l.moves_out).sum();
    sales.lifecycle().remove(&product).await?;
    Ok(Run {
        shards,
        accepted: accepted.load(Ordering::Relaxed),
        elapsed,
        spent_by_master: before.iter().zip(&after).map(|(b, a)| a - b).collect(),
        moves,
        per_call,
    })
}

/// `--full-calls`: each shard's share sold in calls of 64 orders of its own
/// buyers (`user_id mod N` = the shard), straight to `place_order.lua`.
async fn full_calls(
    (sales, redis): (&Sales, &Redis),
    product: &ProductId,
    spec: &flashsale::sale::SaleSpec,
    accepted: &Arc<AtomicU64>,
    args: &BenchHotArgs,
) -> anyhow::Result<()> {
    let n = spec.shards.max(1);
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..n {
        let share = spec.share(spec.stock, k);
        let calls = Arc::new(AtomicU64::new(0));
        let target = product.shard(k, n);
        for _ in 0..args.concurrency.max(1) {
            let (redis, target, calls, accepted) = (
                redis.clone(),
                target.clone(),
                calls.clone(),
                accepted.clone(),
            );
            let prefix = sales.prefix().to_owned();
            tasks.spawn(async move {
                loop {
                    let call = calls.fetch_add(1, Ordering::Relaxed);
                    let first = call * FULL_CALL;
                    if first >= share {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let orders: Vec<flashsale::bench_support::OrderCall> = (first
                        ..(first + FULL_CALL).min(share))
                        .map(|i| {
                            Ok(flashsale::bench_support::OrderCall {
                                order_id: flashsale::domain::OrderId::generate(&target),
                                user_id: UserId::new(
                                    i * u64::from(n) + u64::from(k) + u64::from(n),
                                )?,
                                quantity: Quantity::new(1)?,
                                idempotency_key: None,
                                vouched: Vouched::No,
                                shards: n,
                            })
                        })
                        .collect::<anyhow::Result<_>>()?;
                    let mut conn = redis.shared().await?;
                    let replies = redis
                        .bounded(flashsale::bench_support::place_orders_on(
                            &mut conn, &prefix, &target, &orders,
                        ))
                        .await?;
                    let placed = replies
                        .iter()
                        .filter(|r| {
                            matches!(r, flashsale::bench_support::PlaceReply::Accepted { .. })
                        })
                        .count();
                    accepted.fetch_add(placed as u64, Ordering::Relaxed);
                }
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// How long a move takes: `n` moves of one unit between two shards of a
/// sale of their own (the take, the apply, the record dropped: three calls).
async fn time_moves(sales: &Sales, n: u64) -> anyhow::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let product: ProductId = super::bench_product("moves");
    let mut spec = super::bench_spec(2 * n);
    spec.shards = 2;
    sales.lifecycle().open(&product, &spec).await?;
    let mut took = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
        let t = Instant::now();
        let moved = sales
            .shards()
            .move_units(&product, Route { from, to }, 1)
            .await?;
        took.push(t.elapsed());
        anyhow::ensure!(moved == 1, "a move found no unit");
    }
    sales.lifecycle().remove(&product).await?;
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    println!(
        "  a move of units between two shards (take, apply, record dropped): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms over {n}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    Ok(())
}
