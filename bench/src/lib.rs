//! Load generators behind the figures in BENCHMARKS.md. Each runs the
//! compared variants side by side in one run, since the machine is shared.
//!
//! - [`rehearsal`]: `flashsale-bench rehearse`, a whole sale over HTTP with the books
//!   checked afterwards ([`plan`] decides the request mix, [`load`] sends it,
//!   [`crowd`] adds the storm before the start and counts Redis calls).
//! - [`redis`]: `flashsale-bench redis`, the order script straight against
//!   Redis, per connection strategy.
//! - [`guards`]: `flashsale-bench guards`, the order path with its limits
//!   off and on, a concurrency sweep, and an overload.
//! - [`drain`]: `flashsale-bench drain`, the stream workers' drain rate next
//!   to a raw multi-row INSERT of the same rows.
//! - [`cost`] measures what each part of the system spent in CPU per request,
//!   and [`capacity`] turns it into the sizing of a sale.
//! - [`room`]: `flashsale-bench room`, a sale with its waiting room on:
//!   fairness, pace, admissions, and a poll's cost against the sold-out path.
//! - [`auth`]: `flashsale-bench auth`, what verifying buyers' tokens costs
//!   (none, HMAC, ES256, RS256; the token cache on and off).
//! - [`slow`]: `flashsale-bench slow-clients`, well-behaved buyers beside a
//!   crowd of slow connections, and what polls for made-up sales cost Redis.

pub mod auth;
pub mod capacity;
pub mod cost;
pub mod cpu;
pub mod crowd;
pub mod deliver;
pub mod direct;
pub mod drain;
pub mod floor;
pub mod guards;
pub mod hot;
pub mod load;
pub mod plan;
pub mod rehearsal;
pub mod room;
pub mod slow;
pub mod tokens;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use self::auth::{BenchAuthArgs, run_auth_bench};
pub use self::direct::{BenchRedisArgs, run_redis_bench};
pub use self::drain::{BenchDrainArgs, run_drain_bench};
pub use self::guards::{BenchGuardsArgs, run_guards_bench};
pub use self::rehearsal::BenchArgs;
use flashsale::domain::{MAX_TIME_MS, ProductId};
use flashsale::sale::{SaleError, SaleSpec, Sales};

/// One unit.
pub const ONE: flashsale::domain::Quantity = flashsale::domain::Quantity::ONE;

/// A bench's buyer number as a user id (numbers start at 1).
pub fn user_id(n: u64) -> Result<flashsale::domain::UserId, SaleError> {
    flashsale::domain::UserId::new(n).map_err(|e| SaleError::Corrupt(e.0))
}

/// One unit for `user` through the order path (memory, then the script),
/// with no admission.
pub async fn place(
    sales: &Sales,
    product: &ProductId,
    user: u64,
    idempotency_key: Option<&str>,
) -> Result<flashsale::sale::Decision, SaleError> {
    sales
        .orders()
        .place(flashsale::sale::NewOrder {
            product,
            user_id: user_id(user)?,
            quantity: ONE,
            idempotency_key,
            vouched: flashsale::sale::Vouched::No,
        })
        .await
}

/// The key prefix of benchmark sales: beside, never inside, the deployment's
/// own (so a running `serve`'s workers never see them).
pub fn bench_prefix(prefix: &str) -> String {
    format!("{prefix}-bench")
}

/// A fresh product id for a benchmark sale.
pub fn bench_product(tag: &str) -> ProductId {
    let id = format!("bench-{tag}-{}", uuid::Uuid::now_v7().simple());
    ProductId::parse(&id).unwrap_or_else(|_| unreachable!("generated ids are valid"))
}

/// Opens a sale in Redis only, always in its window, one unit per user.
pub async fn open_bench_sale(sales: &Sales, stock: u64) -> Result<ProductId, SaleError> {
    let product = bench_product("redis");
    sales.lifecycle().open(&product, &bench_spec(stock)).await?;
    Ok(product)
}

pub fn bench_spec(stock: u64) -> SaleSpec {
    SaleSpec {
        stock,
        start_ms: 0,
        end_ms: MAX_TIME_MS,
        limit_per_user: 1,
        price: rust_decimal::Decimal::ONE,
        waiting_room: None,
        paused_ms: None,
        shards: 1,
    }
}

/// Places `n` one-unit orders from users 1..=n with `concurrency` callers.
pub async fn fill(
    sales: &Sales,
    product: &ProductId,
    n: u64,
    concurrency: u64,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(1));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (sales, product, next) = (sales.clone(), product.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let user = next.fetch_add(1, Ordering::Relaxed);
                if user > n {
                    return Ok::<_, SaleError>(());
                }
                place(&sales, &product, user, None).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Shows a benchmark's report: one JSON object with `--json`, else `table`.
pub fn show<R: serde::Serialize>(json: bool, report: &R, table: fn(&R)) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        table(report);
    }
    Ok(())
}

/// Deletes every key of a benchmark sale and its registry entry.
pub async fn remove_sale_keys(sales: &Sales, product: &ProductId) -> Result<(), SaleError> {
    sales.lifecycle().remove(product).await
}
