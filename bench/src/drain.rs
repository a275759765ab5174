//! `flashsale-bench drain`: fills a sale's stream with N orders, then moves
//! them into MySQL twice, side by side: once as a raw multi-row INSERT (one
//! statement per batch, autocommit, the floor of what MySQL can take), once
//! through the stream worker's step (XREADGROUP, one transaction with the
//! duplicate check and the stock update, XACK). Same rows, same pool.

use std::time::{Duration, Instant};

use clap::Args;

use super::{bench_product, fill, remove_sale_keys};
use flashsale::config::WorkerConfig;
use flashsale::config::{DbArgs, RedisArgs};
use flashsale::domain::PendingOrder;
use flashsale::sale::{Redis, Sales};
use flashsale::store::{Db, NewProduct};
use flashsale::worker::Workers;

#[derive(Debug, Clone, Args)]
pub struct BenchDrainArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Orders in the stream, per batch size.
    #[arg(long, default_value_t = 50_000)]
    pub orders: u64,
    /// Batch sizes to compare (entries per read = rows per transaction).
    #[arg(long, value_delimiter = ',', default_value = "100,500,2000")]
    pub batch_sizes: Vec<usize>,
    /// MySQL's CPU as the sum of these server processes (comma-separated
    /// pids: a primary and its replica, a cluster's nodes); by default the
    /// local server on DATABASE_URL's port.
    #[arg(long)]
    pub mysql_pids: Option<String>,
}

pub async fn run_drain_bench(args: BenchDrainArgs) -> anyhow::Result<()> {
    let redis = Redis::new(&args.redis.target(), Duration::from_secs(10), 8)?;
    let sales = Sales::new(
        redis,
        super::bench_prefix(&args.redis.key_prefix),
        flashsale::config::MemorySettings::default(),
        None,
    );
    let url = &args.db.database_url;
    let db = Db::connect_lazy(url, Duration::from_secs(30), args.db.db_max_connections)?;
    db.create_and_migrate().await?;
    let mysql = args
        .mysql_pids
        .clone()
        .or_else(|| super::cost::local_mysql_pid(url));
    println!("{} orders per batch size, MySQL at {url}", args.orders);
    println!(
        "{:>6} {:>14} {:>14} {:>7}   CPU µs per row: {:>9} {:>9} {:>11} {:>11}",
        "batch",
        "raw rows/s",
        "drain rows/s",
        "ratio",
        "raw:mysql",
        "raw:bench",
        "drain:mysql",
        "drain:worker"
    );
    for &batch in &args.batch_sizes {
        let (raw, drain) =
            one_size(&sales, &db, mysql.as_deref(), args.orders, batch.max(1)).await?;
        let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "{batch:>6} {:>14.0} {:>14.0} {:>7.2}   {:>25} {:>9} {:>11} {:>11}",
            raw.rate,
            drain.rate,
            drain.rate / raw.rate,
            us(raw.mysql_us),
            us(raw.process_us),
            us(drain.mysql_us),
            us(drain.process_us)
        );
    }
    Ok(())
}

/// One way of moving the rows: its rate, and the CPU it cost per row.
struct Moved {
    rate: f64,
    /// The local MySQL's CPU per row (`None`: not on this machine).
    mysql_us: Option<f64>,
    /// This process's CPU per row: the worker's step, or the raw insert's client.
    process_us: Option<f64>,
}

/// CPU clocks of this process and of MySQL (seconds).
fn clocks(mysql: Option<&str>) -> (Option<f64>, Option<f64>) {
    let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
    (
        secs(super::cpu::process()),
        // Summed over every pid given (one, or a replica set's).
        mysql.and_then(|pids| {
            pids.split(',')
                .map(|pid| super::cpu::of(pid.trim()).map(|d| d.as_secs_f64()))
                .sum::<Option<f64>>()
        }),
    )
}

/// `Moved` from the clocks before and after `rows` rows in `secs` seconds.
fn moved(
    rows: usize,
    secs: f64,
    before: (Option<f64>, Option<f64>),
    after: (Option<f64>, Option<f64>),
) -> Moved {
    let per_row = |a: Option<f64>, b: Option<f64>| Some((b? - a?) * 1e6 / rows.max(1) as f64);
    Moved {
        rate: rows as f64 / secs,
        process_us: per_row(before.0, after.0),
        mysql_us: per_row(before.1, after.1),
    }
}

