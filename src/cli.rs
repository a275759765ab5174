//! The operator commands that are not servers: `audit` and `recover`. They
//! print for people (or JSON for scripts) and turn a failed check into a
//! non-zero exit.

use std::time::Duration;

use anyhow::Context;

use crate::books::{audit, recover};
use crate::config::{AuditArgs, DbArgs, RecoverArgs, RedisArgs};
use crate::domain::ProductId;
use crate::sale::{Redis, Sales};
use crate::store::Db;

async fn connect(redis: &RedisArgs, db: &DbArgs) -> anyhow::Result<(Sales, Db)> {
    let timeout = Duration::from_millis(redis.redis_timeout_ms.max(5000));
    let sales = Sales::new(
        Redis::new(&redis.target(), timeout, 2)?,
        redis.key_prefix.clone(),
    );
    let db_timeout = Duration::from_millis(db.db_timeout_ms.max(10_000));
    let store = Db::connect_lazy(&db.database_url, db_timeout, 2)?;
    store.create_and_migrate(&db.database_url).await?;
    Ok((sales, store))
}

/// `flashsale audit`
pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let only = args
        .product
        .as_deref()
        .map(ProductId::parse)
        .transpose()
        .context("--product")?;
    let audits = audit::audit(&sales, &db, only.as_ref()).await?;
    let ok = audits.iter().all(|a| a.ok());
    if args.json {
        println!("{}", serde_json::json!({"ok": ok, "sales": audits}));
    } else {
        print!("{}", audit::render(&audits));
    }
    anyhow::ensure!(ok, "the books do not balance");
    Ok(())
}

/// `flashsale recover`
pub async fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let product = ProductId::parse(&args.product).context("--product")?;
    let done = recover::recover(&sales, &db, &product, args.force).await?;
    println!(
        "recovered {}: stock {}, {} buyers' counts, {} cancelled orders marked released",
        done.product_id, done.stock, done.buyers, done.released
    );
    Ok(())
}
