//! `flashsale-bench drain`: fills a sale's stream with N orders, then moves
//! them into MySQL twice, side by side: once as a raw multi-row INSERT (one
//! statement per batch, autocommit, the floor of what MySQL can take), once
//! through the stream worker's step (XREADGROUP, one transaction with the
//! duplicate check and the stock update, XACK). Same rows, same pool.

use std::time::{Duration, Instant};

use clap::Args;

use super::{bench_product, fill, remove_sale_keys};
use flashsale::config::{DbArgs, RedisArgs};
use flashsale::domain::PendingOrder;
use flashsale::sale::{Redis, Sales};
use flashsale::store::{Db, NewProduct};
use flashsale::worker::{WorkerConfig, Workers};

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
}

pub async fn run_drain_bench(args: BenchDrainArgs) -> anyhow::Result<()> {
    let redis = Redis::new(&args.redis.target(), Duration::from_secs(10), 8)?;
    let sales = Sales::new(redis, super::bench_prefix(&args.redis.key_prefix));
    let url = &args.db.database_url;
    let db = Db::connect_lazy(url, Duration::from_secs(30), args.db.db_max_connections)?;
    db.create_and_migrate().await?;
    println!("{} orders per batch size, MySQL at {url}", args.orders);
    println!(
        "{:>6} {:>14} {:>14} {:>7}",
        "batch", "raw rows/s", "drain rows/s", "ratio"
    );
    for &batch in &args.batch_sizes {
        let (raw, drain) = one_size(&sales, &db, args.orders, batch.max(1)).await?;
        println!("{batch:>6} {raw:>14.0} {drain:>14.0} {:>7.2}", drain / raw);
    }
    Ok(())
}

/// Returns (raw rows/s, drain rows/s) for one batch size.
async fn one_size(sales: &Sales, db: &Db, n: u64, batch: usize) -> anyhow::Result<(f64, f64)> {
    let product = bench_product("drain");
    let spec = super::bench_spec(n);
    db.create_product(&NewProduct {
        product_id: product.clone(),
        title: "drain benchmark".into(),
        price: spec.price,
        available_qty: n,
        start_time: spec.start_ms,
        end_time: spec.end_ms,
        limit_per_user: 1,
    })
    .await?;
    sales.open(&product, &spec).await?;
    fill(sales, &product, n, 64).await?;
    let orders = stream_orders(sales, &product).await?;

    // Raw: the same rows, one multi-row INSERT per batch, into a twin of
    // tb_order (so neither run pays for the other's rows), before and after
    // the drain; the mean is reported, to even out drift on a shared machine.
    let raw_before = raw_insert(db, &orders, batch).await?;
    // Drain: the worker's own step, until every entry is acked.
    let cfg = WorkerConfig {
        consumer: "bench".into(),
        batch_size: batch,
        block: Duration::from_millis(10),
        ..WorkerConfig::default()
    };
    let mut worker = Workers::new(sales.clone(), db.clone(), cfg).sale_worker(product.clone());
    let started = Instant::now();
    let mut acked = 0;
    while acked < orders.len() {
        acked += worker.step().await?.acked;
    }
    let drain = n as f64 / started.elapsed().as_secs_f64();
    let raw = (raw_before + raw_insert(db, &orders, batch).await?) / 2.0;

    let left: i64 = sqlx::query_scalar("SELECT available_qty FROM tb_product WHERE product_id = ?")
        .bind(product.as_str())
        .fetch_one(db.pool())
        .await?;
    anyhow::ensure!(left == 0, "drain left available_qty at {left}, expected 0");
    delete_rows(db, &product).await?;
    sqlx::query("DELETE FROM tb_product WHERE product_id = ?")
        .bind(product.as_str())
        .execute(db.pool())
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
        .stream_entries(product)
        .await?
        .into_iter()
        .map(|e| e.order(product).map_err(anyhow::Error::msg))
        .collect()
}

/// Inserts `orders` into a fresh twin of tb_order, `batch` rows per statement; rows/s.
async fn raw_insert(db: &Db, orders: &[PendingOrder], batch: usize) -> anyhow::Result<f64> {
    sqlx::query("DROP TABLE IF EXISTS bench_raw_order")
        .execute(db.pool())
        .await?;
    sqlx::query("CREATE TABLE bench_raw_order LIKE tb_order")
        .execute(db.pool())
        .await?;
    let started = Instant::now();
    for chunk in orders.chunks(batch) {
        db.insert_orders_raw("bench_raw_order", chunk).await?;
    }
    let rate = orders.len() as f64 / started.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE bench_raw_order")
        .execute(db.pool())
        .await?;
    Ok(rate)
}

async fn delete_rows(db: &Db, product: &flashsale::domain::ProductId) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM tb_order WHERE product_id = ?")
        .bind(product.as_str())
        .execute(db.pool())
        .await?;
    Ok(())
}