/// Returns (raw, drain) for one batch size.
async fn one_size(
    sales: &Sales,
    db: &Db,
    mysql: Option<&str>,
    n: u64,
    batch: usize,
) -> anyhow::Result<(Moved, Moved)> {
    let product = bench_product("drain");
    let spec = super::bench_spec(n);
    db.products()
        .create(&NewProduct {
            product_id: product.clone(),
            title: "drain benchmark".into(),
            price: spec.price,
            available_qty: n,
            start_time: spec.start_ms,
            end_time: spec.end_ms,
            limit_per_user: 1,
            waiting_room: None,
            stock_shards: 1,
        })
        .await?;
    sales.lifecycle().open(&product, &spec).await?;
    fill(sales, &product, n, 64).await?;
    let orders = stream_orders(sales, &product).await?;

    // Raw: the same rows, one multi-row INSERT per batch, into a twin of
    // tb_order (so neither run pays for the other's rows), before and after
    // the drain; the mean is reported, to even out drift on a shared machine.
    let raw_before = raw_insert(db, mysql, &orders, batch).await?;
    // Drain: the worker's own step, until every entry is acked.
    let cfg = WorkerConfig {
        consumer: "bench".into(),
        batch_size: batch,
        block: Duration::from_millis(10),
        ..WorkerConfig::default()
    };
    let mut worker = Workers::new(sales, db, cfg).sale_worker(product.clone());
    let (started, before) = (Instant::now(), clocks(mysql));
    let mut acked = 0;
    while acked < orders.len() {
        acked += worker.step().await?.acked;
    }
    let drain = moved(
        orders.len(),
        started.elapsed().as_secs_f64(),
        before,
        clocks(mysql),
    );
    let raw_after = raw_insert(db, mysql, &orders, batch).await?;
    let mean = |a: Option<f64>, b: Option<f64>| Some((a? + b?) / 2.0);
    let raw = Moved {
        rate: (raw_before.rate + raw_after.rate) / 2.0,
        mysql_us: mean(raw_before.mysql_us, raw_after.mysql_us),
        process_us: mean(raw_before.process_us, raw_after.process_us),
    };

    let left: i64 = sqlx::query_scalar("SELECT available_qty FROM tb_product WHERE product_id = ?")
        .bind(product.as_str())
        .fetch_one(flashsale::bench_support::pool(db))
        .await?;
    anyhow::ensure!(left == 0, "drain left available_qty at {left}, expected 0");
    delete_rows(db, &product).await?;
    sqlx::query("DELETE FROM tb_product WHERE product_id = ?")
        .bind(product.as_str())
        .execute(flashsale::bench_support::pool(db))
        .await?;
    remove_sale_keys(sales, &product).await?;
    Ok((raw, drain))
}

/// Every order in the sale's stream, parsed as the worker parses it.
async fn stream_orders(
    sales: &Sales,
    product: &flashsale::domain::ProductId,
) -> anyhow::Result<Vec<PendingOrder>> {
    sales
        .ledger()
        .stream_entries(product)
        .await?
        .into_iter()
        .map(|e| e.order(product).map_err(anyhow::Error::msg))
        .collect()
}

/// Inserts `orders` into a fresh twin of tb_order, `batch` rows per statement.
async fn raw_insert(
    db: &Db,
    mysql: Option<&str>,
    orders: &[PendingOrder],
    batch: usize,
) -> anyhow::Result<Moved> {
    sqlx::query("DROP TABLE IF EXISTS bench_raw_order")
        .execute(flashsale::bench_support::pool(db))
        .await?;
    sqlx::query("CREATE TABLE bench_raw_order LIKE tb_order")
        .execute(flashsale::bench_support::pool(db))
        .await?;
    let (started, before) = (Instant::now(), clocks(mysql));
    for chunk in orders.chunks(batch) {
        flashsale::bench_support::insert_orders_raw(db, "bench_raw_order", chunk).await?;
    }
    let raw = moved(
        orders.len(),
        started.elapsed().as_secs_f64(),
        before,
        clocks(mysql),
    );
    sqlx::query("DROP TABLE bench_raw_order")
        .execute(flashsale::bench_support::pool(db))
        .await?;
    Ok(raw)
}

async fn delete_rows(db: &Db, product: &flashsale::domain::ProductId) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM tb_order WHERE product_id = ?")
        .bind(product.as_str())
        .execute(flashsale::bench_support::pool(db))
        .await?;
    Ok(())
}
