//! `flashsale-bench redis` drives `place_order.lua` straight against Redis (no
//! HTTP) with C concurrent callers, once per connection strategy, side by side
//! in one run:
//! - `multiplexed`: all callers share one multiplexed connection (what the API does);
//! - `pool`: each call checks a dedicated connection out of a bb8 pool;
//! - `blocked`: the shared connection also carries an `XREAD ... BLOCK` loop, as
//!   a stream worker would if it used it: the orders wait behind every block.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use redis::AsyncCommands;

use flashsale::config::RedisArgs;
use flashsale::domain::{OrderId, ProductId};
use flashsale::sale::{Redis, SaleError, Sales};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConnMode {
    Multiplexed,
    Pool,
    Blocked,
}

#[derive(Debug, Clone, Args)]
pub struct BenchRedisArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Orders per mode (all accepted: the sale has that much stock).
    #[arg(long, default_value_t = 50_000)]
    pub requests: u64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u64,
    /// Modes to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "multiplexed,pool,blocked"
    )]
    pub modes: Vec<ConnMode>,
    /// Block time of the `blocked` mode's XREAD, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub block_ms: u64,
}

/// One mode's figures.
#[derive(Debug, Clone)]
pub struct ModeReport {
    pub mode: ConnMode,
    pub requests: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl ModeReport {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

pub async fn run_redis_bench(args: BenchRedisArgs) -> anyhow::Result<()> {
    let redis = Redis::new(
        &args.redis.target(),
        Duration::from_millis(args.redis.redis_timeout_ms.max(5_000)),
        args.concurrency.min(512) as u32,
    )?;
    let sales = Sales::new(
        redis.clone(),
        super::bench_prefix(&args.redis.key_prefix),
        flashsale::config::MemorySettings::default(),
        None,
    );
    println!(
        "place_order.lua straight against {}: {} orders per mode (blocked: 10 per caller), concurrency {}",
        args.redis.redis_url, args.requests, args.concurrency
    );
    println!(
        "{:<12} {:>12} {:>10} {:>10}",
        "mode", "orders/s", "p50 ms", "p99 ms"
    );
    let mut reports = Vec::new();
    for &mode in &args.modes {
        let r = run_mode(&sales, &redis, mode, &args).await?;
        println!(
            "{:<12} {:>12.0} {:>10.3} {:>10.3}",
            format!("{:?}", r.mode).to_lowercase(),
            r.per_second(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        );
        reports.push(r);
    }
    if let Some(base) = reports.iter().find(|r| r.mode == ConnMode::Multiplexed) {
        for r in reports.iter().filter(|r| r.mode != ConnMode::Multiplexed) {
            println!(
                "{:?} / multiplexed throughput: {:.2}",
                r.mode,
                r.per_second() / base.per_second()
            );
        }
    }
    Ok(())
}

/// Opens a fresh sale with enough stock, runs the orders, removes the sale's keys.
pub async fn run_mode(
    sales: &Sales,
    redis: &Redis,
    mode: ConnMode,
    args: &BenchRedisArgs,
) -> anyhow::Result<ModeReport> {
    // Blocked orders crawl (a block per round of callers): ten rounds show it.
    let requests = match mode {
        ConnMode::Blocked => args.requests.min(args.concurrency * 10),
        _ => args.requests,
    };
    let product = super::open_bench_sale(sales, requests).await?;
    let keys = sales.keys(&product);
    let stop = Arc::new(tokio::sync::Notify::new());
    let shared = redis.shared().await?;
    let blocker = (mode == ConnMode::Blocked).then(|| {
        let mut conn = shared;
        let stop = stop.clone();
        let streams = [format!("{}:idle", keys.orders)];
        let block_ms = args.block_ms as usize;
        tokio::spawn(async move {
            let opts = redis::streams::StreamReadOptions::default().block(block_ms);
            loop {
                let read = conn.xread_options::<_, _, redis::Value>(&streams, &["$"], &opts);
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = read => {}
                }
            }
        })
    });

    let next_user = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (sales, redis, product) = (sales.clone(), redis.clone(), product.clone());
        let next_user = next_user.clone();
        let total = requests;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let user = next_user.fetch_add(1, Ordering::Relaxed);
                if user > total {
                    return Ok::<_, SaleError>(latencies);
                }
                let t = Instant::now();
                match mode {
                    ConnMode::Pool => pooled_order(&sales, &redis, &product, user).await?,
                    _ => {
                        super::place(&sales, &product, user, None).await?;
                    }
                }
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::with_capacity(requests as usize);
    for t in tasks {
        let part = t.await??;
        latencies.extend(part);
    }
    let elapsed = started.elapsed();
    stop.notify_waiters();
    if let Some(b) = blocker {
        b.abort();
    }
    super::remove_sale_keys(sales, &product).await?;

    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(ModeReport {
        mode,
        requests: latencies.len() as u64,
        elapsed,
        p50: at(0.50),
        p99: at(0.99),
    })
}

/// One order on a connection checked out of the bb8 pool for this call only.
async fn pooled_order(
    sales: &Sales,
    redis: &Redis,
    product: &ProductId,
    user: u64,
) -> Result<(), SaleError> {
    let mut conn = flashsale::bench_support::blocking_pool(redis).get().await?;
    let order_id = OrderId::generate(product);
    redis
        .bounded(flashsale::bench_support::place_orders_on(
            &mut *conn,
            sales.prefix(),
            product,
            &[flashsale::bench_support::OrderCall {
                order_id,
                user_id: super::user_id(user)?,
                quantity: super::ONE,
                idempotency_key: None,
                vouched: flashsale::sale::Vouched::No,
                shards: 1,
            }],
        ))
        .await?;
    Ok(())
}
